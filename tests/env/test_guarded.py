"""The guard (rlvr/env/guarded.py): an environment that raises, hangs past its bound or answers something malformed
costs that episode (a final Step with reward 0 and the error, counted) and never the run."""

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field

import pytest

from rlvr.env.guarded import GuardedEnvironment, SyncCalls
from rlvr.errors import ConfigError
from rlvr.types import EnvFailures, Example, Step

EXAMPLE = Example("prompt", "ref")


@dataclass
class Scripted:
    """An environment whose episodes answer `reset` with `first` and each step with the next of `answers`; an
    answer that is an exception is raised, a callable is awaited (it may hang)."""

    first: object = "start"
    answers: list = field(default_factory=list)
    max_turns: int = 4
    max_context_tokens: int = 8
    step_timeout_s: float = 0.5
    closed: list = field(default_factory=list)

    def episode(self, example, seed):
        return ScriptedEpisode(self, list(self.answers))


@dataclass
class ScriptedEpisode:
    env: Scripted
    answers: list

    async def reset(self):
        return await answer(self.env.first)

    async def step(self, action):
        return await answer(self.answers.pop(0))

    def fork(self):
        return ScriptedEpisode(self.env, list(self.answers))

    async def close(self):
        self.env.closed.append(self)


async def answer(value):
    if isinstance(value, BaseException):
        raise value
    if callable(value):
        return await value()
    return value


def play(env, actions=("a", "b", "c", "d")):
    """reset, then steps until done: (first observation, steps, the guarded episode)."""
    async def run():
        episode = env.episode(EXAMPLE, 0)
        first, steps = await episode.reset(), []
        try:
            for action in actions:
                if episode.done:
                    break
                steps.append(await episode.step(action))
        finally:
            await episode.close()
        return first, steps, episode
    return asyncio.run(run())


def test_a_good_episode_passes_through_untouched():
    env = GuardedEnvironment(Scripted(answers=[Step("more", 0.0, False), Step(None, 1.0, True, {"solved": True})]))
    first, steps, episode = play(env)
    assert first == "start"
    assert steps == [Step("more", 0.0, False), Step(None, 1.0, True, {"solved": True})]
    assert episode.failure is None and episode.ended is None
    assert (env.failures.episodes, env.failures.errors, env.failures.timeouts) == (1, 0, 0)
    assert (env.max_turns, env.max_context_tokens, env.step_timeout_s) == (4, 8, 0.5)


async def hang():
    await asyncio.sleep(3600)


@pytest.mark.parametrize("answers,message", [
    ([ValueError("broken game")], "step raised ValueError: broken game"),
    ([ConnectionError("connection dropped")], "step raised ConnectionError: connection dropped"),
    ([{"observation": "x"}], "step returned a dict (expected rlvr.types.Step)"),
    ([Step(42, 0.0, False)], "step returned an observation of type int (expected str)"),
    ([Step(None, 0.0, False)], "step returned an observation of type NoneType (expected str) while the episode goes "
                               "on (done=False)"),
    ([Step("x" * 129, 0.0, False)], "step returned an observation of 129 characters (more than 128)"),
    ([Step("x", math.nan, False)], "step returned reward=nan (expected a finite number within "
                                   "±trainer.reward_max_abs=1000)"),
    ([Step("x", True, False)], "step returned reward=True (expected a finite number within "
                               "±trainer.reward_max_abs=1000)"),
    # a sentinel or a unit mistake would swamp every other group's advantage, as a verifier's would (single turn)
    ([Step("x", -1e9, False)], "step returned reward=-1000000000.0 (expected a finite number within "
                               "±trainer.reward_max_abs=1000)"),
    ([Step("x", 0.0, 1)], "step returned done=1 (expected a bool)"),
    ([Step("x", 0.0, False, ["info"])], "step returned info of type list (expected a dict)"),
])
def test_a_step_that_raises_or_is_malformed_ends_the_episode_as_an_error(answers, message, caplog):
    env = GuardedEnvironment(Scripted(answers=[Step("fine", 0.5, False), *answers]))
    with caplog.at_level(logging.WARNING, logger="rlvr"):
        first, steps, episode = play(env)
    # max_observation_chars defaults to 16 characters per token of max_context_tokens: 16 × 8 = 128
    assert steps == [Step("fine", 0.5, False), Step(None, 0.0, True, {"error": message})]
    assert episode.failure == "error" and episode.ended == steps[-1] and episode.done
    assert env.failures == EnvFailures(episodes=1, errors=1, timeouts=0)
    assert message in caplog.text and "the episode ends with reward 0" in caplog.text
    assert len(env.env.closed) == 1  # closed all the same


def test_the_reward_bound_is_the_runs():
    """trainer.reward_max_abs reaches the guard from the run's config; a reward at the bound is kept."""
    from composing import compose_config
    from rlvr.build import build_components

    env = build_components(compose_config(["env=guess", "trainer.reward_max_abs=2"])).env
    assert env is not None and env.max_abs == 2.0
    kept = GuardedEnvironment(Scripted(answers=[Step(None, 2.0, True)]), max_abs=2.0)
    assert play(kept)[1] == [Step(None, 2.0, True)]
    refused = GuardedEnvironment(Scripted(answers=[Step(None, 2.5, True)]), max_abs=2.0)
    assert play(refused)[1][-1].info == {"error": "step returned reward=2.5 (expected a finite number within "
                                                  "±trainer.reward_max_abs=2)"}


def test_a_step_that_hangs_past_the_bound_ends_the_episode_as_a_timeout():
    env = GuardedEnvironment(Scripted(answers=[hang], step_timeout_s=0.2))
    start = time.monotonic()
    _, steps, episode = play(env)
    assert time.monotonic() - start < 5
    assert steps == [Step(None, 0.0, True, {"error": "step took more than env.step_timeout_s=0.2 s", "timeout": True})]
    assert episode.failure == "timeout"
    assert env.failures == EnvFailures(episodes=1, errors=0, timeouts=1)
    assert env.failures.fractions() == {"env/error_frac": 0.0, "env/timeout_frac": 1.0}


@pytest.mark.parametrize("first,kind,message", [
    (RuntimeError("no session"), "error", "reset raised RuntimeError: no session"),
    (None, "error", "reset returned an observation of type NoneType (expected str)"),
    ("x" * 129, "error", "reset returned an observation of 129 characters (more than 128)"),
    (hang, "timeout", "reset took more than env.step_timeout_s=0.2 s"),
])
def test_a_reset_that_fails_answers_empty_and_the_episode_is_already_over(first, kind, message):
    env = GuardedEnvironment(Scripted(first=first, answers=[Step("never asked", 0.0, False)], step_timeout_s=0.2))

    async def run():
        episode = env.episode(EXAMPLE, 0)
        text = await episode.reset()
        again = await episode.step("anything")  # the environment is not called: the final Step again
        await episode.close()
        return text, again, episode

    text, again, episode = asyncio.run(run())
    assert text == "" and episode.ended is not None and episode.done and episode.failure == kind
    assert again is episode.ended and again.info["error"] == message and again.reward == 0.0
    assert env.env.answers == [Step("never asked", 0.0, False)]
    assert (env.failures.errors, env.failures.timeouts) == ((1, 0) if kind == "error" else (0, 1))


def test_episode_that_raises_is_an_ended_episode_and_a_config_error_stops_the_run():
    class Broken(Scripted):
        def episode(self, example, seed):
            raise KeyError("no such level")

    env = GuardedEnvironment(Broken())
    _, steps, episode = play(env)
    assert steps == [] and episode.failure == "error"
    assert episode.ended.info == {"error": "episode() raised KeyError: 'no such level'"}

    class Misconfigured(Scripted):
        def episode(self, example, seed):
            raise ConfigError("invalid config:\n  env.game=x")

    with pytest.raises(ConfigError):
        GuardedEnvironment(Misconfigured()).episode(EXAMPLE, 0)


def test_counts_are_per_episode_and_taken_per_step():
    # 4 episodes: fine, raises, malformed, hangs → 1 error + 1 malformed = 2 errors, 1 timeout
    env = GuardedEnvironment(Scripted(step_timeout_s=0.2))
    for answers in ([Step(None, 1.0, True)], [OSError("gone")], [Step(1, 0.0, False)], [hang]):
        env.env.answers = answers
        play(env)
    assert env.failures.fractions() == {"env/error_frac": 0.5, "env/timeout_frac": 0.25}
    assert env.failures.take() == EnvFailures(4, 2, 1)
    assert env.failures == EnvFailures(0, 0, 0) and env.failures.fractions()["env/error_frac"] == 0.0


def test_fork_is_guarded_and_counted_and_an_ended_copy_stays_ended():
    env = GuardedEnvironment(Scripted(answers=[Step("a", 0.0, False), Step(None, 1.0, True)]))

    async def run():
        episode = env.episode(EXAMPLE, 0)
        await episode.reset()
        copy = episode.fork()
        one = [await episode.step("x"), await episode.step("y")]
        two = [await copy.step("x"), await copy.step("y")]
        return one, two

    one, two = asyncio.run(run())
    assert one == two == [Step("a", 0.0, False), Step(None, 1.0, True)]
    assert env.failures.episodes == 2

    env = GuardedEnvironment(Scripted(answers=[ValueError("x")]))

    async def ended_copy():
        episode = env.episode(EXAMPLE, 0)
        await episode.reset()
        await episode.step("x")
        return episode, episode.fork()

    episode, copy = asyncio.run(ended_copy())
    assert copy.ended == episode.ended and copy.failure == "error" and env.failures == EnvFailures(1, 1, 0)


def test_a_fork_that_cannot_be_made_raises_not_implemented():
    class NoFork(ScriptedEpisode):
        def fork(self):
            raise NotImplementedError("does not fork")

    class Env(Scripted):
        def episode(self, example, seed):
            return NoFork(self, [])

    env = GuardedEnvironment(Env())
    episode = env.episode(EXAMPLE, 0)
    with pytest.raises(NotImplementedError):
        episode.fork()
    assert env.failures.episodes == 1


def test_close_failures_are_not_counted_and_do_not_raise():
    class BadClose(ScriptedEpisode):
        async def close(self):
            raise RuntimeError("socket already closed")

    class Env(Scripted):
        def episode(self, example, seed):
            return BadClose(self, [Step(None, 1.0, True)])

    env = GuardedEnvironment(Env())
    _, steps, _ = play(env)
    assert steps == [Step(None, 1.0, True)] and env.failures == EnvFailures(1, 0, 0)


def test_a_step_after_done_is_the_loops_bug():
    env = GuardedEnvironment(Scripted(answers=[Step(None, 1.0, True)]))

    async def run():
        episode = env.episode(EXAMPLE, 0)
        await episode.reset()
        await episode.step("x")
        await episode.step("y")

    with pytest.raises(RuntimeError, match="has ended"):
        asyncio.run(run())


def test_step_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="env.step_timeout_s=0"):
        GuardedEnvironment(Scripted(step_timeout_s=0))


def test_sync_calls_run_on_one_thread_and_a_hung_call_is_abandoned_without_holding_up_the_rest():
    release = threading.Event()
    calls = SyncCalls("test-env")

    async def run():
        threads = {await calls(lambda: threading.current_thread().name) for _ in range(3)}
        with pytest.raises(ValueError, match="inside"):
            await calls(lambda: (_ for _ in ()).throw(ValueError("raised inside")))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(calls(release.wait, 3600), 0.2)  # hangs until released
        with pytest.raises(RuntimeError, match="did not return in time"):
            await calls(lambda: 1)
        other = SyncCalls("test-env-2")  # another episode's calls go on
        return threads, await other(lambda: 2)

    threads, value = asyncio.run(run())
    assert threads == {"test-env"} and value == 2
    hung = [t for t in threading.enumerate() if t.name == "test-env"]
    assert hung and all(t.daemon for t in hung)  # a daemon: it never holds up the process's exit
    release.set()
    hung[0].join(5)
    assert not hung[0].is_alive()  # the abandoned call returned into a closed loop: the thread ended quietly
