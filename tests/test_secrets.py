"""API keys live in the environment only: nothing a run writes contains one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = {
    "OPENAI_API_KEY": "sk-fake-openai-0123456789abcdef",
    "WANDB_API_KEY": "fake-wandb-key-0123456789abcdef0123456789ab",
    "TINKER_API_KEY": "tml-fake-tinker-0123456789abcdef",
    "HF_TOKEN": "hf_fakefakefakefakefakefakefake",
}


def test_no_key_reaches_the_run_folder(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    env = {**os.environ, **FAKE, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "train.py", "trainer.max_steps=2", "trainer.warmup.steps=0", "data.eval_size=16",
         "threads=1", "logger=wandb", "logger.mode=offline", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in files) and any("wandb" in p.parts for p in files)
    for path in files:
        data = path.read_bytes()
        for name, key in FAKE.items():
            assert key.encode() not in data, f"{name} leaked into {path.relative_to(run_dir)}"
    for name, key in FAKE.items():
        assert key not in proc.stdout + proc.stderr, f"{name} leaked into the console output"
