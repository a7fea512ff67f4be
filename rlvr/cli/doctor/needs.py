"""`rlvr doctor`'s second part: what the composed run needs, from the chosen components' declared `needs`."""

from __future__ import annotations

import shutil
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.cli.doctor.report import ERROR, FAILING, MISSING, OK, Line

if TYPE_CHECKING:
    from rlvr.launcher.slurm import Cluster
from rlvr.protocols import Finding, Requirement


@dataclass(frozen=True)
class Job:
    """One composed job: its overrides, config (with `hydra`), and `hydra.runtime.choices`."""

    overrides: list[str]
    cfg: Any
    choices: dict[str, str | None]


def compose(conf: Path, overrides: list[str]):
    """conf/train.yaml with `overrides`, as train.py composes it (with `hydra`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
        return hydra_compose("train", overrides=overrides, return_hydra_config=True)


def compose_jobs(overrides: list[str], conf: Path) -> tuple[list[Job], str | None]:
    """Every job the overrides launch (one, or each of a grid's), composed as train.py composes it; or the
    composition error."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlvr.campaign import expand_grid
    from rlvr.command_line import repeated_choices

    if repeated := repeated_choices(overrides, conf):
        return [], "; ".join(repeated)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        fixed = [text for text, o in zip(overrides, parsed) if not o.is_sweep_override()]
        base = compose(conf, fixed)
        params = dict(base.hydra.sweeper.params or {})
        grid = expand_grid(params, overrides) if params or len(fixed) < len(overrides) else [overrides]
        jobs = []
        for job in grid:
            cfg = compose(conf, job)
            HydraConfig.instance().set_config(cfg)  # ${hydra:...} interpolations resolve as in the job
            jobs.append(Job(job, cfg, dict(cfg.hydra.runtime.choices)))
    except Exception as err:  # noqa: BLE001 - any composition failure is the config's problem, reported as such
        text = " ".join(str(err).split()).split(" Config search path")[0]  # Hydra's message, on one line
        return [], f"{type(err).__name__}: {text}"
    return jobs, None


def run_lines(jobs: list[Job], pool: Executor, slurm: Future[Cluster]) -> list[Line]:
    """The config checks' findings, then one line per requirement of every job (each distinct line once).
    Requirements run side by side in `pool`; one requirement shared by several jobs is checked once. `slurm`:
    what `sinfo` answered."""
    checks: dict[Requirement, Future[Finding]] = {}
    rows: list[tuple[str, Requirement]] = []
    config: list[Line] = []
    from rlvr.config_check import run_folder
    from rlvr.machine_check import machine_requirements

    for job in jobs:
        needs, errors = job_needs(job)
        config += [Line(ERROR, "config", error.replace("\n", " ")) for error in errors]
        for who, requirement in machine_requirements(job.cfg, needs, run_folder(job.cfg)) if needs else ():
            if requirement not in checks:
                checks[requirement] = pool.submit(requirement.check)
            rows.append((label(job, who) if who in needs else who, requirement))
        if "SlurmLauncher" in str(job.cfg.hydra.launcher.get("_target_", "")):
            config += slurm_needs(job, slurm.result())
    lines = list(dict.fromkeys(config))
    if not any(line.status in FAILING for line in lines if line.item == "config"):
        lines.insert(0, Line(OK, "config", "composed as train.py composes it; rlvr.config_check's checks pass"))
    for item, requirement in rows:
        found = checks[requirement].result()
        line = Line(found.status, item, f"{requirement.item}: {found.detail}")
        if line not in lines:
            lines.append(line)
    return lines


def job_needs(job: Job) -> tuple[dict, list[str]]:
    """Each group's declared needs, and rlvr.config_check's findings on the config alone: value checks and pairing
    (machine requirements are reported line by line instead)."""
    from rlvr.config_check import config_problems
    from rlvr.errors import ConfigError

    try:
        return config_problems(job.cfg, at_start=False)
    except ConfigError as err:
        return {}, str(err).split("\n  ")[1:] or [str(err)]
    except Exception as err:  # noqa: BLE001 - anything the checks trip over is a config problem here
        return {}, [f"{type(err).__name__}: {err}"]


def label(job: Job, group: str) -> str:
    return f"{group}={job.choices.get(group) or job.cfg[group]._target_.rsplit('.', 1)[-1]}"


def slurm_needs(job: Job, cluster: Cluster) -> list[Line]:
    """The SLURM commands, a cluster, and what sbatch would refuse in the launcher's request: the problems
    `hydra/launcher=slurm` itself refuses before it submits (rlvr.launcher.slurm.launch_problems), each with
    the override that fits."""
    from rlvr.launcher.slurm import SLURM_COMMANDS, launch_problems

    item = f"hydra/launcher={job.choices.get('hydra/launcher')}"
    absent = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if absent:
        return [Line(MISSING, item, f"not on PATH: {', '.join(absent)}")]
    if not cluster.ok:
        return [Line(MISSING, item, cluster.detail)]
    problems = launch_problems(job.cfg.hydra.launcher, cluster)
    return [Line(MISSING, item, f"{p}; add {p.fix}") for p in problems] or [Line(OK, item, cluster.detail)]
