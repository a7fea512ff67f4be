"""`reasoning_gym`: a completion scored by its reasoning-gym task's own `score_answer(answer, entry)`, for
`data=reasoning_gym` (whose references name each example's entry: rlvr/data/reasoning_gym.py, `EntryKey`).

The answer handed to `score_answer` (reasoning-gym scores a bare answer), by `extract`:
- `tag`: the last `<answer>…</answer>` of the completion, stripped, by reasoning-gym's own
  `utils.extract_answer` (the convention of its system prompts; ask for it in `data.prompt_template`).
  No tag, or an empty one, is a parse failure.
- `completion`: the whole completion, stripped (a model that answers with the bare answer, as the tiny
  model does). An empty completion is a parse failure.

Reward = `score_answer`'s value, as reasoning-gym defines it per task, partial credit included: many tasks
(`basic_arithmetic`, `chain_sum`, the base class) pay len(answer)/len(given) when the right answer is a
substring of what was given, so "1820" for 182 scores 3/4 = 0.75, which the trainer's correct rate
(reward > 0.5) counts as right. A parse failure scores 0.0 without calling `score_answer`.

A reference that is not an entry key (a reference typed into `rlvr sample`), an entry regenerated with
another answer than the key records (generation that differs in this process: see the data module on
PYTHONHASHSEED), a `score_answer` that raises or returns something that is not a finite number: 0.0,
counted as an error (the first of a batch is logged). `score_answer` runs in this process with no time
bound: reasoning-gym's scorers are plain Python on the extracted answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.data.reasoning_gym import CAPABILITY, PACKAGE, EntryKey
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores

rg_utils = lazy_import("reasoning_gym.utils")
log = logging.getLogger("rlvr")

EXTRACTS = ("tag", "completion")


@dataclass(frozen=True)
class ReasoningGymScore:
    extract: str
    """`tag` (the last <answer>…</answer>) or `completion` (the whole completion)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(requires={CAPABILITY: "reward=reasoning_gym scores with the task's own score_answer, which reads "
                                           "each example's entry"}, machine=(PACKAGE,))

    def __post_init__(self) -> None:
        if self.extract not in EXTRACTS:
            raise ValueError(f"reward.extract={self.extract!r}: expected {' or '.join(EXTRACTS)}")

    def answer(self, completion: str) -> str | None:
        """What `score_answer` is given; None = nothing to parse."""
        found = rg_utils.extract_answer(completion) if self.extract == "tag" else completion.strip()
        return found or None

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        values, errors, parse_failures, first_error = [], 0, 0, None
        for completion, reference in zip(completions, references):
            answer = self.answer(completion)
            try:
                value = self._score(answer, reference)
            except Exception as err:  # noqa: BLE001 - any grading failure scores 0.0 and is counted
                values.append(0.0)
                errors += 1
                first_error = first_error or f"{type(err).__name__}: {err}"
                continue
            values.append(value)
            parse_failures += answer is None
        if first_error:
            log.warning("reward=reasoning_gym: %d of %d completions could not be graded, scored 0.0; the first: %s",
                        errors, len(values), first_error)
        return Scores(values, errors=errors, parse_failures=parse_failures)

    def _score(self, answer: str | None, reference: str) -> float:
        key = EntryKey.parse(reference)
        entry = key.entry()
        if entry["answer"] != key.answer:
            raise ValueError(f"{key.task} entry {key.index} of seed {key.seed} regenerated with answer "
                             f"{entry['answer']!r}, not {key.answer!r}")
        if answer is None:
            return 0.0
        value = float(key.dataset().score_answer(answer, entry))
        if not math.isfinite(value):
            raise ValueError(f"{key.task}'s score_answer returned {value}")
        return value
