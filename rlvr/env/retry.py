"""`env=retry`: any data source and verifier of the single-turn task, played as "wrong, try again".

The episode's prompt is the example's prompt; each action is scored alone by the verifier against the example's
reference (`reward.score([action], [reference])`); the seed is not used (the example is the whole game).

    the action is          answer
    correct (score > 0.5)  Step(None, 1.0, done=True, {"solved": True, "turns": t})    reward 1 on the solving turn
    wrong, turns left      Step(wrong, 0.0, done=False, {})                            `wrong`: conf/env/retry.yaml
    wrong, last turn       Step(None, 0.0, done=True, {"solved": False, "turns": t})

"Correct" is the Reward protocol's (rlvr/protocols.py): a score above 0.5; a partial score does not carry over.
When the verifier counted the action as a timeout, an error or a parse failure (`Scores`), the Step's info says
so (`"verifier": "timeout" | "error" | "parse_failure"`); the action is then simply wrong. A verifier that raises
ends the episode as an environment error (rlvr/env/guarded.py).

`reward` is the run's own verifier: conf/env/retry.yaml sets it to `${reward}`, so Hydra builds a second instance
from the `reward` group's choice (the rollout loop may pass the run's built one instead: `instantiate(cfg.env,
reward=components.reward)`). Verifier calls run off the event loop, on the episode's `SyncCalls` thread (a
`reward=function` verifier runs its own event loop; math-verify's grading pool is called from any thread), one at a
time across all the environment's episodes, since a verifier takes one call at a time (rlvr/reward/pool.py). So the
episodes of one turn are scored one after another, not as one batch: slower than single-turn scoring for a
verifier with a worker pool. A verifier that hangs holding that turn stalls the other episodes until each times
out; rlvr's verifiers bound their own calls.
Episodes fork (the example and the turn count are copied; the verifier is shared).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlvr.env.guarded import SyncCalls
from rlvr.protocols import Component, Needs, Reward
from rlvr.types import Example, Scores, Step


class RetryEnvironment:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """Fork, and what the wrapped verifier needs of the machine (its `needs`, from `env.reward`'s values)."""
        from hydra.utils import get_class

        reward = dict(settings["reward"])
        verifier: type[Component] = get_class(reward.pop("_target_"))  # every component has `needs`
        own = verifier.needs(reward)
        return Needs(provides=frozenset({"episodes", "fork"}), machine=own.machine)

    def __init__(self, reward: Reward, max_turns: int, max_context_tokens: int, step_timeout_s: float,
                 wrong: str) -> None:
        if max_turns < 1:
            raise ValueError(f"env.max_turns={max_turns} must be >= 1")
        if max_context_tokens < 1 or not step_timeout_s > 0:
            raise ValueError(f"env.max_context_tokens={max_context_tokens} and env.step_timeout_s={step_timeout_s} "
                             "must be > 0")
        if not wrong:
            raise ValueError("env.wrong must not be empty: the policy needs something to answer after")
        self.reward = reward
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.step_timeout_s = step_timeout_s
        self.wrong = wrong
        self.one_call_at_a_time = threading.Lock()

    def score(self, action: str, reference: str) -> Scores:
        with self.one_call_at_a_time:
            return self.reward.score([action], [reference])

    def episode(self, example: Example, seed: int) -> RetryEpisode:
        return RetryEpisode(self, example)


@dataclass
class RetryEpisode:
    env: RetryEnvironment
    example: Example
    turns: int = 0
    calls: SyncCalls = field(default_factory=lambda: SyncCalls("rlvr-env-retry"))

    async def reset(self) -> str:
        self.turns = 0
        return self.example.prompt

    async def step(self, action: str) -> Step:
        scores = await self.calls(self.env.score, action, self.example.reference)
        self.turns += 1
        if len(scores.values) != 1:
            raise ValueError(f"the verifier returned {len(scores.values)} scores for one completion")
        counted = [kind for kind, n in (("timeout", scores.timeouts), ("error", scores.errors),
                                        ("parse_failure", scores.parse_failures)) if n]
        verdict = {"verifier": counted[0]} if counted else {}
        if scores.values[0] > 0.5:
            return Step(None, 1.0, True, {"solved": True, "turns": self.turns, **verdict})
        if self.turns >= self.env.max_turns:
            return Step(None, 0.0, True, {"solved": False, "turns": self.turns, **verdict})
        return Step(self.env.wrong, 0.0, False, verdict)

    def fork(self) -> RetryEpisode:
        return RetryEpisode(self.env, self.example, self.turns)

    async def close(self) -> None:
        self.calls.stop()
