"""The built-in verifiable task: two-digit addition, `"aa+bb="` → `str(a+b)`.

Operands run over 0..10^digits−1, zero-padded, so every prompt has the same length. All pairs are split
once, by the fixed `split_seed`, into `held_out` pairs set aside and the training pairs; evaluation reads the
first `eval_size` of the held-out pairs. The split is therefore the same for every run seed, and a smaller
`eval_size` (a quicker evaluation) changes neither the training pairs nor the warm-up demonstrations, so the
warm-up cached for one evaluation size serves every other.

Warm-up demonstrations come from a deliberately noisy supervisor: a fraction `carryless_fraction` of
them is labelled with the digit-wise sum without carries (47+38 → "75"), the rest with the true sum. The
warmed-up policy then answers no-carry problems well and samples the right carry only some of the time,
which is the regime where RL with the exact-answer verifier visibly lifts held-out accuracy within a few
hundred steps on a CPU (in the prototype, mean held-out greedy accuracy of 3 seeds went 0.39 → 0.87 in
300 GRPO steps; docs/cpu-recipe.md#design-b).
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


def carryless_sum(a: int, b: int, digits: int) -> int:
    """Digit-wise (a_i + b_i) mod 10: 47+38 → 75, 99+99 → 88."""
    out = 0
    for i in range(digits):
        out += ((a // 10**i + b // 10**i) % 10) * 10**i
    return out


@dataclass(frozen=True)
class Arithmetic:
    seed: int
    """Training-order seed (the run's data sub-seed; passed by the runner)."""
    digits: int
    eval_size: int
    """Held-out pairs evaluated: the first `eval_size` of the `held_out` set aside."""
    split_seed: int
    carryless_fraction: float
    held_out: int = 1000
    """Pairs set aside from training and from the warm-up."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __post_init__(self) -> None:
        total = 10 ** (2 * self.digits)
        if not 0 < self.held_out < total:
            raise ValueError(f"data.held_out={self.held_out} must be in (0, {total}) for digits={self.digits}")
        if not 0 < self.eval_size <= self.held_out:
            raise ValueError(f"data.eval_size={self.eval_size} must be in [1, data.held_out={self.held_out}]")
        if not 0.0 <= self.carryless_fraction <= 1.0:
            raise ValueError(f"data.carryless_fraction={self.carryless_fraction} must be in [0, 1]")

    def _example(self, a: int, b: int) -> Example:
        return Example(prompt=f"{a:0{self.digits}d}+{b:0{self.digits}d}=", reference=str(a + b))

    @cached_property
    def _pairs(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        n = 10**self.digits
        pairs = [(a, b) for a in range(n) for b in range(n)]
        random.Random(self.split_seed).shuffle(pairs)
        return pairs[self.held_out :], pairs[: self.eval_size]

    def batch(self, step: int, size: int) -> list[Example]:
        train = self._pairs[0]
        return [self._example(*train[i]) for i in batch_indices(step, size, len(train), self.seed)]

    def eval_examples(self) -> list[Example]:
        return [self._example(a, b) for a, b in self._pairs[1]]

    def demonstrations(self) -> list[Demonstration]:
        return list(self._demonstrations)

    @cached_property
    def _demonstrations(self) -> tuple[Demonstration, ...]:
        """Made once: a run asks twice (its build checks there are some, its warm-up reads them), and they take
        ~50 ms."""
        rng = random.Random(self.split_seed + 1)
        out = []
        for a, b in self._pairs[0]:
            label = carryless_sum(a, b, self.digits) if rng.random() < self.carryless_fraction else a + b
            out.append(Demonstration(prompt=f"{a:0{self.digits}d}+{b:0{self.digits}d}=", completion=str(label)))
        return tuple(out)
