"""A built-in task whose completions are long-tailed: `"7+03="` → `"777"`, the digit written that many times.

Most prompts ask for 1 or 2 copies; a fraction `long_fraction` asks for `long_min`..`long_max` (24..26 by default), so
a few completions are ten times the median (2.5 tokens with EOS against 25–27), as the long reasoning chains of a
math task are beside its short answers. A synchronous step waits for its longest completion: this task measures
what sampling ahead and partial rollouts save there (`python -m bench.overlap --tasks long_tail`).

Every prompt is 5 characters, so the built-in model's 32 positions hold the longest completion with its EOS when
`trainer.sampling.max_tokens` and `trainer.eval_max_tokens` are 27 (conf/data/repeat.yaml says so).

Prompts come from a fixed pool: every (digit, count) pair, the long ones weighted by repetition so that they make
`long_fraction` of the pool; the held-out set is `eval_size` prompts drawn the same way by `split_seed` (the same
for every run seed). Warm-up demonstrations write the right count with probability 1 − `miscount_fraction`, else one
copy too many or too few (the noisy supervisor that leaves RL something to fix, as the arithmetic task's carries).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from rlvr.data.order import batch_indices
from rlvr.protocols import Needs
from rlvr.types import Demonstration, Example

POOL = 2000
"""Prompts in the training pool (pairs repeat: there are only 10 × (2 + long counts) distinct ones)."""


def prompt(digit: int, count: int) -> str:
    return f"{digit}+{count:02d}="


@dataclass(frozen=True)
class Repeat:
    seed: int
    """Training-order seed (the run's data sub-seed; passed by the runner)."""
    long_fraction: float
    long_min: int
    long_max: int
    eval_size: int
    split_seed: int
    miscount_fraction: float

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __post_init__(self) -> None:
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"data.long_fraction={self.long_fraction} must be in [0, 1]")
        if not 3 <= self.long_min <= self.long_max <= 99:
            raise ValueError(f"data.long_min={self.long_min}, data.long_max={self.long_max}: expected "
                             "3 <= long_min <= long_max <= 99 (a count is two digits; 1 and 2 are the short ones)")
        if not 0.0 <= self.miscount_fraction <= 1.0:
            raise ValueError(f"data.miscount_fraction={self.miscount_fraction} must be in [0, 1]")
        if self.eval_size < 1:
            raise ValueError(f"data.eval_size={self.eval_size} must be at least 1")

    def _draw(self, rng: random.Random, n: int) -> list[tuple[int, int]]:
        """`n` (digit, count) pairs: a long count with probability `long_fraction`, else 1 or 2."""
        return [(rng.randrange(10), rng.randint(self.long_min, self.long_max) if rng.random() < self.long_fraction
                 else rng.randint(1, 2)) for _ in range(n)]

    @cached_property
    def _pairs(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        rng = random.Random(self.split_seed)
        return self._draw(rng, POOL), self._draw(rng, self.eval_size)

    def batch(self, step: int, size: int) -> list[Example]:
        train = self._pairs[0]
        return [Example(prompt(*train[i]), str(train[i][0]) * train[i][1])
                for i in batch_indices(step, size, len(train), self.seed)]

    def eval_examples(self) -> list[Example]:
        return [Example(prompt(d, n), str(d) * n) for d, n in self._pairs[1]]

    def demonstrations(self) -> list[Demonstration]:
        rng = random.Random(self.split_seed + 1)
        out = []
        for digit, count in self._pairs[0]:
            written = count + rng.choice((-1, 1)) if rng.random() < self.miscount_fraction and count > 1 else count
            out.append(Demonstration(prompt(digit, count), str(digit) * written))
        return out
