"""A run folder's record of the commands that ran in it, written only once the run is accepted.

    .hydra/config.yaml, hydra.yaml, overrides.yaml   the command that started the run (Hydra's own files)
    resumes.jsonl                                    one line per later segment: its command, the step and
                                                     checkpoint it continued from, the keys it changed
    train.log                                        the log of every segment, appended

Hydra writes `.hydra/` and opens `train.log` before the job's first line runs, so a relaunch that rlvr then
refuses (another seed on a finished run's folder) would already have rewritten the record that `rlvr status`
and `rlvr compare` read. So conf/train.yaml turns Hydra's writing off (`hydra.output_subdir: null`, and
`hydra.job_logging`'s file handler is a `HeldFileHandler`, which keeps the log's lines in memory),
and `accept` writes the record once every check has passed: a fresh run gets `.hydra/` and the held lines in
`train.log`; a resumed run keeps its `.hydra/` as it was and appends a line to `resumes.jsonl`. A refused
command writes nothing (its held lines are dropped; the console had them).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlvr.outputs import RunLogFile

HYDRA_RECORD = ".hydra"
RESUMES = "resumes.jsonl"
MAX_HELD = 100_000
"""Lines a HeldFileHandler keeps before its folder is accepted (a check phase logs a few dozen)."""


class HeldFileHandler(logging.Handler):
    """A file handler that holds its records until `open_in` names the accepted folder (then appends them to
    `<folder>/<file name>` and every later one), or `drop` says the command was refused."""

    def __init__(self, filename: str, mode: str = "a", encoding: str | None = None, delay: bool = True,
                 owner: int | None = None) -> None:
        super().__init__()
        self.name_in_folder = Path(filename).name
        self._held: list[logging.LogRecord] | None = []
        self._file: logging.FileHandler | None = None
        self.owner = owner
        """A packed grid's cell (rlvr/pack/cells.py): the ident of its thread, whose records alone are its run's."""

    def emit(self, record: logging.LogRecord) -> None:
        if self.owner is not None and record.thread != self.owner:
            return
        if self._file is not None:
            self._file.emit(record)
        elif self._held is not None and len(self._held) < MAX_HELD:
            self._held.append(record)

    def open_in(self, folder: Path) -> None:
        self._file = RunLogFile(folder / self.name_in_folder, mode="a", encoding="utf-8")  # quiet on a full disk
        self._file.setFormatter(self.formatter)
        for record in self._held or ():
            self._file.emit(record)
        self._held = None

    def drop(self) -> None:
        self._held = None

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


def held_handlers() -> list[HeldFileHandler]:
    """This run's: in a packed grid, the handler of the cell whose thread asks."""
    me = threading.get_ident()
    return [h for h in logging.getLogger().handlers if isinstance(h, HeldFileHandler) and h.owner in (None, me)]


def drop_log() -> None:
    """The command was refused (or this rank writes no file): its held log lines go nowhere."""
    for handler in held_handlers():
        handler.drop()
        logging.getLogger().removeHandler(handler)
        handler.close()


def accept(folder: Path, cfg: DictConfig, resumed: dict | None) -> None:
    """The run is accepted in `folder`: write `.hydra/` (a fresh run) or a `resumes.jsonl` line (`resumed`: what
    the segment continues from and changes), then the held log lines. Needs Hydra's job context for `.hydra/`;
    a run started without Hydra (tests, rlvr.run.run(cfg, out_dir)) writes only the rest."""
    if resumed is None:
        write_hydra_record(folder, cfg)
    else:
        with open(folder / RESUMES, "a", encoding="utf-8") as f:
            f.write(json.dumps(segment(resumed), default=str) + "\n")
    for handler in held_handlers():
        handler.open_in(folder)


def write_hydra_record(folder: Path, cfg: DictConfig) -> None:
    """Hydra's three files, as its `run_job` writes them when `hydra.output_subdir` is set."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    record = folder / HYDRA_RECORD
    record.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, record / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), record / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(list(hydra_cfg.overrides.task)), record / "overrides.yaml")


def command_overrides() -> list[str]:
    """This command's overrides (Hydra's task overrides), [] outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def segment(resumed: dict) -> dict:
    """One `resumes.jsonl` line: when, where, which command, and what it continues from and changes."""
    return {"time": datetime.now(UTC).isoformat(timespec="seconds"), "host": socket.gethostname(),
            "pid": os.getpid(), "argv": sys.argv, "overrides": command_overrides(), **resumed}
