"""`logger=none`: the run folder is the only record (metrics.jsonl and friends)."""

from __future__ import annotations

from pathlib import Path


class NoLogger:
    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        pass

    def log(self, row: dict) -> None:
        pass

    def finish(self) -> None:
        pass
