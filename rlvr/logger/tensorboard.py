"""`logger=tensorboard`: TensorBoard event files in the run folder (`<folder>/tensorboard/`, or logger.log_dir),
written by torch's SummaryWriter; `tensorboard --logdir <campaign folder>` shows each run by its folder.

    run      the text `run`: name `<condition>_s<seed>`, group `<condition>`, tags
    config   the text `config`: the composed config as JSON
    metrics  every row's numbers as scalars at the row's own `step`
    summary  at the end, summary.json's numbers as `summary/<key>` scalars at the run's last step, and the text
             `summary`
    resume   a resumed run appends a new event file to the same folder, from the step after the last row its
             metrics.jsonl kept (SummaryWriter's `purge_step`): what the earlier segment logged past its checkpoint
             is hidden, as the rows the trainer dropped, and every step shows once
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.logger.values import SummaryWatch, last_step, numbers
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra

TENSORBOARD_PACKAGE = Package("tensorboard", pip_extra("tensorboard"))
FOLDER = "tensorboard"


class TensorboardLogger:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(TENSORBOARD_PACKAGE,))

    def __init__(self, log_dir: str | None = None) -> None:
        self.log_dir = log_dir
        self.writer: Any = None
        self.folder: Path | None = None
        self.watch: SummaryWatch | None = None

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter  # only in the job, and only when this logger is chosen

        kept = last_step(folder)
        where = Path(self.log_dir) if self.log_dir else folder / FOLDER
        self.folder, self.watch = folder, SummaryWatch(folder)
        self.writer = SummaryWriter(log_dir=str(where), purge_step=0 if kept is None else kept + 1)
        self.writer.add_text("run", json.dumps({"name": name, "group": group, "tags": tags}), 0)
        self.writer.add_text("config", json.dumps(config, indent=1), 0)

    def log(self, row: dict) -> None:
        step = row.get("step")
        for k, v in numbers({k: v for k, v in row.items() if k != "step"}).items():
            self.writer.add_scalar(k, v, step if isinstance(step, int) else None)
        self.writer.flush()

    def update_summary(self, folder: Path, values: dict) -> None:
        """Add `values` (a campaign's squeeze result) to the finished run of `folder`, at its last step."""
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(Path(self.log_dir) if self.log_dir else folder / FOLDER)) as writer:
            for k, v in numbers(values).items():
                writer.add_scalar(k, v, last_step(folder) or 0)

    def finish(self) -> None:
        writer, self.writer = self.writer, None
        if writer is None or self.folder is None or self.watch is None:
            return
        summary = self.watch.written()
        if summary is not None:
            step = last_step(self.folder) or 0
            for k, v in summary.items():
                writer.add_scalar(f"summary/{k}", v, step)
            writer.add_text("summary", json.dumps(summary, indent=1), step)
        writer.close()
