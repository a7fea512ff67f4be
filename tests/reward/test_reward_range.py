"""A reward out of range is a counted failure naming the reward, not a step that trains on it (issue 37 req 5):
every reward the trainer gets is a finite number within ±trainer.reward_max_abs (rlvr/reward/guarded.py)."""

import json
import math

import pytest
from faulty import Constant

from rlvr.reward.function import FunctionReward
from rlvr.reward.guarded import MAX_ABS, RewardGuard, guarded_score


def guard(reward: dict, max_abs: float | None = None) -> RewardGuard:
    """The guard of a run whose config has this `reward` group (and trainer.reward_max_abs, when given)."""
    return RewardGuard.of({"reward": reward, "trainer": {} if max_abs is None else {"reward_max_abs": max_abs}})


def test_a_function_returning_1e9_is_a_counted_error_naming_the_function(caplog):
    reward = FunctionReward("examples_rewards.huge_on_x", workers=1)
    try:
        scores = guarded_score(reward, ["x", "the answer is 1", "2"], ["1", "1", "1"],
                               guard({"_target_": "rlvr.reward.function.FunctionReward",
                                      "function": "examples_rewards.huge_on_x"}))
    finally:
        reward.close()
    assert (scores.values, scores.errors) == ([0.0, 1.0, 0.0], 1)
    assert ("reward.function='examples_rewards.huge_on_x' returned 1000000000.0 for 1 of 3 completions: a reward "
            "must be a finite number within ±trainer.reward_max_abs=1000") in caplog.text


@pytest.mark.parametrize("value", [math.nan, math.inf, -1e9])
def test_a_reward_class_returning_a_value_out_of_range_is_counted_and_named(value, caplog):
    scores = guarded_score(Constant(value), ["a", "b"], ["a", "b"], guard({"_target_": "faulty.Constant"}))
    assert (scores.values, scores.errors) == ([0.0, 0.0], 2)
    assert f"reward <faulty.Constant> returned {value!r} for 2 of 2 completions" in caplog.text


@pytest.mark.parametrize("value", [-MAX_ABS, -0.5, 0.0, 1.0, MAX_ABS])
def test_rewards_within_the_range_are_kept(value, caplog):
    scores = guarded_score(Constant(value), ["a", "b"], ["a", "b"], guard({"_target_": "faulty.Constant"}))
    assert (scores.values, scores.errors) == ([value, value], 0)
    assert not caplog.text


def test_trainer_reward_max_abs_bounds_a_runs_rewards(tmp_path, caplog):
    """From the config to the step: with a bound of 0.5, every 1.0 the parity function gives (about half the
    completions) is an error named by the function, counted in reward/error_frac, and trains nothing."""
    from composing import FAST, MIXED, compose_config
    from rlvr.run import run

    run(compose_config(FAST + MIXED + ["trainer.max_steps=1", "trainer.reward_max_abs=0.5"]), tmp_path)
    step = next(r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "loss" in r)
    assert step["mean_reward"] == 0.0 and 0.2 < step["reward/error_frac"] < 0.8, step
    assert ("reward.function='tests.backpressure.mixed_rewards.parity' returned 1.0 for" in caplog.text
            and "trainer.reward_max_abs=0.5" in caplog.text)
