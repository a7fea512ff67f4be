"""trainer.sync_check (rlvr/engine/sync_check.py): a run whose engine stops receiving the trainer's weights is
stopped with an error that says so; the tolerance follows the precisions. engine=vllm's stale adapter and stale
full weights: tests/engine/test_vllm_engine.py."""

import pytest

from composing import compose_config
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.engine.sync_check import FLOAT32_TOLERANCE, LOW_PRECISION_TOLERANCE, StaleEngineError, SyncCheck
from rlvr.run import run

RUN = ["trainer.warmup.steps=0", "trainer.max_steps=4", "trainer.evaluate=false", "threads=1",
       "reward=function", "reward.function=tests.backpressure.mixed_rewards.parity", "trainer.lr=0.05",
       "trainer.sync_check.every=1"]


def test_an_engine_left_on_stale_weights_stops_the_run(tmp_path, monkeypatch):
    """The pytorch engine samples LoRA runs from a merged copy that `sync` refreshes: skip every sync after the
    first and the copy goes stale as the adapter trains (lr 0.05: it moves in one step)."""
    real, calls = PyTorchEngine.sync, []

    def first_only(self, policy):
        calls.append(1)
        return real(self, policy) if len(calls) == 1 else 0

    monkeypatch.setattr(PyTorchEngine, "sync", first_only)
    with pytest.raises(StaleEngineError, match="serves other weights than the trainer's") as err:
        run(compose_config(RUN), tmp_path)
    assert "before step 2" in str(err.value) or "before step 3" in str(err.value)


def test_a_faithful_engine_passes_every_check(tmp_path):
    summary = run(compose_config(RUN), tmp_path)
    assert summary["steps"] == 4


def test_the_tolerance_follows_the_precisions():
    auto = SyncCheck(every=1)
    assert auto.resolved_tolerance("float32", None) == FLOAT32_TOLERANCE  # the engine samples in the model's dtype
    assert auto.resolved_tolerance("float32", "bfloat16") == LOW_PRECISION_TOLERANCE
    assert auto.resolved_tolerance("bfloat16", None) == LOW_PRECISION_TOLERANCE
    assert SyncCheck(every=1, tolerance=0.5).resolved_tolerance("bfloat16", None) == 0.5
    with pytest.raises(ValueError, match="trainer.sync_check"):
        SyncCheck(every=-1)
