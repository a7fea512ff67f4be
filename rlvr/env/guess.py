"""`env=guess`: a number-guessing game with higher/lower feedback, small enough for the tiny CPU model.

The episode's secret is an integer in [low, high] drawn from the seed alone (`random.Random(sub_seed(seed,
"guess"))`, rlvr/seeds.py), so the same seed replays the same game on every machine; the example is not read
(any data source drives the episode count, its prompts and references are ignored). The policy sees `prompt`,
answers a number, and after each wrong guess sees one feedback text, `higher` (the secret is above the guess)
or `lower` (below), then guesses again. The game has `max_turns` guesses.

    turn's action       answer
    the secret          Step(None, 1.0, done=True, {"solved": True, ...})       reward 1 on the solving turn
    a wrong number      Step(higher | lower, 0.0, done=False)                    before the last turn
                        Step(None, 0.0, done=True, {"solved": False, ...})      on the last turn
    not a number in     Step(None, 0.0, done=True, {"solved": False,            at once: a malformed action
    [low, high]              "invalid_action": True, ...})                       ends the game

An action is read after stripping surrounding whitespace: it must be ASCII digits only ("05" is 5). Every final
Step's info holds the secret and the turns used. The defaults (conf/env/guess.yaml) fit the tiny model's
alphabet "0123456789+=", which has no "-" and no letters: prompt "=", higher "+", lower "="; one episode of
three guesses is at most 1 + 3·2 + 2 = 9 tokens (prompt, then digit and EOS per action, feedback between), far
inside its 32 positions. With 0..9 and three guesses, guessing uniformly at random (feedback ignored) solves
1 − 0.9³ ≈ 0.27 of games, bisection (5, then 2 or 7, …) 7/10: what the feedback is worth.

`demonstrations(count, seed)` plays games by uniform random guesses (the feedback ignored, so a warm-up on
them teaches the format — a number, then EOS — and leaves using the feedback to RL), as transcripts
[prompt, action, observation, action, …]: the rollout loop's packer encodes them as it encodes played episodes.
Episodes fork (a copy of the secret and the turn count) and list their legal actions (every number of
[low, high]), so turn_credit=tl_grpo probes alternatives in either branch mode.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rlvr.protocols import Needs
from rlvr.seeds import sub_seed
from rlvr.types import Example, Step

NUMBER = re.compile(r"[0-9]{1,30}")  # ASCII digits; bounded, as int() of thousands of digits raises


@functools.lru_cache(maxsize=4096)
def _secret(seed: int, low: int, high: int) -> int:
    """The game of `seed`'s secret (a group's G episodes ask for it G times)."""
    return random.Random(sub_seed(seed, "guess")).randint(low, high)


@dataclass(frozen=True)
class GuessEnvironment:
    low: int
    high: int
    """The secret is drawn uniformly from low..high, both included."""
    max_turns: int
    """Guesses per game."""
    max_context_tokens: int
    step_timeout_s: float
    prompt: str
    higher: str
    """The feedback after a guess below the secret."""
    lower: str
    """The feedback after a guess above the secret."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"episodes", "fork", "legal_actions"}))

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"env.low={self.low}, env.high={self.high}: need 0 <= low <= high")
        if self.max_turns < 1:
            raise ValueError(f"env.max_turns={self.max_turns} must be >= 1")
        if self.max_context_tokens < 1 or not self.step_timeout_s > 0:
            raise ValueError(f"env.max_context_tokens={self.max_context_tokens} and env.step_timeout_s="
                             f"{self.step_timeout_s} must be > 0")
        if not self.prompt or self.higher == self.lower or not self.higher or not self.lower:
            raise ValueError(f"env.prompt={self.prompt!r} must not be empty, and env.higher={self.higher!r} and "
                             f"env.lower={self.lower!r} must be two different non-empty texts")

    def secret(self, seed: int) -> int:
        return _secret(seed, self.low, self.high)

    def episode(self, example: Example, seed: int) -> GuessEpisode:
        return GuessEpisode(self, self.secret(seed))

    def demonstrations(self, count: int, seed: int) -> list[list[str]]:
        """`count` games played by uniform random guesses, as [prompt, action, observation, action, …]."""
        rng = random.Random(sub_seed(seed, "guess/demonstrations"))
        games = []
        for _ in range(count):
            secret, turns = rng.randint(self.low, self.high), [self.prompt]
            for turn in range(1, self.max_turns + 1):
                guess = rng.randint(self.low, self.high)
                turns.append(str(guess))
                if guess == secret or turn == self.max_turns:
                    break
                turns.append(self.higher if guess < secret else self.lower)
            games.append(turns)
        return games


@dataclass
class GuessEpisode:
    game: GuessEnvironment
    secret: int
    turns: int = 0
    """Guesses made so far."""

    async def reset(self) -> str:
        self.turns = 0
        return self.game.prompt

    async def step(self, action: str) -> Step:
        self.turns += 1
        text = action.strip()
        guess = int(text) if NUMBER.fullmatch(text) else None
        final = {"secret": self.secret, "turns": self.turns}
        if guess is None or not self.game.low <= guess <= self.game.high:
            return Step(None, 0.0, True, {"solved": False, "invalid_action": True, **final})
        if guess == self.secret:
            return Step(None, 1.0, True, {"solved": True, **final})
        if self.turns >= self.game.max_turns:
            return Step(None, 0.0, True, {"solved": False, **final})
        return Step(self.game.higher if guess < self.secret else self.game.lower, 0.0, False, {})

    def fork(self) -> GuessEpisode:
        return replace(self)

    def legal_actions(self) -> list[str]:
        return [str(n) for n in range(self.game.low, self.game.high + 1)]

    async def close(self) -> None:
        return None
