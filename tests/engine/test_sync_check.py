"""trainer.sync_check (rlvr/engine/sync_check.py): on every on-policy step the engine's log-probabilities of the
step's own sampled tokens must equal the trainer's to the precisions' noise; an engine whose sync silently does
nothing stops the run (`failed`, exit 1, a message naming the engine and the sync), whatever the engine and under
LoRA or full fine-tuning, while a bfloat16 engine beside a float32 trainer (a real but constant gap) runs on.
The probe helper `check_sync` (engine tests, bench/weight_sync.py): tests/engine/test_vllm_engine.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from composing import compose_config
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.engine.sync_check import StaleEngineError, SyncCheck
from rlvr.errors import RunFailed
from rlvr.run import run

REPO = Path(__file__).resolve().parents[2]
RUN = ["trainer.warmup.steps=0", "trainer.max_steps=6", "trainer.evaluate=false", "threads=1", "trainer.batch_size=4",
       "trainer.group_size=4", "reward=function", "reward.function=tests.backpressure.mixed_rewards.parity"]
STALE = """# train.py with {engine}'s sync a no-op after its first call: the engine stays on the step-0 weights.
import runpy, sys
from {module} import {engine} as E
real, calls = E.sync, []
def first_only(self, policy):
    calls.append(1)
    return real(self, policy) if len(calls) == 1 else 0
E.sync = first_only
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def stale_after_first_sync(monkeypatch) -> None:
    real, calls = PyTorchEngine.sync, []

    def first_only(self, policy):
        calls.append(1)
        return real(self, policy) if len(calls) == 1 else 0

    monkeypatch.setattr(PyTorchEngine, "sync", first_only)


def test_an_engine_left_on_the_step_0_weights_stops_the_run(tmp_path, monkeypatch):
    """The pytorch engine samples a LoRA run from a merged copy that `sync` refreshes: skip every sync after the first
    and the run stops after `trainer.sync_check.steps` (3) on-policy steps of a stale engine, status `failed`. (Its
    full fine-tuning samples the trained module itself: it cannot go stale; engine=vllm's can, below.)"""
    stale_after_first_sync(monkeypatch)
    with pytest.raises(StaleEngineError, match=r"engine <PyTorchEngine> samples from other weights") as err:
        run(compose_config(RUN), tmp_path)
    assert isinstance(err.value, RunFailed)  # train.py: "rlvr: run failed: …", exit 1, no traceback
    assert "Its weight sync (Engine.sync" in str(err.value) and "on 3 consecutive on-policy steps" in str(err.value)
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "failed"
    checked = rows(tmp_path)
    assert [r["step"] for r in checked] == [0, 1, 2]  # step 3 (the third over) raised before its row
    assert checked[0]["engine/sync_delta"] < 1e-5  # synced: float32 on both sides agree to ~2e-7
    assert all(r["engine/sync_delta"] > r["engine/sync_allowed"] == 1e-4 for r in checked[1:])


def test_a_faithful_engine_passes_every_check(tmp_path):
    summary = run(compose_config(RUN), tmp_path)
    assert summary["steps"] == 6
    checked = [r for r in rows(tmp_path) if "engine/sync_delta" in r]
    assert len(checked) >= 4 and all(r["engine/sync_delta"] < 1e-5 for r in checked)


def test_the_check_needs_sane_numbers():
    with pytest.raises(ValueError, match="trainer.sync_check"):
        SyncCheck(steps=-1)
    with pytest.raises(ValueError, match="trainer.sync_check"):
        SyncCheck(tolerance=float("nan"))


def vllm_run(tmp_path: Path, *overrides: str, stale: bool) -> subprocess.CompletedProcess:
    """train.py with engine=vllm in a process of its own (a closed vLLM engine takes vLLM's parallel state with it)."""
    args = ["engine=vllm", *RUN, "trainer.max_steps=8", f"hydra.run.dir={tmp_path}", *overrides]
    code = STALE.format(module="rlvr.engine.vllm", engine="VLLMEngine") if stale else None
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "train.py", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})


@pytest.mark.vllm
def test_a_vllm_engine_left_on_stale_weights_fails_the_run_without_a_traceback(tmp_path):
    """engine=vllm under full fine-tuning (float32; its weights no longer reloaded): exit 1, the reason on one line,
    status `failed`. (Before, only its fixed probe every 10 steps caught this one, inside a traceback.)"""
    proc = vllm_run(tmp_path, "model.lora=null", "trainer.lr=1e-4", stale=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rlvr: run failed: the engine <VLLMEngine> samples from other weights" in proc.stderr
    assert "Traceback" not in proc.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["state"] == "failed" and "StaleEngineError" in status["reason"]


@pytest.mark.vllm
def test_a_bfloat16_vllm_beside_a_float32_trainer_runs_on(tmp_path):
    """Its gap is real (~2e-3 on the tiny model) but constant: above the float32 tolerance, below 4× its first
    step's."""
    proc = vllm_run(tmp_path, "engine.dtype=bfloat16", stale=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checked = [r for r in rows(tmp_path) if "engine/sync_delta" in r]
    assert len(checked) >= 6 and min(r["engine/sync_delta"] for r in checked) > 1e-4
    assert all(r["engine/sync_delta"] <= r["engine/sync_allowed"] for r in checked)
