r"""`math`: the MATH competition problems (Hendrycks et al.), spec §8 "MATH source".

Rows come from a local `path` (.jsonl or .parquet with `problem` and `solution` columns) or, when
`path` is null, from the hub dataset `EleutherAI/hendrycks_math`, one config per subject, concatenated
in the order of `subjects` (the spec's order: intermediate_algebra, precalculus, number_theory,
counting_and_probability, geometry; algebra and prealgebra are left out, as in the predecessor).

- Prompt = `prompt_template.format(problem=<problem>)`; "{problem}" is the spec's raw problem text (no
  system prompt, no instruction to box the answer).
- Reference = `extract_boxed(solution)`. Rows whose reference is empty (a solution without
  `\boxed{...}`) are dropped and counted in one warning line. The predecessor kept them, and its `match`
  reward then paid 1.0 for not answering (spec §7 [verify]).
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
from pathlib import Path
from typing import Any

from rlvr.data.jsonl import check_template, held_out, read_jsonl
from rlvr.data.order import batch_indices
from rlvr.reward.boxed import extract_boxed
from rlvr.types import Demonstration, Example

log = logging.getLogger(__name__)

HUB_DATASET = "EleutherAI/hendrycks_math"
COLUMNS = ("problem", "solution")


def read_local(path: str, config_key: str) -> list[dict[str, Any]]:
    """`problem`/`solution` rows of a .jsonl or .parquet file, checked to be strings."""
    file = Path(path)
    if file.suffix == ".jsonl":
        numbered = read_jsonl(file, COLUMNS, config_key)
    elif file.suffix == ".parquet":
        if not file.is_file():
            raise FileNotFoundError(f"{config_key}={path!r}: no such file (expected a .parquet file)")
        import pyarrow.parquet as pq

        names = pq.read_schema(file).names
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise ValueError(
                f"{config_key}={path!r}: missing column(s) {missing}; expected {list(COLUMNS)}, found {names}"
            )
        numbered = list(enumerate(pq.read_table(file, columns=list(COLUMNS)).to_pylist(), start=1))
    else:
        raise ValueError(
            f"{config_key}={path!r}: expected a .jsonl or .parquet file with columns {list(COLUMNS)}"
        )
    for n, row in numbered:
        if not all(isinstance(row[c], str) for c in COLUMNS):
            unit = "line" if file.suffix == ".jsonl" else "row"
            raise ValueError(
                f"{config_key}={path!r} {unit} {n}: expected strings in {list(COLUMNS)}, got {row!r:.200}"
            )
    return [row for _, row in numbered]


def read_hub(subjects: list[str], split: str, config_key: str) -> list[dict[str, Any]]:
    """Rows of `HUB_DATASET` for each subject, in order; `config_key` is the null key that sent us here."""
    advice = f"or set {config_key} to a local .jsonl/.parquet file with columns {list(COLUMNS)}"
    try:
        import datasets
    except ImportError as e:
        raise RuntimeError(
            f"{config_key} is null, so MATH is read from the hub ({HUB_DATASET}), but the "
            f"`datasets` package is missing: install rlvr[hub] {advice}"
        ) from e
    rows = []
    for subject in subjects:
        try:
            table = datasets.load_dataset(HUB_DATASET, subject, split=split)
            rows.extend({c: r[c] for c in COLUMNS} for r in table)
        except Exception as e:  # offline, unknown subject/split, network: all end the same way
            raise RuntimeError(
                f"{config_key} is null, but loading {HUB_DATASET} subject={subject!r} "
                f"split={split!r} from the hub failed ({type(e).__name__}: {e}); fix the "
                f"subject/split, go online {advice}"
            ) from e
    return rows


class MATH:
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
    ) -> None:
        check_template(prompt_template, "problem")
        if max_examples < 0 or eval_size < 0:
            raise ValueError(
                f"data.max_examples={max_examples} and data.eval_size={eval_size} must be >= 0 (0 = all)"
            )
        if (path is None or eval_path is None) and not subjects:
            raise ValueError("data.subjects is empty, but a null data.path or data.eval_path reads it")
        self.seed = seed
        self.prompt_template = prompt_template
        if path is not None:
            train_rows, train_source = read_local(path, "data.path"), f"data.path={path!r}"
        else:
            train_rows, train_source = (
                read_hub(subjects, split, "data.path"),
                f"{HUB_DATASET} split={split!r}",
            )
        self._train = self._examples(train_rows, train_source)
        if max_examples:
            self._train = self._train[:max_examples]
        if eval_path is not None:
            eval_rows, eval_source = read_local(eval_path, "data.eval_path"), f"data.eval_path={eval_path!r}"
        else:
            eval_rows = read_hub(subjects, eval_split, "data.eval_path")
            eval_source = f"{HUB_DATASET} split={eval_split!r}"
        self._eval = held_out(self._examples(eval_rows, eval_source), eval_size)
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

    def batch(self, step: int, size: int) -> list[Example]:
        return [self._train[i] for i in batch_indices(step, size, len(self._train), self.seed)]

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def demonstrations(self) -> list[Demonstration]:
        return []
