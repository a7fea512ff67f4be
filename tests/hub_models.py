"""Real tiny models on disk for the tests of a pretrained model's files: a folder written by `save_pretrained`, and
the same files as an entry of huggingface_hub's cache (`models--org--name/refs/main`, `blobs/<sha256>`,
`snapshots/<commit>/<file>` → the blob), which from_pretrained reads offline as if downloaded."""

import hashlib
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ALPHABET = "0123456789+="


def saved_model(folder: Path) -> Path:
    """A 1-layer Llama with the tiny preset's character tokenizer, saved with save_pretrained (weights, config,
    generation config, tokenizer)."""
    from rlvr.model.tiny import TinyLlama

    model, tokenizer = TinyLlama(ALPHABET, 32, 64, 1, 2, 64, "float32", None).load(0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def cached_model(cache: Path, repo: str, commit: str = COMMIT, branch: str = "main") -> Path:
    """`repo` at `commit` (named by refs/`branch`) in the hub cache folder `cache`; returns the snapshot folder."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    staged = saved_model(cache / f".staging-{commit}")
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (entry / "blobs").mkdir(exist_ok=True)
    for file in sorted(staged.iterdir()):
        blob = entry / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        file.replace(blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    shutil.rmtree(staged)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / branch).write_text(commit)
    return snapshot


def unused_port() -> int:
    """A loopback port nothing listens on (a connection to it is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _HubHandler(BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802 - the http.server API
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def answering_hub() -> Iterator[str]:
    """A loopback server that answers HEAD requests: a hub that is up (its URL, for HF_ENDPOINT)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
