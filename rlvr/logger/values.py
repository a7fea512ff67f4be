"""What the trackers besides wandb log, read the same way by each: a row's numbers, the composed config flattened
to `a.b.c` keys, and the run's summary.json when this run wrote it.

The trainer writes summary.json at the end of a run, before it finishes the logger (rlvr/trainer.py: fit), so a
tracker's `finish` reads it there; a summary.json left by an earlier segment of the run (a resumed run that stops
before its end) is not this segment's, and is told apart by its modification time."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SUMMARY = "summary.json"


def numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's finite numbers (booleans as 0/1), as logger=wandb logs them; text (the condition) and None left out."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and (not isinstance(v, float) or math.isfinite(v))}


def flat(node: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(`a.b.c`, leaf) for every leaf of nested mappings; a list is one leaf."""
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from flat(value, f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        yield prefix, node


def text(value: object) -> str:
    """A leaf as a parameter's text: strings as they are, the rest as JSON (null, true, [1, 2])."""
    return value if isinstance(value, str) else json.dumps(value)


class SummaryWatch:
    """The run folder's summary.json, when written after `start`."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / SUMMARY
        self.before = self._stamp()

    def _stamp(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def written(self) -> dict[str, float] | None:
        """summary.json's numbers flattened (`warmup.seconds`), or None when this run did not write it."""
        stamp = self._stamp()
        if stamp is None or stamp == self.before:
            return None
        summary = json.loads(self.path.read_text())
        return numbers(dict(flat(summary)))


def last_step(folder: Path) -> int | None:
    """The largest `step` in the run folder's metrics.jsonl (the rows a resumed run keeps), or None without rows."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return None
    steps = [json.loads(line).get("step") for line in path.read_text().splitlines() if line.strip()]
    found = [s for s in steps if isinstance(s, int)]
    return max(found) if found else None
