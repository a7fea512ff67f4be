import pytest

from rlvr.reward.function import FunctionReward


@pytest.mark.parametrize("name", ["examples_rewards.contains_answer", "examples_rewards.contains_answer_async"])
def test_sync_and_async_functions(name):
    reward = FunctionReward(name)
    assert reward.score(["the answer is 42", "41"], ["42", "42"]).values == [1.0, 0.0]



def test_bad_names_fail_at_build_and_bad_values_count_as_errors(caplog):
    with pytest.raises(ValueError, match="reward.function='nope.fn' cannot be imported"):
        FunctionReward("nope.fn")
    scores = FunctionReward("examples_rewards.not_a_number").score(["a", "b"], ["b", "b"])
    assert (scores.values, scores.errors, scores.timeouts) == ([0.0, 0.0], 2, 0)
    assert "examples_rewards.not_a_number" in caplog.text and "returned nan" in caplog.text
    scores = FunctionReward("examples_rewards.raises_on_x").score(["x", "1"], ["1", "1"])
    assert (scores.values, scores.errors) == ([0.0, 1.0], 1)
    assert "raised KeyError" in caplog.text


def test_an_async_function_past_its_timeout_scores_zero_and_counts():
    scores = FunctionReward("examples_rewards.hangs_on_x", timeout_s=0.2).score(["x", "1", "x"], ["1", "1", "1"])
    assert (scores.values, scores.timeouts, scores.errors) == ([0.0, 1.0, 0.0], 2, 0)


def test_a_custom_reward_trains_through_the_config(tmp_path):
    from composing import FAST, compose_config
    from rlvr.run import run

    cfg = compose_config(FAST + ["reward=function", "reward.function=examples_rewards.contains_answer",
                                 "trainer.max_steps=1"])
    assert run(cfg, tmp_path)["steps"] == 1
