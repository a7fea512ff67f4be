"""`logger=none`: the run folder is the only record (metrics.jsonl and friends)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.protocols import Needs


class NoLogger:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        pass

    def log(self, row: dict) -> None:
        pass

    def update_summary(self, folder: Path, values: dict) -> None:
        pass

    def finish(self) -> None:
        pass
