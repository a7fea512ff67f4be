r"""`gsm8k`: grade-school math word problems (Cobbe et al. 2021, arXiv 2110.14168), hub `openai/gsm8k`
config `main` (7,473 train / 1,319 test rows).

Rows have `question` and `answer`; the answer's last line is `#### <number>`. Reference = that number
with thousands separators and surrounding spaces removed ("#### 1,234" → "1234"); a row without a
`####` line is dropped (counted in one warning). Prompt = `prompt_template.format(question=…)`; the
YAML's template asks for the answer in `\boxed{}` so `reward=math` or `reward=match` can grade it.

Sources: a local `.jsonl`/`.parquet` file with `question` and `answer` columns (`data.path`,
`data.eval_path`), or with null paths the hub's `split` and `eval_split`. Order and held-out set as for
every source: `rlvr.data.order.batch_indices` (seeded shuffle, or `shuffle: false` for file order) and a
fixed-seed held-out sample of `eval_size` rows, the same for every run seed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rlvr.data.jsonl import check_template, held_out, read_demonstrations
from rlvr.data.order import ExampleList
from rlvr.data.tables import read_hub, read_local, table_needs
from rlvr.protocols import Needs
from rlvr.types import Example

log = logging.getLogger(__name__)

HUB_DATASET = "openai/gsm8k"
COLUMNS = ("question", "answer")


def final_answer(answer: str) -> str:
    """The number after the last `####` ("" when there is none): "…\n#### 1,234" → "1234"."""
    _, marker, tail = answer.rpartition("####")
    return tail.strip().replace(",", "") if marker else ""


class GSM8K(ExampleList):
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return table_needs(settings)

    def __init__(
        self,
        seed: int,
        path: str | None,
        split: str,
        eval_path: str | None,
        eval_split: str,
        eval_size: int,
        max_examples: int,
        prompt_template: str,
        shuffle: bool,
        demonstrations_path: str | None = None,
    ) -> None:
        check_template(prompt_template, "question")
        if max_examples < 0 or eval_size < 0:
            raise ValueError(f"data.max_examples={max_examples} and data.eval_size={eval_size} must be >= 0 (0 = all)")
        self.seed, self.shuffle, self.prompt_template = seed, shuffle, prompt_template
        self._train = self._load(path, split, "data.path")
        if max_examples:
            self._train = self._train[:max_examples]
        self._eval = held_out(self._load(eval_path, eval_split, "data.eval_path"), eval_size,
                              source(eval_path, eval_split, "data.eval_path"))
        self._demos = read_demonstrations(demonstrations_path, prompt_template, "question")

    def _load(self, path: str | None, split: str, key: str) -> list[Example]:
        rows = read_local(path, COLUMNS, key) if path is not None else read_hub(HUB_DATASET, ["main"], split,
                                                                                COLUMNS, key)
        where = source(path, split, key)
        examples = [
            Example(self.prompt_template.format(question=r["question"]), final_answer(r["answer"])) for r in rows
        ]
        kept = [e for e in examples if e.reference]
        if len(kept) < len(examples):
            log.warning("%s: dropped %d of %d rows without a '#### <answer>' line", where,
                        len(examples) - len(kept), len(examples))
        if not kept:
            raise ValueError(f"{where}: no rows with a '#### <answer>' line in `answer`")
        return kept


def source(path: str | None, split: str, key: str) -> str:
    """Where rows come from, for messages: the local file, or the hub's split."""
    return f"{key}={path!r}" if path is not None else f"{HUB_DATASET} split={split!r}"
