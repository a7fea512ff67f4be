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
    "MLFLOW_TRACKING_TOKEN": "fake-mlflow-token-0123456789abcdef",
    "MLFLOW_TRACKING_PASSWORD": "fake-mlflow-password-0123456789",
    "TRACKIO_WRITE_TOKEN": "fake-trackio-write-token-0123456789",
}
TRACKERS = "logger=[wandb,mlflow,trackio,tensorboard]"
"""Every tracker rlvr logs to, each writing its own files (Trackio's under $TRACKIO_DIR, the others' in the run
folder)."""


def test_no_key_reaches_the_run_folder(tmp_path):
    for tracker in ("wandb", "mlflow", "trackio", "tensorboard"):
        pytest.importorskip(tracker)
    run_dir, trackio_dir = tmp_path / "run", tmp_path / "trackio"
    env = {**os.environ, **FAKE, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
           "TRACKIO_DIR": str(trackio_dir)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "train.py", "trainer.max_steps=2", "trainer.warmup.steps=0", "data.eval_size=16",
         "threads=1", TRACKERS, "logger.mode=offline", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = [p for p in [*run_dir.rglob("*"), *trackio_dir.rglob("*")] if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in files)
    for part in ("wandb", "mlruns", "tensorboard", "trackio"):
        assert any(part in p.relative_to(tmp_path).parts for p in files), f"no {part} files"
    for path in files:
        data = path.read_bytes()
        for name, key in FAKE.items():
            assert key.encode() not in data, f"{name} leaked into {path.relative_to(tmp_path)}"
    for name, key in FAKE.items():
        assert key not in proc.stdout + proc.stderr, f"{name} leaked into the console output"
