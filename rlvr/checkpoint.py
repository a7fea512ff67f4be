"""Checkpoints that survive being killed at any instant.

A checkpoint is a folder `checkpoints/step_N/` (N = optimizer steps done) holding the weights (adapter or
full, safetensors), `optimizer.pt`, `rng.pt` (python, numpy, torch and CUDA generator states) and
`trainer_state.json` (counters, evaluation history, controller state, the composed config and its hash),
written last. Writing goes:

    checkpoints/.step_N.tmp/  ← every file, each fsynced
    rename → checkpoints/step_N/, fsync checkpoints/
    checkpoints/latest        ← "step_N" (temporary file, fsync, rename): updated last
    prune: keep the `keep_last` newest step_N plus the final one

so a kill at any point leaves `latest` naming a complete checkpoint (or none yet). Reading trusts
`latest` when it names a folder holding `trainer_state.json`, and otherwise takes the newest such folder.
A failed write (full disk, lost mount; an OSError or a library's own error, safetensors' or torch.save's)
removes the temporary folder and raises `CheckpointError`, which says "No space left on device" for a full disk
however the library worded it (rlvr/outputs.py `disk_full`); the previous checkpoint is untouched. In a
distributed run (backend=fsdp) every rank writes its shards into the temporary folder (`dcp/`) and rank 0 writes
the rest and renames it, so the same holds.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlvr.distributed import ONE_PROCESS, World
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.outputs import disk_full

torch = lazy_import("torch")

STATE_FILE = "trainer_state.json"
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message says where and what is still intact."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # files and folders alike
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")) + [path]:
        _fsync(p)


def pending_file(rank: int) -> str:
    """trainer.off_policy_steps ≥ 1: the steps this rank sampled ahead but had not trained (its shares, a list of
    rlvr/overlap.py Jobs); `pending.pt` on rank 0 (one process), `pending.rank<r>.pt` on the others."""
    return "pending.pt" if rank == 0 else f"pending.rank{rank}.pt"


def pending_jobs(path: Path, world: World) -> list:
    """Checkpoint `path`'s steps this rank sampled ahead and had not trained (rlvr/overlap.py Jobs); their shares
    are per rank, so a checkpoint that holds some continues only on as many processes as wrote it."""
    import torch

    written = len(list(path.glob("pending*.pt")))
    if not written:
        return []
    if written != world.size:
        raise ConfigError(f"{path} holds steps sampled ahead of training by {written} process(es), each its "
                          f"share; continue it on {written} (this run has {world.size})")
    return torch.load(path / pending_file(world.rank), weights_only=False)


def _fault(name: str) -> None:
    """Test hook: `RLVR_FAULT=<name>:<n>` kills this process with SIGKILL the n-th time `name` is reached
    (used by the resume tests to die half-way through a checkpoint)."""
    spec = os.environ.get("RLVR_FAULT", "")
    if not spec.startswith(name + ":"):
        return
    count = int(os.environ.get("_RLVR_FAULT_SEEN", "0")) + 1
    os.environ["_RLVR_FAULT_SEEN"] = str(count)
    if count == int(spec.split(":")[1]):
        os.kill(os.getpid(), 9)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpoints:
    def __init__(self, root: Path, keep_last: int, world: World = ONE_PROCESS) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        """0 keeps every checkpoint."""
        self.world = world
        """The run's processes: each writes its shards of a checkpoint, rank 0 the rest (`save`)."""

    def save(self, steps_done: int, write_weights: Callable[[Path], None], state: dict, final: bool) -> Path:
        """In a distributed run every rank calls this: each writes its shards (`write_weights`), rank 0 the rest,
        the rename and `latest`, between barriers, so no rank goes on before the checkpoint is complete."""
        main = self.world.is_main
        name = f"step_{steps_done}"
        tmp, final_dir = self.root / f".{name}.tmp", self.root / name
        previous = self.latest()
        try:
            if main:
                self.root.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            self.world.barrier()
            write_weights(tmp)
            self.world.barrier()
            if main:
                torch.save(rng_state(), tmp / "rng.pt")
                _fault("checkpoint")
                (tmp / STATE_FILE).write_text(json.dumps({**state, "final": final}, indent=2) + "\n")
                _fsync_tree(tmp)
                shutil.rmtree(final_dir, ignore_errors=True)
                tmp.rename(final_dir)
                _fsync(self.root)
                self._point_latest_to(name)
        except Exception as err:  # an OSError, or a library's own error for one (safetensors', torch.save's)
            why = "No space left on device" if disk_full(err, self.root) else (  # before the rmtree frees space
                err.strerror if isinstance(err, OSError) and err.strerror else f"{type(err).__name__}: {err}")
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            raise CheckpointError(f"could not write checkpoint {final_dir}: {why}; {kept}") from err
        if main:
            self._prune(keep={name})
        self.world.barrier()
        return final_dir

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if pointer.is_file():
            named = self.root / pointer.read_text().strip()
            if (named / STATE_FILE).is_file():
                return named
        complete = [p for p in self._steps() if (p / STATE_FILE).is_file()]
        return complete[-1] if complete else None

    @staticmethod
    def read_state(path: Path) -> dict:
        return json.loads((path / STATE_FILE).read_text())

    def _steps(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
        return [p for _, p in sorted(found)]

    def _point_latest_to(self, name: str) -> None:
        tmp = self.root / ".latest.tmp"
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / "latest")
        _fsync(self.root)

    def _prune(self, keep: set[str]) -> None:
        for stale in self.root.glob(".step_*.tmp"):  # left by a run killed mid-write
            shutil.rmtree(stale, ignore_errors=True)
        if self.keep_last <= 0:
            return
        steps = self._steps()
        finals = {p.name for p in steps if self._is_final(p)}
        for p in steps[: -self.keep_last]:
            if p.name not in keep | finals:
                shutil.rmtree(p, ignore_errors=True)

    @staticmethod
    def _is_final(path: Path) -> bool:
        try:
            return bool(json.loads((path / STATE_FILE).read_text()).get("final"))
        except (OSError, ValueError):
            return False
