r"""`math`: the MATH competition problems (Hendrycks et al.), as the predecessor read them (docs/predecessor.md#data).

Rows come from a local `path` (.jsonl or .parquet with `problem` and `solution` columns) or, when
`path` is null, from the hub dataset `EleutherAI/hendrycks_math`, one config per subject, concatenated
in the order of `subjects` (the predecessor's order: intermediate_algebra, precalculus, number_theory,
counting_and_probability, geometry; algebra and prealgebra are left out, as in the predecessor).

- Prompt = `prompt_template.format(problem=<problem>)`; "{problem}" is the predecessor's raw problem text
  (no system prompt, no instruction to box the answer).
- Reference = `extract_boxed(solution)`. Rows whose reference is empty (a solution without
  `\boxed{...}`) are dropped and counted in one warning line. The predecessor kept them, and its `match`
  reward then paid 1.0 for not answering.
- `max_examples > 0` keeps the first N kept rows in source order (0 = all).
- Training order: `rlvr.data.order.batch_indices(step, size, N, seed)`.
- Held-out set: `rlvr.data.jsonl.held_out(<kept rows of the eval source>, eval_size)`, the same fixed
  subset for every seed. The eval source is `eval_path`, or with `eval_path: null` the hub dataset's
  `eval_split` for the same subjects.

Everything is read at construction, so a bad file or a missing dataset fails before any model loads,
with a message naming the config key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rlvr.data.boxed import extract_boxed
from rlvr.data.jsonl import check_template, held_out, read_demonstrations
from rlvr.data.order import ExampleList
from rlvr.data.tables import read_hub, read_local, table_needs
from rlvr.protocols import Needs
from rlvr.types import Example

log = logging.getLogger(__name__)

HUB_DATASET = "EleutherAI/hendrycks_math"
COLUMNS = ("problem", "solution")


class MATH(ExampleList):
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return table_needs(settings)

    def __init__(
        self,
        seed: int,
        path: str | None,
        subjects: list[str],
        split: str,
        max_examples: int,
        eval_path: str | None,
        eval_split: str,
        eval_size: int,
        prompt_template: str,
        shuffle: bool,
        demonstrations_path: str | None = None,
    ) -> None:
        check_template(prompt_template, "problem")
        if max_examples < 0 or eval_size < 0:
            raise ValueError(
                f"data.max_examples={max_examples} and data.eval_size={eval_size} must be >= 0 (0 = all)"
            )
        if (path is None or eval_path is None) and not subjects:
            raise ValueError("data.subjects is empty, but a null data.path or data.eval_path reads it")
        self.seed, self.shuffle = seed, shuffle
        self.prompt_template = prompt_template
        if path is not None:
            train_rows, train_source = read_local(path, COLUMNS, "data.path"), f"data.path={path!r}"
        else:
            train_rows, train_source = (
                read_hub(HUB_DATASET, subjects, split, COLUMNS, "data.path"),
                f"{HUB_DATASET} split={split!r}",
            )
        self._train = self._examples(train_rows, train_source)
        if max_examples:
            self._train = self._train[:max_examples]
        if eval_path is not None:
            eval_rows = read_local(eval_path, COLUMNS, "data.eval_path")
            eval_source = f"data.eval_path={eval_path!r}"
        else:
            eval_rows = read_hub(HUB_DATASET, subjects, eval_split, COLUMNS, "data.eval_path")
            eval_source = f"{HUB_DATASET} split={eval_split!r}"
        self._eval = held_out(self._examples(eval_rows, eval_source), eval_size, eval_source)
        self._demos = read_demonstrations(demonstrations_path, prompt_template, "problem")
        for examples, source in ((self._train, train_source), (self._eval, eval_source)):
            if not examples:
                raise ValueError(f"{source}: no rows with a \\boxed{{}} answer in `solution`")

    def _examples(self, rows: list[dict[str, Any]], source: str) -> list[Example]:
        examples = [
            Example(self.prompt_template.format(problem=row["problem"]), extract_boxed(row["solution"]))
            for row in rows
        ]
        kept = [e for e in examples if e.reference]
        if len(kept) < len(examples):
            log.warning(
                "%s: dropped %d of %d rows whose solution has no \\boxed{} answer",
                source,
                len(examples) - len(kept),
                len(examples),
            )
        return kept
