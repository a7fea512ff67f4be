"""The run folder: everything a reader needs, as plain files.

    metrics.jsonl       one row per RL step (names and meanings: docs/metrics.md) and one per evaluation
                        (`step` = optimizer steps completed, plus `eval/accuracy`)
    warmup.jsonl        the SFT warm-up's rows (or one row naming the cache entry it came from)
    samples/step_N.jsonl  a few groups per step: prompt, reference, completions, rewards, advantages
    checkpoints/step_N/   weights (safetensors), optimizer.pt, rng.pt, trainer_state.json; N = steps
                        completed; `checkpoints/latest` names the newest (rlvr/checkpoint.py)
    summary.json        final figures
    status.json         running | finished | failed | preempted, with the reason, host, pid, SLURM ids, config id
    train.log, .hydra/  written by Hydra

Every file is written whole or appended line by line.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlvr.distributed import World

NONDETERMINISTIC_KEYS = frozenset(
    {
        "step_time_s", "sample_time_s", "score_time_s", "advantage_time_s", "train_time_s", "eval_time_s",
        "tokens_per_second", "sample_share", "train_share", "process_max_rss_mb", "gpu_max_allocated_mb",
        "local_train_wall_s",
        "env/step_time_s", "env/probe_time_s", "engine/sync_s",
        "async/trainer_idle_frac", "async/sampler_idle_frac", "distill/teacher_seconds", "self_distill/teacher_seconds",
    }
)
"""Fields that measure the machine rather than the run: the only ones that may differ between two runs
with the same seed on CPU."""


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible instead of crashing the writer
    return value


class RunDir:
    """The run folder as rank 0 (the one process of a plain run) writes it; `RunDir.of` gives the other ranks of a
    distributed run an `UnwrittenRunDir`."""

    writes = True

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        (self.path / "samples").mkdir(parents=True, exist_ok=True)
        (self.path / "checkpoints").mkdir(exist_ok=True)

    @staticmethod
    def of(path: Path, world: World) -> RunDir:
        """The folder as this process holds it: rank 0 writes it, the others only read it."""
        return RunDir(path) if world.is_main else UnwrittenRunDir(path)

    def append(self, name: str, row: dict) -> None:
        with open(self.path / name, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def write_samples(self, step: int, records: list[dict]) -> None:
        with open(self.path / "samples" / f"step_{step:06d}.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def write_status(self, state: str, max_steps: int, reason: str | None = None, config_id: str | None = None,
                     pack: str | None = None) -> None:
        """What readers (`rlvr status`) show for this run; rewritten at start, end, failure, preemption.
        `config_id` (rlvr/resume.py) lets the same command find this run again to continue it; `pack`, in a packed
        grid (rlvr/pack/), which pack the run is a cell of."""
        self.write_json("status.json", {
            "state": state,
            "max_steps": max_steps,
            "reason": reason,
            "config_id": config_id,
            "updated": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
            **({"pack": pack} if pack is not None else {}),
        })

    def write_json(self, name: str, data: dict) -> None:
        """Whole: a temporary file, renamed over the old one. On a full disk, where the temporary file gets no block,
        an existing file is rewritten in place, in the blocks it holds: so status.json of a run that a full disk
        stopped says `failed`, not `running` (not atomic, but a torn write is no worse than a stale state)."""
        text, target, tmp = json.dumps(data, indent=2) + "\n", self.path / name, self.path / f".{name}.tmp"
        try:
            tmp.write_text(text)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if err.errno not in DISK_FULL_ERRNOS or not target.is_file():
                raise
            with open(target, "r+") as f:
                f.write(text)
                f.truncate()
            return
        os.replace(tmp, target)

    def truncate(self, steps_done: int, keep_initial_eval: bool = True) -> None:
        """Cut the folder back to a checkpoint taken after `steps_done` steps: training rows of later
        steps, evaluation rows after it, a half-written last line and later samples go; so a resumed run
        never logs a step twice. `truncate(0, keep_initial_eval=False)` empties it for a fresh start."""
        metrics = self.path / "metrics.jsonl"
        kept = []
        if metrics.exists():
            for line in metrics.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # the line a kill cut short
                is_eval = "eval/accuracy" in row
                last_eval = steps_done if keep_initial_eval else steps_done - 1
                if (is_eval and row["step"] <= last_eval) or (not is_eval and row["step"] < steps_done):
                    kept.append(line)
            tmp = self.path / ".metrics.jsonl.tmp"
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, metrics)
        for sample in (self.path / "samples").glob("step_*.jsonl"):
            if int(sample.stem.split("_")[1]) >= steps_done:
                sample.unlink()


class UnwrittenRunDir(RunDir):
    """The run folder as a rank other than 0 holds it: it reads the folder and writes nothing (rank 0 writes it;
    the other ranks only their shards of each checkpoint, rlvr/checkpoint.py)."""

    writes = False

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, name: str, row: dict) -> None:
        pass

    def write_samples(self, step: int, records: list[dict]) -> None:
        pass

    def write_json(self, name: str, data: dict) -> None:
        pass

    def truncate(self, steps_done: int, keep_initial_eval: bool = True) -> None:
        pass


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")
"""A full disk as libraries that do not raise an OSError word it (safetensors: "I/O error: No space left on device
(os error 28)")."""
NEARLY_FULL_BYTES = 1 << 20
"""Less left than this when a write failed: the disk is full (torch.save's C++ writer says only "unexpected pos")."""


class RunLogFile(logging.FileHandler):
    """train.log in the run folder. A line the full disk refuses is dropped, without logging's "--- Logging error
    ---" and traceback on stderr for each line: the console has the line, and the run's next write of its record
    (every step writes one) stops it with the one full-disk message (rlvr/run.py)."""

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not (isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS):
            super().handleError(record)

    def close(self) -> None:
        """Closed all the same when the full disk refuses the last buffered lines."""
        try:
            super().close()
        except OSError as err:
            if err.errno not in DISK_FULL_ERRNOS:
                raise


def disk_full(err: BaseException, folder: Path) -> bool:
    """Whether `err`, or an exception it was raised from or while handling, is a write that found the disk full:
    an OSError ENOSPC/EDQUOT, a library's words for one, or any failure while `folder`'s disk has less than
    NEARLY_FULL_BYTES left. One test for every file the run writes (metrics, samples, status, base/, checkpoints),
    so that a full disk is one message wherever it strikes (rlvr/run.py)."""
    seen: set[int] = set()
    chain: BaseException | None = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, OSError) and chain.errno in DISK_FULL_ERRNOS:
            return True
        if any(word in str(chain) for word in DISK_FULL_WORDS):
            return True
        chain = chain.__cause__ or chain.__context__
    return free_bytes(folder) < NEARLY_FULL_BYTES


def free_bytes(folder: Path) -> int:
    """Bytes left to this user on `folder`'s disk (its nearest existing parent's); a very large number when unknown."""
    for path in (Path(folder), *Path(folder).parents):
        try:
            return shutil.disk_usage(path).free
        except OSError:
            continue
    return 1 << 62


def disk_full_message(folder: Path, err: BaseException) -> str:
    """The one message for a run stopped by a full disk: the folder, what is left, the write that failed, the fix."""
    free = free_bytes(folder)
    return (f"the disk holding the run folder {folder} is full ({free / 2**20:.1f} MiB free): "
            f"{type(err).__name__}: {err}. Free some space there, then start the same command again: it continues "
            "from the last checkpoint (or move the folder to another disk and name it with hydra.run.dir=)")
