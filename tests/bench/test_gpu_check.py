"""bench.gpu_check, the check to run first on a GPU machine: without CUDA it prints the command it would run and exits
0; `--device cpu` runs that same path here (a shrunken Qwen3-architecture model written offline with its 151,936-entry
tokenizer, `python train.py` with trainer=gpu, engine=vllm, packing and a mismatch correction) and prints its table.
The CUDA run itself was not run on this machine (no GPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def gpu_check(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})


def test_without_cuda_it_says_what_it_would_run_and_exits_0():
    proc = gpu_check(timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no CUDA device here" in proc.stdout
    for override in ("trainer=gpu", "engine=vllm", "backend.packing=true", "model.dtype=bfloat16", "model.lora=null"):
        assert override in proc.stdout


@pytest.mark.vllm
def test_the_same_path_runs_on_a_cpu_and_prints_its_table(tmp_path):
    proc = gpu_check("--device", "cpu", "--layers", "2", "--hidden", "128", "--steps", "2", "--batch", "2", "--group",
                     "4", "--max-tokens", "8", "--packed-tokens", "256", "--out", str(tmp_path / "run"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = dict(line.rsplit(maxsplit=1) for line in proc.stdout.splitlines()[-7:])
    table = {name.strip(): value for name, value in table.items()}
    assert float(table["sampling tokens/s"]) > 0 and float(table["training tokens/s"]) > 0
    assert float(table["sync bytes written"]) == 0  # full fine-tuning weights reach vLLM in memory
    assert float(table["mismatch/kl"]) < 1e-4  # float32 engine and trainer on a CPU
    assert table["MFU"] == "—" and table["GPU peak MB"] == "—"  # no GPU, no peak to read
