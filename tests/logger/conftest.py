"""A W&B server that cannot be reached as on a cluster's compute node: a loopback socket that accepts connections
and never answers, counting them (zero: nothing tried the network)."""

import socket
import threading

import pytest


class SilentServer:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)  # held open, never read or answered

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent_server(monkeypatch):
    """$WANDB_BASE_URL names a server that never answers; no W&B key anywhere (an empty netrc)."""
    server = SilentServer()
    monkeypatch.setenv("WANDB_BASE_URL", server.url)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.setenv("NETRC", "/dev/null")
    yield server
    server.close()
