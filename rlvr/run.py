"""The one job a `python train.py` run has: compose (Hydra, train.py) → check → build → run. The only module that
reads the composed DictConfig besides the checks: build every component from its `_target_` and hand typed
objects to the loop, in the run's folder.

Everything that can be checked without loading a model is checked first (rlvr/config_check.py), and every problem
found is reported at once, naming the keys involved; then the light components are built (their constructors check
their own values). None of this imports torch or transformers (rlvr/lazy.py), so a wrong invocation fails in about
a second.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from omegaconf import DictConfig

from rlvr import distributed
from rlvr.build import build_all
from rlvr.campaign import record
from rlvr.checkpoint import Checkpoints
from rlvr.components import Components
from rlvr.distributed import World
from rlvr.errors import ConfigError, RunFailed
from rlvr.folder_lock import FolderLock
from rlvr.machine_check import check_machine
from rlvr.outputs import RunDir, disk_full, disk_full_message
from rlvr.pack.cells import current_cell
from rlvr.preemption import Preempted, StopSignals
from rlvr.resume import config_id, differences, holds_a_run, interrupted_run, resume_point
from rlvr.run_record import accept, drop_log
from rlvr.threads import resolve as resolve_threads
from rlvr.trainer import Trainer

log = logging.getLogger("rlvr")


def run(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    campaign_root = None
    if out_dir is None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        out_dir = hydra_cfg.runtime.output_dir
        campaign_root = Path(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    own = folder = Path(out_dir)
    world = World.from_env()
    if not world.is_main:  # the other ranks of a distributed run log warnings only
        logging.getLogger("rlvr").setLevel(logging.WARNING)
    refuse_unsafe_folder(folder)  # before the try: such a folder is never removed
    held: list[FolderLock] = []  # rank 0's lock on the run folder, for the run's whole life
    try:
        components, trainer = build_all(cfg, campaign_root, world)
        check_machine(cfg, components.needs, own)  # what `rlvr doctor` checks, before the model loads
        if components.distributed:
            join(world, cfg)
        # rank 0 decides the folder (the ranks' Hydra clocks may name different ones), every rank joins it
        folder, resume_from = world.on_main(place, cfg, folder, components.config, held)
    except Exception:
        if world.is_main:
            for lock in held:
                lock.release(keep_file=False)
            remove_if_fresh(own)  # a run that never started leaves no half-written folder behind
        drop_log()  # a refused command writes nothing into a run folder, its log included
        raise
    try:
        if resume_from is not None and finished(resume_from, trainer.max_steps) and (folder / "summary.json").exists():
            drop_log()
            log.info("run folder %s already finished %d steps: nothing to do", folder, trainer.max_steps)
            return json.loads((folder / "summary.json").read_text())
        if world.is_main:
            accepted(cfg, own, folder, resume_from, components.config, held)
        else:
            quiet_rank(components, own, folder)
        return train(cfg, components, trainer, RunDir.of(folder, world), resume_from, campaign_root)
    finally:
        for lock in held:
            lock.release()


def train(cfg: DictConfig, components: Components, trainer: Trainer, out: RunDir, resume_from: Path | None,
          campaign_root: Path | None) -> dict:
    """The accepted run: status.json says where it stands from its start to its end."""
    world, folder = components.world, out.path
    cell = current_cell()  # a packed grid's (rlvr/pack/): status.json says which pack

    def status(state: str, reason: str | None = None) -> None:
        out.write_status(state, max_steps=trainer.max_steps, reason=reason, config_id=config_id(components.config),
                         pack=cell.pack if cell is not None else None)
        if campaign_root is not None and out.writes:
            record(campaign_root, folder, state, reason)

    threads = resolve_threads(cfg.get("threads"))
    if threads is not None:
        import torch  # the job's first heavy import: everything above was checked without it

        torch.set_num_threads(threads)
        log.info("torch threads: %d (threads=%s)", threads, cfg.threads)
    status("running")
    try:
        with StopSignals() as stop:
            stop.on_forced_exit = lambda reason: status("preempted", reason)
            summary = trainer.fit(components, out, resume_from, stop)
    except Preempted as stopped:
        status("preempted", str(stopped))
        raise
    except BaseException as err:
        full = isinstance(err, Exception) and disk_full(err, folder)  # wherever it struck: one message (outputs.py)
        reason = disk_full_message(folder, err) if full else f"{type(err).__name__}: {err}"
        try:
            status("failed", reason)
        except OSError:  # the full disk refuses status.json too: the console has the reason
            pass
        if world.size > 1:
            exit_now(world)
        if full:
            raise RunFailed(reason) from err
        raise
    status("finished")
    if components.distributed:
        distributed.close()
    return summary


def accepted(cfg: DictConfig, own: Path, folder: Path, resume_from: Path | None, config: dict,
             held: list[FolderLock]) -> None:
    """Every check passed: the folder is this run's. Its lock names this process, and its record says what ran
    (rlvr/run_record.py: `.hydra/` for a fresh run, a `resumes.jsonl` line for a continued one, train.log)."""
    if own != folder:
        remove_if_fresh(own)  # Hydra's folder for this command, when it continues another one
    for lock in held:
        lock.claim()
    resumed = None
    if resume_from is not None:
        saved = Checkpoints.read_state(resume_from)
        resumed = {"from_step": saved["step"], "from_checkpoint": str(resume_from),
                   "changed": differences(saved["config"], config)}
        log.info("continuing the run in %s from step %d (%s)", folder, saved["step"], resume_from)
    else:
        log.info("run folder %s", folder)
    accept(folder, cfg, resumed)


def exit_now(world: World) -> None:
    """A rank of a distributed run that failed exits at once with status 1 (the traceback logged): Hydra would
    hand the exception to its launcher and let the process exit 0, but torchrun and srun (--kill-on-bad-exit) end
    the other ranks only when one exits non-zero, and on NCCL they could otherwise wait out backend.timeout_s."""
    log.exception("rank %d of %d failed; exiting so that the launcher ends the other ranks", world.rank, world.size)
    logging.shutdown()
    os._exit(1)


def place(cfg: DictConfig, folder: Path, config: dict, held: list[FolderLock]) -> tuple[Path, Path | None]:
    """The run's folder (this one, the interrupted run this same command continues, or a fresh sibling under
    resume=never) and the checkpoint to continue from; the folder's lock, taken before its state is read, is
    appended to `held`. Nothing is written into an existing folder here."""
    if cfg.resume != "never" and default_run_dir() and not holds_a_run(folder):
        found = interrupted_run(folder.parent, config, folder)
        if found is not None:
            log.info("continuing the interrupted run in %s: the same command (resume=never starts a new one)", found)
            folder = found
    check_writable(folder)  # (a probe file made and removed: no byte of the folder changes)
    held.append(FolderLock.take(folder))
    chosen, resume_from = resume_point(cfg.resume, folder, config, list(cfg.resume_allow_changes))
    if chosen != folder:  # resume=never: a new sibling folder, locked in its turn
        held.pop().release(keep_file=False)
        held.append(FolderLock.take(chosen))
    return chosen, resume_from


def default_run_dir() -> bool:
    """This single run's folder is conf/train.yaml's default (`outputs/<task>/<label>/<time>`), new each time."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    hydra_cfg = HydraConfig.get()
    return hydra_cfg.mode == RunMode.RUN and not any(o.startswith("hydra.run.dir=") for o in hydra_cfg.overrides.hydra)


def refuse_unsafe_folder(folder: Path) -> None:
    """A run folder is a folder of its own: `hydra.run.dir=''` (the current folder), the checkout, $HOME, `/` or a
    folder above the checkout would spread a run's files among the user's own (and the next run there would
    continue it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN and not str(HydraConfig.get().run.dir):
        raise ConfigError("invalid config:\n  hydra.run.dir='': a run needs a folder of its own (it would write "
                          "metrics.jsonl, checkpoints/ and its record into the current folder); name one, e.g. "
                          "hydra.run.dir=outputs/my-run, or leave the default")
    path, checkout = folder.resolve(), Path(__file__).resolve().parents[1]
    shared = {checkout: "the checkout", Path.home().resolve(): "$HOME", Path("/"): "/"}
    why = shared.get(path) or ("a folder above the checkout" if path in checkout.parents else None)
    if why is not None:
        raise ConfigError(f"invalid config:\n  hydra.run.dir={str(folder)!r} is {why}: a run needs a folder of its "
                          "own (it writes metrics.jsonl, checkpoints/ and its record there); name one, e.g. "
                          "hydra.run.dir=outputs/my-run, or leave the default")


def join(world: World, cfg: DictConfig) -> None:
    """Join the run's process group (torch's first import here: every check of the config has passed)."""
    from rlvr.backend.local import resolve_device

    distributed.init(world, resolve_device(cfg.backend.device).type, float(cfg.backend.timeout_s))
    log.info("rank %d of %d (local rank %d)", world.rank, world.size, world.local_rank)


def quiet_rank(components: Components, own: Path, folder: Path) -> None:
    """A rank other than 0 writes no files: its held train.log lines are dropped, the folder Hydra made for it (if
    its clock named another one) removed, and its logger is none."""
    from rlvr.logger.trackers import Trackers

    drop_log()
    if own != folder:
        remove_if_fresh(own)
    components.logger = Trackers({})


def finished(checkpoint: Path, max_steps: int) -> bool:
    state = Checkpoints.read_state(checkpoint)
    return bool(state.get("final")) and state["step"] >= max_steps


def check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"hydra.run.dir={str(folder)!r} is not writable: {err.strerror or err}") from err


def remove_if_fresh(folder: Path) -> None:
    """Delete `folder` if it holds nothing but what Hydra writes at start (.hydra/, the log), and with the default
    folder its `<task>/<label>/` parents when nothing else is left in them."""
    if folder.is_dir() and all(p.name in (".hydra", "train.log") for p in folder.iterdir()):
        shutil.rmtree(folder, ignore_errors=True)
        for parent in (folder.parent, folder.parent.parent) if default_run_dir() else ():
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
