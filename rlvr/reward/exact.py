"""`exact`: the whole completion is the answer (the built-in arithmetic task, whose completions are
just a number).

Rule: reward 1.0 iff `completion.strip() == reference.strip()`, else 0.0. No normalisation beyond
stripping surrounding whitespace: "42.0" does not match "42", and "42." does not either.

Edge case (deliberate): an empty (or all-whitespace) reference never scores 1.0, so an empty completion
cannot be rewarded for matching a missing answer (the same choice as `match`). An empty completion counts
as a parse failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.protocols import Needs
from rlvr.types import Scores


@dataclass(frozen=True)
class ExactMatch:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def answer(self, completion: str) -> str | None:
        """The stripped completion (None when empty): the answer a sampled evaluation's maj@k votes on."""
        return completion.strip() or None

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        return Scores(
            [1.0 if ref.strip() and comp.strip() == ref.strip() else 0.0 for comp, ref in zip(completions, references)],
            parse_failures=sum(not comp.strip() for comp in completions),
        )


def check_pairs(completions: Sequence[str], references: Sequence[str]) -> None:
    if len(completions) != len(references):
        raise ValueError(f"{len(completions)} completions but {len(references)} references; they must pair up")
