"""`hydra/launcher=packed`: a sweep's runs trained in packs, each pack one process's worth of runs on one base model.

    python train.py --multirun condition=grpo,maxrl seed=0,1,2 hydra/launcher=packed [hydra.launcher.pack_size=N]

Each job is composed exactly as the basic launcher composes it (the same overrides, `hydra.sweep.dir/<job num>` as
its run folder). Jobs that can share a process share one: LoRA runs of the same `model` node (the same base weights
and LoRA shape), `engine` and `backend`, sampled by engine=pytorch (or engine=vllm, one vLLM per base with an adapter
per cell, sampling in step with training) and trained by backend=local (`group_key`). Each such group runs as packs
of at most `pack_size` runs (null: as many as fit in the memory free, rlvr/pack/fit.py), one pack after another in
this process; each pack's runs are its cells (rlvr/pack/): ordinary runs, in lockstep, their sampling batched. Any
other run is a pack of its own, and the log says why.

A cell that fails (its run fails, or its config is refused) ends with its own status and reason; the others go on.
At the end, the command's exit status is the worst of its cells' as `python train.py` would give it: 75 when any
cell stopped on a signal (checkpointed: the same command continues them, finished runs are skipped), else 2 for a
refused config, 1 for a failed run, 0 when every run finished.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger("rlvr")

SHARED_KEYS = ("model", "engine", "backend", "threads")
"""What the runs of one pack have in common (the base model with its LoRA shape, how it samples, how it trains, and
the torch threads that the pack's sampling runs with)."""


def group_key(cfg: DictConfig) -> str | None:
    """The runs with the same key can share a process; None: a run that shares it with no other. A run shares only
    what a pack can share: a base model trained by LoRA (full fine-tuning changes every weight), sampled by an
    engine that samples with the trained module in this process (engine=pytorch) or several adapters on one base
    (engine=vllm), trained by one process (backend=local)."""
    try:
        if cfg.model.get("lora") is None or alone(cfg):
            return None
    except Exception:  # noqa: BLE001 - a config the run itself will refuse, saying why: it runs alone
        return None
    plain = cast(dict, OmegaConf.to_container(cfg, resolve=True))
    return json.dumps({k: plain.get(k) for k in SHARED_KEYS}, sort_keys=True)


def alone(cfg: DictConfig) -> bool:
    """The run's engine or backend cannot be shared with another run (`group_key`)."""
    return why_engine_alone(cfg) is not None


def why_engine_alone(cfg: DictConfig) -> str | None:
    """Why the run's engine or backend cannot be shared with another run, or None when they can."""
    from rlvr.config_check import declared_needs

    engine, backend = declared_needs(cfg, "engine").provides, declared_needs(cfg, "backend").provides
    shares_engine = "trainer_module" in engine or "multi_lora" in engine
    if not shares_engine or "local_policy" not in backend or "distributed" in backend:
        names = (cfg[k]._target_.rsplit(".", 1)[-1] for k in ("engine", "backend"))
        return "engine={}, backend={}: a pack shares engine=pytorch or vllm, and backend=local, only".format(*names)
    if "multi_lora" in engine and (cfg.trainer.get("off_policy_steps") or cfg.engine.get("sleep_level")):
        return ("engine=vllm sampling ahead of training (trainer.off_policy_steps) or asleep while it trains "
                "(engine.sleep_level): its vLLM cannot serve other cells in step")
    return None


def why_alone(cfg: DictConfig) -> str:
    """What a pack of one run says of itself."""
    if cfg.model.get("lora") is None:
        return "it trains every weight: no base to share"
    try:
        why = why_engine_alone(cfg)
    except Exception:  # noqa: BLE001 - the run itself says what is wrong
        return "its config: the run says what is wrong with it"
    return why or "no other run of the sweep shares its model, engine and backend"


def packs(keys: Sequence[str | None], pack_size: int | None,
          fits: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """The jobs' indices, pack by pack: jobs of one key in the sweep's order, at most `pack_size` a pack; with
    pack_size null, as many as `fits` allows (at least one; without `fits`, the whole group)."""
    if pack_size is not None and pack_size < 1:
        raise ValueError(f"hydra.launcher.pack_size={pack_size}: expected a positive number of runs, or null (as "
                         "many runs of a group as fit in memory)")
    groups: dict[str, list[int]] = {}
    out: list[list[int]] = []
    for i, key in enumerate(keys):
        if key is None:
            out.append([i])
        else:
            groups.setdefault(key, []).append(i)
    for group in groups.values():
        out.append([])
        for i in group:
            full = len(out[-1]) == pack_size if pack_size else fits is not None and not fits([*out[-1], i])
            if out[-1] and full:
                out.append([])
            out[-1].append(i)
    return sorted(out)


def fitting(configs: list[DictConfig], keys: Sequence[str | None]) -> Callable[[list[int]], bool] | None:
    """pack_size null: whether jobs fit one pack in the memory free where they train (rlvr/pack/fit.py), each
    group's budget worked out once and logged; None when no group's model can be sized here."""
    from rlvr.pack.fit import base_of, budget, filling, seeded

    bases = [base_of(c.seed, c.trainer.warmup.steps, seeded(c)) for c in configs]
    fits: dict[str, Callable[[list[int]], bool]] = {}
    for i, key in enumerate(keys):
        if key is not None and key not in fits:
            found = budget(configs[i])
            if found is not None:
                log.info("pack size: %s", found.describe())
            fits[key] = filling(bases, found) if found is not None else (lambda pack: True)
    return (lambda pack: fits[cast(str, keys[pack[0]])](pack)) if fits else None


def job_config(hydra_context: Any, config: DictConfig, overrides: Sequence[str], idx: int,
               job_id: str | None = None) -> DictConfig:
    """Job `idx`'s config, as Hydra's basic launcher and `run_job` make it: composed from the sweep's overrides,
    its job number (and id: the number, or a SLURM task's job id) and its run folder
    `hydra.sweep.dir/hydra.sweep.subdir` set (made only where the job runs: `cell_of`)."""
    from hydra.core.hydra_config import HydraConfig

    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = idx if job_id is None else job_id
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    output_dir = os.path.join(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir))
    with read_write(sweep_config.hydra.runtime), open_dict(sweep_config.hydra.runtime):
        sweep_config.hydra.runtime.output_dir = os.path.abspath(output_dir)
    return sweep_config


def code_of(result: Any) -> int:
    """A cell's exit status, as `python train.py` would exit with it: its SystemExit's, 1 for any other exception."""
    if isinstance(result, SystemExit):
        code = result.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 1 if isinstance(result, BaseException) else 0


def exit_status(results: list[Any]) -> int:
    """The pack's exit status from its cells' outcomes (module docstring)."""
    from rlvr.preemption import INTERRUPT_EXIT_CODE, REQUEUE_EXIT_CODE

    codes = [code_of(r) for r in results]
    for stopped in (INTERRUPT_EXIT_CODE, REQUEUE_EXIT_CODE):
        if stopped in codes:
            return stopped
    return max(codes, default=0)


def stopped(returns: Sequence[Any]) -> bool:
    """A cell of the pack stopped on a signal (SIGTERM, SIGINT…: checkpointed), so the sweep stops as a sweep of the
    basic launcher does when its run is stopped."""
    from rlvr.preemption import INTERRUPT_EXIT_CODE, REQUEUE_EXIT_CODE

    return any(code_of(r._return_value) in (INTERRUPT_EXIT_CODE, REQUEUE_EXIT_CODE)
               for r in returns if r.status.name == "FAILED")


class PackedLauncher(Launcher):
    """Hydra's launcher for `hydra/launcher=packed` (module docstring); registered with Hydra under
    hydra_plugins/rlvr_launchers/ (Hydra takes launchers from that package only)."""

    def __init__(self, pack_size: int | None = None) -> None:
        super().__init__()
        self.pack_size = pack_size
        self.config: DictConfig | None = None
        self.hydra_context: Any = None
        self.task_function: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from hydra.core.utils import configure_log, filter_overrides, setup_globals

        setup_globals()
        assert self.config is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        configs = []
        for i, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + i, " ".join(filter_overrides(overrides)))
            configs.append(job_config(self.hydra_context, self.config, overrides, initial_job_idx + i))
        keys = [group_key(c) for c in configs]
        grouped = packs(keys, self.pack_size, None if self.pack_size else fitting(configs, keys))
        returns: list[Any] = [None] * len(configs)
        for number, pack in enumerate(grouped):
            log_pack(number, grouped, configs, initial_job_idx)
            cells = run_cells([configs[i] for i in pack], self.task_function, f"{number + 1} of {len(grouped)}",
                              self.hydra_context.callbacks)
            for i, ret in zip(pack, cells, strict=True):
                returns[i] = ret
            if stopped(cells) and number + 1 < len(grouped):
                log.info("stopped by a signal: packs %d to %d not started (the same command continues the sweep)",
                         number + 2, len(grouped))
                break
        status = exit_status([r._return_value if r is not None and r.status.name == "FAILED" else None
                              for r in returns])
        if status:
            raise SystemExit(status)
        return returns


def log_pack(number: int, grouped: list[list[int]], configs: list[DictConfig], initial_job_idx: int,
             where: str = "") -> None:
    """The log's line for pack `number`: its jobs, and why a pack of one has no other run (`why_alone`)."""
    pack = grouped[number]
    why = "" if len(pack) > 1 else f" ({why_alone(configs[pack[0]])})"
    log.info("pack %d of %d%s: jobs %s%s", number + 1, len(grouped), where,
             ", ".join(str(initial_job_idx + i) for i in pack), why)


def run_cells(configs: list[DictConfig], task_function: Any, number: str, callbacks: Any) -> list[Any]:
    """Pack `number` ("2 of 5"): each job a cell (its task function on its config, its own train.log), run in lockstep
    to their ends, Hydra's job callbacks around each; a `JobReturn` per job, as `run_job` makes them."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus, configure_log

    from rlvr.pack.cells import run_pack
    from rlvr.pack.sampling import PackSampling
    from rlvr.preemption import StopSignals

    configure_log(configs[0].hydra.job_logging, configs[0].hydra.verbose)  # the console; the files are the cells'
    pack = f"{number}: jobs {', '.join(str(c.hydra.job.num) for c in configs)} in process {os.getpid()} on " \
           f"{socket.gethostname()}"
    cells, returns = zip(*(cell_of(cfg, task_function, pack) for cfg in configs), strict=True)
    same_threads(configs[0])
    handlers = cell_logs(list(cells), configs)
    for cfg in configs:
        HydraConfig.instance().set_config(cfg)
        callbacks.on_job_start(config=cfg, task_function=task_function)
    sampling = PackSampling()
    try:
        with StopSignals():  # a signal reaches this thread only: it tells every cell (rlvr/preemption.py)
            run_pack(list(cells), sampling.answer)
    finally:
        for handler in handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()
    for cell, ret, cfg in zip(cells, returns, configs, strict=True):
        ret.status = JobStatus.FAILED if cell.failed else JobStatus.COMPLETED
        ret.return_value = cell.result
        if cell.failed:
            why = "" if isinstance(cell.result, SystemExit) else f": {type(cell.result).__name__}: {cell.result}"
            log.info("pack %s: %s exited %d%s (its status.json says why)", number, cell.name, code_of(cell.result), why)
        HydraConfig.instance().set_config(cfg)
        callbacks.on_job_end(config=cfg, job_return=ret)
    log.info("pack %s: %s", number, sampling.summary())
    return list(returns)


def same_threads(cfg: DictConfig) -> None:
    """This thread, which decodes the cells' samples together, uses the torch threads each cell sets in its own
    (rlvr/run.py; a thread count is a thread's own): the pack's arithmetic is that of its runs alone."""
    from rlvr.threads import resolve

    threads = resolve(cfg.get("threads"))
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def cell_of(cfg: DictConfig, task_function: Any, pack: str) -> tuple[Any, Any]:
    """The job's cell (its task function on its config without `hydra`, as `run_job` calls it) and its `JobReturn`."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobReturn

    from rlvr.pack.cells import Cell

    HydraConfig.instance().set_config(cfg)
    Path(cfg.hydra.runtime.output_dir).mkdir(parents=True, exist_ok=True)  # as `run_job` makes it, before the task
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    hydra_cfg = HydraConfig.instance().cfg
    ret = JobReturn(overrides=list(cfg.hydra.overrides.task), cfg=task_cfg, hydra_cfg=cast(DictConfig, hydra_cfg),
                    working_dir=os.getcwd(), task_name=cfg.hydra.job.name)
    return Cell(cfg.hydra.runtime.output_dir, functools.partial(task_function, task_cfg), hydra_cfg, pack), ret


def cell_logs(cells: list[Any], configs: list[DictConfig]) -> list[Any]:
    """Each cell's thread started and its train.log handler installed in place of the one `configure_log` made: a
    `HeldFileHandler` that takes the records of the cell's thread only (rlvr/run_record.py)."""
    from rlvr.run_record import HeldFileHandler

    root = logging.getLogger()
    template = next(h for h in root.handlers if isinstance(h, HeldFileHandler))
    root.removeHandler(template)
    handlers = []
    for cell, cfg in zip(cells, configs, strict=True):
        cell.start_thread()
        handler = HeldFileHandler(os.path.join(cfg.hydra.runtime.output_dir, template.name_in_folder),
                                  owner=cell.thread.ident)
        handler.setFormatter(template.formatter)
        handler.setLevel(template.level)
        root.addHandler(handler)
        handlers.append(handler)
    return handlers


class SlurmPacks:
    """`hydra/launcher=slurm hydra.launcher.pack_size=N`: the sweep's runs grouped as `hydra/launcher=packed`
    groups them, N to a pack, and each pack one task of the job array (submitit), its runs the cells of the task's
    process: a 25-run grid with pack_size=5 is 5 tasks. pack_size=1 (the preset's) is one run per task, as
    submitit's launcher runs them. A task whose cells stopped on a signal exits 75, so the preset's trap requeues it
    and its cells resume. Mixed into submitit's SlurmLauncher by hydra_plugins/rlvr_launchers/."""

    params: dict
    config: DictConfig | None
    hydra_context: Any
    task_function: Any

    def __init__(self, pack_size: int = 1, **params: Any) -> None:
        super().__init__(**params)  # type: ignore[call-arg]  # submitit's launcher, next in the MRO
        self.pack_size = pack_size

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        if self.pack_size == 1:
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        from hydra.core.singleton import Singleton

        assert self.config is not None
        configs = [job_config(self.hydra_context, self.config, o, initial_job_idx + i)
                   for i, o in enumerate(job_overrides)]
        grouped = packs([group_key(c) for c in configs], self.pack_size)
        for number in range(len(grouped)):
            log_pack(number, grouped, configs, initial_job_idx, " (a task)")
        args = [([list(job_overrides[i]) for i in pack], [initial_job_idx + i for i in pack],
                 f"{number + 1} of {len(grouped)}", Singleton.get_state()) for number, pack in enumerate(grouped)]
        tasks = submitit_executor(self.params, self.config).map_array(self.run_task, *zip(*args, strict=True))
        returns: list[Any] = [None] * len(configs)
        for pack, task in zip(grouped, tasks, strict=True):
            for i, ret in zip(pack, task.results()[0], strict=True):
                returns[i] = ret
        return returns

    def run_task(self, overrides: list[list[str]], numbers: list[int], number: str, singleton_state: dict) -> list:
        """One task of the array: its pack's runs as cells (`run_cells`); exits with the pack's status unless 0."""
        import submitit
        from hydra.core.singleton import Singleton
        from hydra.core.utils import setup_globals

        Singleton.set_state(singleton_state)
        setup_globals()
        assert self.config is not None
        job_id = submitit.JobEnvironment().job_id
        configs = [job_config(self.hydra_context, self.config, job, num, job_id)
                   for job, num in zip(overrides, numbers, strict=True)]
        returns = run_cells(configs, self.task_function, number, self.hydra_context.callbacks)
        status = exit_status([r._return_value if r.status.name == "FAILED" else None for r in returns])
        if status:
            raise SystemExit(status)
        return returns


def submitit_executor(params: dict, config: DictConfig) -> Any:
    """The SLURM executor submitit's launcher builds from the launcher's keys (hydra_submitit_launcher's `launch`)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    executor = submitit.AutoExecutor(cluster="slurm", folder=params["submitit_folder"],
                                     slurm_max_num_timeout=params["max_num_timeout"])
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                  if k not in {"submitit_folder", "max_num_timeout"}})
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    return executor
