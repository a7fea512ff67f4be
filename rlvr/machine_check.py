"""What this machine must have for the chosen run: one list, checked by `rlvr doctor` and by every run before its
model loads.

    the components' own   every requirement each chosen component declares in its `needs` (rlvr/protocols.py):
                          packages, keys, a hub preset's files, a CUDA device, vLLM's build, a server …
    the run's own         threads (no more torch threads than the cores this process may run on) and free disk
                          (the run folder's file system holds a checkpoint, the hub cache's the base weights)

A run checks the cheap requirements (`at_start`) with the config (rlvr/config_check.py, in its first second, before
torch is imported) and the rest here, side by side, before the model loads: a CUDA device asked of a CPU-only torch,
a vLLM build that does not import, are refused with exit status 2 naming the fix, not met as a traceback after the
model has loaded. `rlvr doctor` reports the same findings one line each.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from omegaconf import DictConfig

from rlvr.errors import ConfigError
from rlvr.protocols import Finding, Needs, Requirement
from rlvr.requirements import FreeDisk, Threads

log = logging.getLogger("rlvr")


def machine_requirements(cfg: DictConfig, needs: dict[str, Needs], folder: Path) -> list[tuple[str, Requirement]]:
    """(who needs it, the requirement) for the run composed as `cfg` writing into `folder`: each chosen
    component's declared ones, then the run's own."""
    declared = [(group, requirement) for group, n in needs.items() for requirement in n.machine]
    model = cfg.model
    full = model.get("lora") is None
    run: list[tuple[str, Requirement]] = [("threads", Threads(cfg.get("threads"))),
                                          ("run", FreeDisk(str(folder), model.get("name_or_path"),
                                                           model.get("revision"), full))]
    return declared + run


def check_machine(cfg: DictConfig, needs: dict[str, Needs], folder: Path) -> None:
    """Every requirement not already checked at start, side by side; a missing one is a ConfigError (all of them,
    each naming who needs it), a warning is logged."""
    todo = [(who, r) for who, r in machine_requirements(cfg, needs, folder) if not r.at_start]
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=min(4, len(todo))) as pool:
        found: list[Finding] = list(pool.map(lambda pair: pair[1].check(), todo))
    errors = []
    for (who, requirement), finding in zip(todo, found):
        where = f"{who} <{cfg[who]._target_}>" if who in cfg and isinstance(cfg[who], DictConfig) else who
        if finding.status == "missing":
            errors.append(f"{where}: {requirement.item}: {finding.detail}")
        elif finding.status == "warning":
            log.warning("%s: %s: %s", where, requirement.item, finding.detail)
    if errors:
        raise ConfigError("this machine cannot run it (`rlvr doctor` reports every requirement):\n  "
                          + "\n  ".join(errors))
