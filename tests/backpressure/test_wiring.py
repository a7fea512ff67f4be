"""Back pressure wired into the config and the loop: checks before anything loads, the data stream under a
changing batch size, and real runs of the tiny model (rlvr.run.run on the composed config), resumed too.

The runs use a verifier that gives the untrained model mixed rewards (tests/backpressure/mixed_rewards.py),
so steps train and are measured. Where a test needs exact batch sizes it replaces the wall clock: the
controller is told that a step of p completions took tokens / X(p) seconds, X a known USL curve."""

import json
import math

import pytest

from composing import FAST, compose_config
from rlvr.backpressure.usl import USLBackPressure, usl_capacity
from rlvr.config_check import check
from rlvr.data.arithmetic import Arithmetic
from rlvr.data.order import prompts_at
from rlvr.errors import ConfigError
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run
from rlvr.seeds import Seeds
from rlvr.trainer import Trainer

METRICS = {"bp_warmup", "bp_action", "bp_regime", "bp_p_star", "bp_sigma", "bp_kappa", "bp_utilization",
           "bp_throughput"}
USL = ["backpressure=usl", "backpressure.warmup_steps=4", "backpressure.max_batch_size=8",
       "reward=function", "reward.function=tests.backpressure.mixed_rewards.parity"]


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_rows(run_dir):
    return [r for r in rows(run_dir) if "loss" in r]


def comparable(run_dir):
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows(run_dir)]


def synthetic_clock(monkeypatch, sigma: float, kappa: float, lam: float = 1000.0) -> None:
    """The controller measures X(p) = λ·C(p) tokens/s instead of the machine's (the rows' own timing fields
    stay real)."""
    observe = USLBackPressure.observe

    def measured(self, *, seconds, **step):
        p = step["batch_size"] * step["group_size"]
        return observe(self, seconds=step["tokens"] / (lam * usl_capacity(p, sigma, kappa)), **step)

    monkeypatch.setattr(USLBackPressure, "observe", measured)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.batch_size=100"], "trainer.batch_size=100 is outside backpressure.min_batch_size .. "
                                     "max_batch_size = 1 .. 64"),
        # every b in 1 … 64 must give b × 8 rows divisible by 16: b = 1 gives 8
        (["backend.micro_batch_size=16"], "backend.micro_batch_size=16 does not divide b × trainer.group_size for "
                                          "every batch size b in backpressure.min_batch_size .. max_batch_size = "
                                          "1 .. 64 (b = 1: 1 × 8 = 8)"),
        (["backpressure.patience=1.5"], "backpressure.patience=1.5 must be int"),
        (["+backpressure.peak_gflops=100"], "backpressure.peak_gflops: <rlvr.backpressure.usl.USLBackPressure> takes "
                                            "no such argument"),
    ],
)
def test_config_mistakes_name_the_keys(overrides, message):
    with pytest.raises(ConfigError) as err:
        check(compose_config(["backpressure=usl", *overrides]))
    assert message in str(err.value)


def test_default_is_off_and_usl_defaults_are_valid():
    cfg = compose_config([])
    assert cfg.backpressure._target_ == "rlvr.backpressure.none.NoBackPressure"
    check(compose_config(["backpressure=usl"]))
    check(compose_config(["backpressure=usl", "trainer=gpu", "backend.micro_batch_size=8",  # G = 16
                          "trainer.sampling.max_tokens=8", "trainer.eval_max_tokens=8"]))


def test_prompts_at_walks_the_stream_whatever_the_batch_sizes():
    # sizes 1, 2, 4, 8, 3 take stream positions 0, 1–2, 3–6, 7–14, 15–17: together the first 18 examples,
    # exactly what one step of 18 draws; with a constant size it is the source's own batch(step, size)
    data = Arithmetic(seed=3, digits=2, eval_size=64, split_seed=0, carryless_fraction=0.0)
    drawn, position = [], 0
    for step, size in enumerate([1, 2, 4, 8, 3]):
        drawn += prompts_at(data, step, position, size)
        position += size
    assert drawn == data.batch(0, 18)
    assert [prompts_at(data, step, 8 * step, 8) for step in range(3)] == [data.batch(step, 8) for step in range(3)]


def test_a_usl_run_changes_the_batch_size_with_finite_metrics(tmp_path):
    run(compose_config(FAST + USL + ["trainer.max_steps=12"]), tmp_path)
    steps = step_rows(tmp_path)
    sizes = [r["batch_size"] for r in steps]
    assert sizes[:4] == [1, 2, 4, 8] and all(1 <= s <= 8 for s in sizes)  # the sweep, then the wall clock decides
    assert [r["bp_warmup"] for r in steps] == [True] * 4 + [False] * 8
    for r in steps:
        assert METRICS <= r.keys() and r["num_datums"] == 8 * r["batch_size"]
        assert r["bp_action"] in {"hold", "throttle", "increase"}
        assert r["bp_regime"] in {"warmup", "retrograde", "memory_bound", "optimal"}
        assert all(math.isfinite(r[k]) for k in METRICS - {"bp_warmup", "bp_action", "bp_regime"}), r
    assert sum(not r["skipped"] for r in steps) >= 8, "the parity verifier should make most steps train"
    # step s starts at stream position Σ earlier batch sizes (its first group is in samples/)
    data = Arithmetic(seed=Seeds.from_root(0).data, digits=2, eval_size=64, split_seed=0, carryless_fraction=0.8)
    for s in range(12):
        first = json.loads((tmp_path / "samples" / f"step_{s:06d}.jsonl").read_text().splitlines()[0])
        assert first["prompt"] == data.batch(sum(sizes[:s]), 1)[0].prompt
    state = json.loads((tmp_path / "checkpoints" / "step_12" / "trainer_state.json").read_text())
    assert state["totals"]["prompts"] == sum(sizes) and state["backpressure"]["points"]


RETROGRADE = dict(sigma=0.02, kappa=0.98 / 24**2)
"""p* = sqrt(0.98 / κ) = 24 completions = 3 prompts of G = 8."""
EXPECTED_SIZES = [1, 2, 4, 8, 8, 8, 2, 2, 2, 2, 2, 2]
"""Sweep 1, 2, 4, 8 (steps 0–3); trainer.batch_size 8 (p = 64 > 0.85·24 = 20.4: retrograde) at steps 4 and 5,
each recommending target ⌊20.4/8⌋ = 2 (X(16)/X(64) = 9.5/7.1: worth it); patience 2 → applied from step 6;
at p = 16 (≤ 20.4, ≥ 0.5·20.4) it holds."""


def test_a_retrograde_machine_throttles_the_run(tmp_path, monkeypatch):
    synthetic_clock(monkeypatch, **RETROGRADE)
    run(compose_config(FAST + USL + ["trainer.max_steps=12"]), tmp_path)
    steps = step_rows(tmp_path)
    assert not any(r["skipped"] for r in steps), "a skipped step is not measured: the expected sizes assume none"
    assert [r["batch_size"] for r in steps] == EXPECTED_SIZES
    assert [r["bp_action"] for r in steps][4:7] == ["hold", "throttle", "hold"]
    assert steps[4]["bp_regime"] == "retrograde" and steps[5]["bp_p_star"] == pytest.approx(24.0)


def test_a_resumed_usl_run_continues_identically(tmp_path, monkeypatch):
    # the checkpoint after 5 steps is taken mid-decision: step 4 recommended a throttle once (patience 2), so
    # the uninterrupted run applies it after step 5; a resumed run must too (and draw from stream position 15)
    synthetic_clock(monkeypatch, **RETROGRADE)
    overrides = FAST + USL + ["trainer.max_steps=12", "trainer.save_every=5"]
    run(compose_config(overrides), tmp_path / "reference")
    step, crash_at = Trainer.step, {"step": 7}

    def crashing(self, live, index):
        if index == crash_at["step"]:
            raise RuntimeError("killed")
        return step(self, live, index)

    monkeypatch.setattr(Trainer, "step", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        run(compose_config(overrides), tmp_path / "resumed")
    saved = json.loads((tmp_path / "resumed" / "checkpoints" / "step_5" / "trainer_state.json").read_text())
    assert saved["backpressure"]["pending"] == "throttle" and saved["backpressure"]["streak"] == 1
    assert saved["totals"]["prompts"] == 1 + 2 + 4 + 8 + 8
    crash_at["step"] = None
    run(compose_config(overrides), tmp_path / "resumed")
    assert [r["batch_size"] for r in step_rows(tmp_path / "resumed")] == EXPECTED_SIZES
    assert comparable(tmp_path / "resumed") == comparable(tmp_path / "reference")
    final = [json.loads((tmp_path / d / "checkpoints" / "step_12" / "trainer_state.json").read_text())
             for d in ("reference", "resumed")]
    assert final[0]["backpressure"] == final[1]["backpressure"]
