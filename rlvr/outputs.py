"""The run folder: everything a reader needs, as plain files.

    metrics.jsonl       one row per RL step (names as spec §13.2) and one row per evaluation
                        (`step` = optimizer steps completed, plus `eval/accuracy`)
    warmup.jsonl        the SFT warm-up's rows (or one row naming the cache entry it came from)
    samples/step_N.jsonl  a few groups per step: prompt, reference, completions, rewards, advantages
    checkpoints/step_N/   weights (safetensors) + optimizer.pt + trainer_state.json; N = steps completed
    summary.json        final figures
    train.log, .hydra/  written by Hydra

Every file is written whole or appended line by line; checkpoints are written under a temporary name
and renamed, so a killed run leaves either a complete checkpoint or none.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NONDETERMINISTIC_KEYS = frozenset(
    {
        "step_time_s", "sample_time_s", "score_time_s", "advantage_time_s", "train_time_s", "eval_time_s",
        "tokens_per_second", "sample_share", "train_share", "process_max_rss_mb", "local_train_wall_s",
    }
)
"""Fields that measure the machine rather than the run: the only ones that may differ between two runs
with the same seed on CPU."""


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible instead of crashing the writer
    return value


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        (self.path / "samples").mkdir(parents=True, exist_ok=True)
        (self.path / "checkpoints").mkdir(exist_ok=True)

    def append(self, name: str, row: dict) -> None:
        with open(self.path / name, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def write_samples(self, step: int, records: list[dict]) -> None:
        with open(self.path / "samples" / f"step_{step:06d}.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def write_json(self, name: str, data: dict) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path / name)

    @contextmanager
    def checkpoint(self, steps_done: int) -> Iterator[Path]:
        final = self.path / "checkpoints" / f"step_{steps_done}"
        tmp = final.with_name(f".{final.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        yield tmp
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
