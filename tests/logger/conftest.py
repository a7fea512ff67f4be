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


TRACKERS = "logger=[wandb,mlflow,trackio,tensorboard]"


@pytest.fixture(scope="session")
def tracked_grid(tmp_path_factory):
    """One real packed grid (two runs alive at once in one process, seeds 0 and 1) logging to all four trackers
    offline, run to step 2 and then resumed in place to step 3: (sweep folder, Trackio's folder). The trackers'
    tests read it back with each library's own reader."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from composing import FAST

    root, top = Path(__file__).resolve().parents[2], tmp_path_factory.mktemp("tracked")
    env = {**os.environ, "TRACKIO_DIR": str(top / "trackio"), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "HF_HUB_OFFLINE": "1"}
    for var in ("WANDB_SERVICE", "MLFLOW_TRACKING_URI", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        env.pop(var, None)
    for steps in (2, 3):
        proc = subprocess.run([sys.executable, "train.py", "--multirun", "seed=0,1", *FAST,
                               f"trainer.max_steps={steps}", TRACKERS, "hydra/launcher=packed",
                               f"hydra.sweep.dir={top / 'sweep'}"], cwd=root, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        warned = [line for line in (proc.stdout + proc.stderr).splitlines()
                  if "WARNING" in line and "trains on the CPU" not in line]
        assert not warned, warned
    return top / "sweep", top / "trackio"
