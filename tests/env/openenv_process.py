"""`served(folder)`: tests/env/openenv_server.py started on a free 127.0.0.1 port, its `ws://` URL once it answers
(GET /health), killed on exit; its log in `folder`. Shared by the tests that play a served OpenEnv game."""

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlvr.env.openenv import ServerAnswers

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(folder: Path) -> Iterator[str]:
    port, log = free_port(), folder / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.env.openenv_server", str(port)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"ws://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # importing openenv-core (gradio) takes ~20 s on a busy 2-core machine
        while ServerAnswers(url).check().status != "ok":
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no answer from {url}: {log.read_text()[-3000:]}"
            time.sleep(0.25)
        yield url
    finally:
        proc.kill()
        proc.wait(30)
