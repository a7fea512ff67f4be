"""`closeness`: a graded reward for a number, the CPU demo's problem for `trainer=discover` (the tiny model answers
in digits).

Rule: the stripped completion must be a non-negative integer written in digits (at most 18 of them); then

    reward = max(0, 1 − log10(1 + |x − t|) / scale)        t = int(reference), scale = `scale` (5)

1.0 at the target, and each digit of the distance costs 1/scale: with scale 5, a distance of 9 scores 0.8, of
99 0.6, of 999 0.4, of 99,999 or more 0. Every answer within reach is ranked, so an archive search can climb digit
by digit. Anything else (empty, "12+3", "=") scores 0.0 and counts as a parse failure. Example: t = 4729,
x = 4000 → 1 − log10(730)/5 = 1 − 2.863/5 = 0.427.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.protocols import Needs
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores

MAX_DIGITS = 18


@dataclass(frozen=True)
class Closeness:
    scale: float = 5.0
    """Digits of distance at which the reward reaches 0 (> 0)."""

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"reward.scale={self.scale} must be > 0")

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def answer(self, completion: str) -> str | None:
        """The number as written (None when the completion is not one)."""
        text = completion.strip()
        return text if text.isdigit() and text.isascii() and len(text) <= MAX_DIGITS else None

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        values, failures = [], 0
        for completion, reference in zip(completions, references):
            answer, target = self.answer(completion), int(reference)
            if answer is None:
                failures += 1
                values.append(0.0)
                continue
            values.append(max(0.0, 1.0 - math.log10(1 + abs(int(answer) - target)) / self.scale))
        return Scores(values, parse_failures=failures)
