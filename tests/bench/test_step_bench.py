"""`python bench/step.py` (docs/measured/step-vs-trl.md) at its smallest: one measured step a side, no warm-up. Both
sides step (rlvr through `Trainer.stepping`, as `fit` does; it once crashed on a sampler `fit` built and the bench did
not) from the same weights, and the ratio is printed."""

import re

import pytest


def test_rlvr_and_trl_each_take_a_step_and_the_ratio_is_printed(run_bench, figure):
    pytest.importorskip("trl", reason="bench/step.py compares against TRL (the dev extra installs it)")
    out = run_bench("bench/step.py", "--steps", "1", "--warmup", "0", "--rounds", "1", "--sft-steps", "0")
    assert figure(r"ratio rlvr/TRL of median step wall: ([0-9.]+)", out) > 0
    assert figure(r"\(CPU time: ([0-9.]+)\)", out) > 0
    assert "did not start from identical weights" not in out
    for row in ("median step wall (s)", "peak RSS (MB)"):
        assert figure(rf"{re.escape(row)} +([0-9.]+)", out) > 0
    # without a warm-up rlvr's groups usually tie and its update is skipped: its training time may be 0
    assert figure(rf"{re.escape('  training, median (s)')} +([0-9.]+)", out) >= 0
