"""env=retry (rlvr/env/retry.py): the run's data and verifier as "wrong, try again": wrong then right solves with
reward 1 on the solving turn, running out of turns scores 0, the verifier runs off the event loop, forks are
independent, and conf/env/retry.yaml builds the run's own reward."""

import asyncio
import threading

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from openai_compatible_server import CONF_DIR

from composing import compose_config
from rlvr.env.guarded import GuardedEnvironment
from rlvr.env.retry import RetryEnvironment
from rlvr.reward.exact import ExactMatch
from rlvr.reward.function import FunctionReward
from rlvr.types import Example, Scores, Step

SUM = Example("12+34=", "46")


def yaml_values(**overrides) -> dict:
    """conf/env/retry.yaml's values but `_target_` and `reward` (`${reward}`, which only the whole config resolves:
    test_the_yaml_wraps_the_runs_own_reward composes it), with `overrides`."""
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "env" / "retry.yaml"), resolve=False)
    assert values.pop("reward") == "${reward}" and values.pop("_target_") == "rlvr.env.retry.RetryEnvironment"
    assert set(overrides) <= set(values)
    return values | overrides


def retry(reward=None, **overrides) -> RetryEnvironment:
    return RetryEnvironment(reward=reward or ExactMatch(), **yaml_values(**overrides))


def play(env, actions, example=SUM):
    async def run():
        episode = env.episode(example, seed=0)
        first, steps = await episode.reset(), []
        for action in actions:
            steps.append(await episode.step(action))
            if steps[-1].done:
                break
        await episode.close()
        return first, steps
    return asyncio.run(run())


def test_wrong_then_right_is_solved_with_reward_one_on_the_solving_turn():
    first, steps = play(retry(), ["45", "46"])
    assert first == "12+34="
    assert steps == [Step("=", 0.0, False, {}), Step(None, 1.0, True, {"solved": True, "turns": 2})]


def test_out_of_turns_scores_zero():
    first, steps = play(retry(), ["1", "2", "3", "46"])
    assert steps == [Step("=", 0.0, False, {}), Step("=", 0.0, False, {}),
                     Step(None, 0.0, True, {"solved": False, "turns": 3})]  # max_turns: 3; "46" is never asked
    _, steps = play(retry(max_turns=1), ["46"])
    assert steps == [Step(None, 1.0, True, {"solved": True, "turns": 1})]  # one turn: the single-turn task


def test_the_wrong_text_is_configurable_and_the_verifier_counts_show_in_info():
    _, steps = play(retry(wrong="\nWrong, try again.\n"), ["", "46"])
    # ExactMatch counts an empty completion as a parse failure
    assert steps == [Step("\nWrong, try again.\n", 0.0, False, {"verifier": "parse_failure"}),
                     Step(None, 1.0, True, {"solved": True, "turns": 2})]


def test_a_function_verifier_runs_off_the_event_loop_one_call_at_a_time():
    # reward=function with an async function runs its own event loop (asyncio.run): it must not be called on the
    # rollout loop's thread
    env = retry(FunctionReward("examples_rewards.contains_answer_async", timeout_s=5))
    _, steps = play(env, ["no", "it is 46"])
    assert steps[-1] == Step(None, 1.0, True, {"solved": True, "turns": 2})

    inside, most = [0], [0]

    class Slow:
        def score(self, completions, references):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            threading.Event().wait(0.02)
            inside[0] -= 1
            return Scores([float(c == r) for c, r in zip(completions, references)])

    env = retry(Slow())

    async def many():
        episodes = [env.episode(SUM, seed) for seed in range(8)]
        await asyncio.gather(*(e.reset() for e in episodes))
        return await asyncio.gather(*(e.step("46" if i % 2 else "0") for i, e in enumerate(episodes)))

    steps = asyncio.run(many())
    assert [s.reward for s in steps] == [0.0, 1.0] * 4 and most[0] == 1


def test_a_verifier_that_raises_costs_the_episode_through_the_guard():
    class Raises:
        def score(self, completions, references):
            raise RuntimeError("grader crashed")

    env = GuardedEnvironment(retry(Raises()))
    _, steps = play(env, ["46"])
    assert steps == [Step(None, 0.0, True, {"error": "step raised RuntimeError: grader crashed"})]
    assert env.failures.errors == 1


def test_a_fork_is_an_independent_copy():
    env = retry()

    async def run():
        episode = env.episode(SUM, 0)
        await episode.reset()
        await episode.step("1")
        copy = episode.fork()
        return [await copy.step("46")], [await episode.step("2"), await episode.step("3")]

    copy, original = asyncio.run(run())
    assert copy == [Step(None, 1.0, True, {"solved": True, "turns": 2})]
    assert original == [Step("=", 0.0, False, {}), Step(None, 0.0, True, {"solved": False, "turns": 3})]


def test_the_yaml_wraps_the_runs_own_reward():
    cfg = compose_config(["env=retry", "reward=function", "reward.function=examples_rewards.contains_answer"])
    env = instantiate(cfg.env, _convert_="all")
    assert isinstance(env.reward, FunctionReward) and env.reward.name == "examples_rewards.contains_answer"
    _, steps = play(env, ["x", "46!"])
    assert steps[-1].reward == 1.0
    needs = RetryEnvironment.needs(yaml_values() | {"reward": {"_target_": "rlvr.reward.math.MathVerify"}})
    assert "fork" in needs.provides
    assert [r.item for r in needs.machine] == ["math-verify", "math_verify"]  # the verifier's own


@pytest.mark.parametrize("overrides,message", [({"max_turns": 0}, "env.max_turns=0"), ({"wrong": ""}, "env.wrong"),
                                               ({"step_timeout_s": 0.0}, "env.step_timeout_s=0.0")])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        retry(**overrides)
