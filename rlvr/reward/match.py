r"""`match`: exact string match of the last boxed answer (the predecessor's default reward).

Rule: reward 1.0 iff `extract_boxed(completion).strip() == reference.strip()`, else 0.0. No maths
normalisation: `\frac{1}{2}` does not match `0.5`, `\dfrac12` does not match `\frac{1}{2}`, and
`x = 3` does not match `3` (use `math` for that).

Deviation from the predecessor (docs/predecessor.md#rewards): there, an empty reference (a MATH solution without
`\boxed{`) gave 1.0 to every completion without a boxed answer, rewarding the policy for not answering.
Here an empty (or all-whitespace) reference never scores 1.0. The data sources drop such rows anyway.
A completion with no (or an empty) boxed answer counts as a parse failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.data.boxed import extract_boxed
from rlvr.protocols import Needs
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores


@dataclass(frozen=True)
class BoxedMatch:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def answer(self, completion: str) -> str | None:
        """The last boxed answer (None when there is none): what a sampled evaluation's maj@k votes on."""
        return extract_boxed(completion) or None

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        answers = [extract_boxed(comp) for comp in completions]
        return Scores(
            [1.0 if ref.strip() and answer == ref.strip() else 0.0 for answer, ref in zip(answers, references)],
            parse_failures=sum(not answer for answer in answers),
        )
