"""The environment calls the rollout loop makes: one bad episode never stops a run.

`GuardedEnvironment(env)` wraps any `Environment` (rlvr/protocols.py); its episodes bound every `reset`, `step`
and `close` by `env.step_timeout_s` of wall time (`asyncio.wait_for`) and check what comes back. An environment
call that

  raises (the environment's own bug, a server that dropped the connection, a refused session), → error
  runs past `step_timeout_s`,                                                                    → timeout
  returns a malformed answer: `reset` not a str; `step` not a `Step`, its observation neither a str nor None
  (or None while the episode goes on), its reward not a finite number within ±`trainer.reward_max_abs` (as a
  verifier's, rlvr/reward/guarded.py), `done` not a bool, `info` not a dict;
  an observation longer than `max_observation_chars`,                                            → error

ends that episode: `step` answers `Step(None, 0.0, True, {"error": "<what happened>"})` (plus `"timeout": True`
for a timeout), and a `reset` that fails answers "" with the episode already over. Either way the episode's
`failure` says so ("error" or "timeout") and `ended` holds that final Step; any later `step` returns it again
without calling the environment. The loop must not generate from such an episode (check `ended` after `reset`)
and scores it 0 in total: rewards its earlier turns returned are the loop's to zero, the guard cannot take them
back. `GuardedEnvironment.failures` counts episodes started (forks included) and how many of them ended as
errors or timeouts, for the metrics `env/error_frac` and `env/timeout_frac` (rlvr/types.py `EnvFailures`); the first
failure of each kind is logged as a warning, later ones only counted. A `ConfigError` and a KeyboardInterrupt
still stop the run: they are not an episode's fault. `close` is bounded too, and its failures are logged at
debug level, not counted: the episode was already scored.

Which code a timeout can stop. `asyncio.wait_for` cancels an awaiting coroutine: a server call (openenv's
WebSocket client) is abandoned at once. Synchronous code cannot be cancelled, and code that blocks the event
loop cannot even be timed; so an environment that runs synchronous code which may be slow or hang (a TextArena
game, an in-process OpenEnv class, a verifier) runs it through its episode's `SyncCalls`: a daemon thread of
the episode's own, which takes one call at a time (so a game that needs one thread keeps one). When a call
times out, the episode is ended and its thread abandoned: it keeps running whatever hung until that returns or
the process exits (a daemon thread never holds up the exit), and what it returns is dropped. That costs one
thread per hung call, which is the price of not killing the process; a game that hangs often shows as a high
`env/timeout_frac` long before threads run out. Pure, quick code (the `guess` game) runs on the loop directly.

Calls that never suspend. A call is first run directly (rlvr/calls.py `started`) until it first awaits something that
is not ready: an in-process game's `step` returns before that, and then costs no task and no timer (a timer could not
have stopped it: the event loop had no turn). A call that suspends runs on under `asyncio.wait_for` with what is left
of `step_timeout_s`. The episode loop gathers a turn's calls the same way (`gather_eagerly`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from rlvr.calls import describe, finish, settle, started
from rlvr.errors import ConfigError
from rlvr.optional import ConcurrencyBound, PlaysDemonstrations, ToolUse
from rlvr.protocols import Environment, Episode
from rlvr.reward.guarded import MAX_ABS, ok
from rlvr.types import EnvFailures, Example, Step

log = logging.getLogger("rlvr")
T = TypeVar("T")

OBSERVATION_CHARS_PER_TOKEN = 16
"""Default bound on one observation's length: this many characters per token of `max_context_tokens`. Real
tokenizers average ~4 characters a token, so an observation past it could never fit the context: it is a
runaway (a server dumping a page), and is refused before it is tokenized."""


class SyncCalls:
    """One episode's synchronous calls, run one at a time on a daemon thread of its own (started at the first
    call), each awaited from the event loop. A call still running when its awaiting coroutine is cancelled (the
    guard's timeout) is abandoned: the thread finishes it, drops the result, and takes no more calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future, asyncio.AbstractEventLoop] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._abandoned = False

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        if self._abandoned:
            raise RuntimeError(f"{self.name}: an earlier call did not return in time; this episode takes no more")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._calls.put((lambda: fn(*args), future, loop))
        try:
            return await future
        except asyncio.CancelledError:
            self._abandoned = True  # the thread may still be inside fn: nothing more is sent to it
            self._calls.put(None)
            raise

    def stop(self) -> None:
        """Let the thread end after the call it is running, if any."""
        if self._thread is not None:
            self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, future, loop = item
            try:
                outcome, failed = fn(), False
            except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
                outcome, failed = err, True
            try:
                loop.call_soon_threadsafe(settle, future, outcome, failed)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                return


class GuardedEnvironment:
    """`env`'s episodes, each call bounded and checked (module docstring). Has the wrapped environment's
    `max_turns`, `max_context_tokens` and `step_timeout_s`, and what it can do beyond its protocol, found here once
    (rlvr/optional.py)."""

    def __init__(self, env: Environment, max_observation_chars: int | None = None, max_abs: float = MAX_ABS) -> None:
        if not env.step_timeout_s > 0:
            raise ConfigError(f"invalid config:\n  env.step_timeout_s={env.step_timeout_s} must be > 0")
        self.env = env
        self.max_turns = env.max_turns
        self.max_context_tokens = env.max_context_tokens
        self.step_timeout_s = env.step_timeout_s
        self.max_concurrent = env.max_concurrent if isinstance(env, ConcurrencyBound) else None
        """Episodes whose calls may be in flight at once (a server's bound); None: all of them."""
        self.demonstrations = env.demonstrations if isinstance(env, PlaysDemonstrations) else None
        """`demonstrations(count, seed)` of an environment that plays its own games for the warm-up (env=guess:
        transcripts [prompt, action, observation, …]), else None."""
        self.tools = env if isinstance(env, ToolUse) else None
        """An environment with `env.tools` (rlvr/tools/harness.py): its tools' schemas and call format."""
        self.tool_schemas = self.tools.tool_schemas if self.tools is not None else None
        """Their JSON schemas, shown in the prompt (rlvr/chat/tools.py); None without tools."""
        self.max_observation_chars = max_observation_chars or OBSERVATION_CHARS_PER_TOKEN * env.max_context_tokens
        self.max_abs = max_abs
        """The bound on a step's reward: `trainer.reward_max_abs`."""
        self.failures = EnvFailures()
        self._warned: set[str] = set()

    def episode(self, example: Example, seed: int) -> GuardedEpisode:
        self.failures.episodes += 1
        try:
            inner = self.env.episode(example, seed)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - contained: this episode only
            episode = GuardedEpisode(self, None)
            episode.fail("error", f"episode() raised {describe(err)}")
            return episode
        return GuardedEpisode(self, inner)

    def record(self, kind: str, message: str) -> None:
        if kind == "timeout":
            self.failures.timeouts += 1
        else:
            self.failures.errors += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("env %s: %s: the episode ends with reward 0 (every further %s is counted in env/%s_frac, "
                        "not logged)", type(self.env).__name__, message, kind, kind)


class GuardedEpisode:
    """One episode of a `GuardedEnvironment` (module docstring)."""

    def __init__(self, guard: GuardedEnvironment, inner: Episode | None) -> None:
        self.guard = guard
        self.inner = inner
        self.failure: str | None = None
        """None, "error" or "timeout": why the guard ended the episode."""
        self.ended: Step | None = None
        """The guard's final Step once it ended the episode."""
        self.done = False
        """The episode is over (the environment said so, or the guard ended it)."""

    def fail(self, kind: str, message: str) -> Step:
        self.failure, self.done = kind, True
        self.ended = Step(None, 0.0, True, {"error": message, **({"timeout": True} if kind == "timeout" else {})})
        self.guard.record(kind, message)
        return self.ended

    async def _bounded(self, what: str, call: Callable[[], Coroutine[Any, Any, T]]) -> tuple[T | None, Step | None]:
        timeout = self.guard.step_timeout_s
        try:
            t0 = time.monotonic()
            done, outcome = started(call())
            if done:  # it never gave the event loop a turn: no timer could have stopped it (module docstring)
                return outcome, None
            return await asyncio.wait_for(finish(outcome), max(0.0, timeout - (time.monotonic() - t0))), None
        except TimeoutError:
            return None, self.fail("timeout", f"{what} took more than env.step_timeout_s={timeout:g} s")
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - contained: this episode only
            return None, self.fail("error", f"{what} raised {describe(err)}")

    def _live(self) -> Episode:
        """The environment's episode, which an episode the guard did not end holds until `close`."""
        if self.inner is None:
            raise RuntimeError("a call on a closed episode: the rollout loop's bug")
        return self.inner

    async def reset(self) -> str:
        if self.ended is not None:
            return ""
        observation, ended = await self._bounded("reset", self._live().reset)
        if ended is not None:
            return ""
        problem = observation_problem(observation, self.guard.max_observation_chars, may_be_none=False)
        if problem is not None:
            self.fail("error", f"reset returned {problem}")
            return ""
        assert observation is not None  # observation_problem refused None (may_be_none=False)
        return observation

    async def step(self, action: str) -> Step:
        if self.ended is not None:
            return self.ended
        if self.done:
            raise RuntimeError("step() on an episode that has ended (done=True): the rollout loop's bug")
        step, ended = await self._bounded("step", lambda: self._live().step(action))
        if ended is not None:
            return ended
        problem = step_problem(step, self.guard.max_observation_chars, self.guard.max_abs)
        if problem is not None:
            return self.fail("error", f"step returned {problem}")
        assert step is not None  # step_problem refused anything but a Step
        self.done = step.done
        return step

    def fork(self) -> GuardedEpisode:
        """A guarded copy in the current state (an ended episode's copy is ended too, and not counted again).
        NotImplementedError (an environment that cannot fork) is raised: choosing it with a forking credit
        scheme is a config mistake that `needs` catches before the run."""
        if self.ended is not None:
            copy = GuardedEpisode(self.guard, None)
            copy.failure, copy.ended, copy.done = self.failure, self.ended, True
            return copy
        self.guard.failures.episodes += 1
        try:
            copy = GuardedEpisode(self.guard, self._live().fork())
        except (NotImplementedError, ConfigError):
            self.guard.failures.episodes -= 1
            raise
        except Exception as err:  # noqa: BLE001 - contained: the copy only
            copy = GuardedEpisode(self.guard, None)
            copy.fail("error", f"fork raised {describe(err)}")
            return copy
        copy.done = self.done
        return copy

    def legal_actions(self) -> list[str]:
        """The environment's legal actions in this state; [] for an ended episode or when listing them raises
        (the probe then has no alternatives: counted as an environment error)."""
        if self.ended is not None:
            return []
        try:
            return list(self._live().legal_actions())
        except (NotImplementedError, ConfigError):
            raise
        except Exception as err:  # noqa: BLE001 - contained: this probe only
            self.guard.record("error", f"legal_actions raised {describe(err)}")
            return []

    async def close(self) -> None:
        """Release the episode's environment (bounded; failures logged at debug level, not counted)."""
        if self.inner is None:
            return
        inner, self.inner = self.inner, None
        try:
            t0 = time.monotonic()
            done, rest = started(inner.close())
            if not done:
                await asyncio.wait_for(finish(rest), max(0.0, self.guard.step_timeout_s - (time.monotonic() - t0)))
        except Exception as err:  # noqa: BLE001 - cleanup of a finished episode
            log.debug("env %s: close raised %s", type(self.guard.env).__name__, describe(err))


def observation_problem(observation: Any, max_chars: int, may_be_none: bool) -> str | None:
    """What is wrong with an observation, or None."""
    if observation is None and may_be_none:
        return None
    if not isinstance(observation, str):
        return f"an observation of type {type(observation).__name__} (expected str)"
    if len(observation) > max_chars:
        return f"an observation of {len(observation)} characters (more than {max_chars})"
    return None


def step_problem(step: Any, max_chars: int, max_abs: float = MAX_ABS) -> str | None:
    """What is wrong with a `step` answer, or None."""
    if not isinstance(step, Step):
        return f"a {type(step).__name__} (expected rlvr.types.Step)"
    if not isinstance(step.done, bool):
        return f"done={step.done!r} (expected a bool)"
    problem = observation_problem(step.observation, max_chars, may_be_none=step.done)
    if problem is not None:
        return problem + ("" if step.observation is not None else " while the episode goes on (done=False)")
    if isinstance(step.reward, bool) or not ok(step.reward, max_abs):
        return f"reward={step.reward!r} (expected a finite number within ±trainer.reward_max_abs={max_abs:g})"
    if not isinstance(step.info, dict):
        return f"info of type {type(step.info).__name__} (expected a dict)"
    return None
