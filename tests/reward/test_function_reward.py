import pytest

from rlvr.reward.function import FunctionReward


@pytest.mark.parametrize("name", ["examples_rewards.contains_answer", "examples_rewards.contains_answer_async"])
def test_sync_and_async_functions(name):
    reward = FunctionReward(name)
    assert reward.score(["the answer is 42", "41"], ["42", "42"]) == [1.0, 0.0]



def test_bad_names_and_bad_values_are_named():
    with pytest.raises(ValueError, match="reward.function='nope.fn' cannot be imported"):
        FunctionReward("nope.fn")
    with pytest.raises(ValueError, match="returned nan"):
        FunctionReward("examples_rewards.not_a_number").score(["a"], ["b"])


def test_a_custom_reward_trains_through_the_config(tmp_path):
    from composing import FAST, compose_config
    from rlvr.run import run

    cfg = compose_config(FAST + ["reward=function", "reward.function=examples_rewards.contains_answer",
                                 "trainer.max_steps=1"])
    assert run(cfg, tmp_path)["steps"] == 1
