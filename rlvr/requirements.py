"""Machine requirements that several components declare in their `needs` (rlvr/protocols.py: Requirement).

A requirement particular to one component (vLLM's build, a server's model list, a hub preset's files) lives
in that component's module. Checking imports nothing heavy unless the requirement is about that thing
(`CudaDevice` imports torch); a child process or a request is only made by a requirement not `at_start`, with
two exceptions: a model's files not in the local hub cache are downloaded at start, so whether the hub answers
is asked then (`unanswered`: one HEAD request, at most HUB_PROBE_TIMEOUT_S) unless the hub is off anyway; and
logger=wandb online asks whether its server answers the same way (rlvr/logger/preflight.py).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from rlvr.lazy import import_paused
from rlvr.protocols import Finding


def api_key(var: str, key: str) -> tuple[str | None, str]:
    """($var's value or None, why it cannot be used). `key` is the config key that names the variable. The
    value never appears in a message."""
    value = os.environ.get(var, "").strip()
    if not value:
        return None, f"${var} is not set ({key} names it)"
    if not header_safe(value):  # httpx would put the bad header, key and all, in its error
        return None, f"${var} ({key}) holds characters an HTTP header cannot carry"
    return value, ""


def header_safe(value: str) -> bool:
    """Whether `value` can be sent in an HTTP header."""
    return value.isascii() and value.isprintable()


@dataclass(frozen=True)
class EnvVar:
    """An API key in an environment variable, named by a config key; checked by every run at start."""

    var: str
    key: str
    """The config key that names the variable (backend.api_key_env)."""
    at_start: bool = True

    @property
    def item(self) -> str:
        return f"${self.var}"

    def check(self) -> Finding:
        value, why = api_key(self.var, self.key)
        if value is None:
            return Finding("missing", f"needs an API key in ${self.var}: {why}")
        return Finding("ok", f"${self.var} is set (the value is never shown)")


@dataclass(frozen=True)
class Setting:
    """A setting the component cannot work without, checked from the config alone at start."""

    item: str
    """The config key."""
    ok: bool
    expected: str
    at_start: bool = True

    def check(self) -> Finding:
        return Finding("ok", f"{self.item} is set") if self.ok else Finding("missing", self.expected)


def pip_extra(*extras: str) -> str:
    """The command that installs rlvr with these extras (pyproject.toml [project.optional-dependencies])."""
    return " or ".join(f'pip install -e ".[{extra}]"' for extra in extras)


def pip_dependency(requirement: str) -> str:
    """The command that installs one of rlvr's own dependencies (pyproject.toml [project] dependencies)."""
    return f'pip install "{requirement}" (one of rlvr\'s own dependencies: pip install -e . installs them)'


@dataclass(frozen=True)
class Package:
    """An importable Python package: found on the import path (`importlib.util.find_spec`, which imports
    nothing), checked by every run at start. That it also imports (a broken build, a missing shared library)
    is a `ChildProbe`'s question, for `rlvr doctor`."""

    module: str
    install: str
    """How to get it: `pip_extra("tinker")`, or the command for a dependency of rlvr itself."""
    distributions: tuple[str, ...] = ()
    """Distribution names to read the version from; default: the module's name."""
    at_start: bool = True

    @property
    def item(self) -> str:
        return self.module

    def check(self) -> Finding:
        try:
            found = importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):  # a parent package missing; a module left in sys.modules as None
            found = False
        if not found:
            return Finding("missing", f"{self.module} is not installed: {self.install}")
        version = distribution_version(*(self.distributions or (self.module,)))
        return Finding("ok", f"{version[0]} {version[1]}" if version else f"{self.module} (version unknown)")


def distribution_version(*names: str) -> tuple[str, str] | None:
    """(name, version) of the first of these installed distributions, read without importing anything."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class ChildProbe:
    """`python -c code` in a child process prints `expect` as its last line within `timeout_s`: a package that
    imports, or works (math-verify's signal-based timeouts need a real main thread, so it is probed apart)."""

    item: str
    code: str
    expect: str | None
    """None: any output, as long as the code runs."""
    timeout_s: float
    at_start: bool = False

    def check(self) -> Finding:
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-c", self.code], capture_output=True, text=True,
                                  timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Finding("missing", f"no answer within {self.timeout_s:g} s")
        seconds = time.monotonic() - start
        out = proc.stdout.strip().splitlines()
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
            return Finding("missing", f"fails in a child process: {tail[-1][-300:]}")
        last = out[-1] if out else ""
        if self.expect is not None and last != self.expect:
            return Finding("missing", f"answered {last!r} (expected {self.expect!r}) in a child process")
        return Finding("ok", f"{last} ({seconds:.1f} s in a child process)" if self.expect is None else
                       f"works ({seconds:.1f} s in a child process)")


@dataclass(frozen=True)
class CudaDevice:
    """A CUDA device torch can see (index `index`); `auto`: report where training lands."""

    device: str
    """cuda, cuda:N or auto (cuda when there is one, else the CPU)."""
    at_start: bool = False

    @property
    def item(self) -> str:
        return "device"

    def check(self) -> Finding:
        torch = import_paused("torch")  # often the run's first import of torch: with the collector paused

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = (f"torch {torch.__version__} is a CPU build" if torch.version.cuda is None else
                   f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no device "
                   f"(driver? CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
            if self.device == "auto":
                return Finding("warning", f"backend.device=auto trains on the CPU: {why}")
            return Finding("missing", f"backend.device={self.device} needs CUDA: {why}")
        index = int(self.device.partition(":")[2] or 0)
        if index >= count:
            return Finding("missing", f"backend.device={self.device}: torch sees {count} CUDA device(s)")
        props = torch.cuda.get_device_properties(index)
        return Finding("ok", f"backend.device={self.device} trains on cuda:{index} {props.name}, "
                             f"{props.total_memory / 2**30:.1f} GiB")


HUB_PROBE_TIMEOUT_S = 3.0
"""The most one probe of the hub (`unanswered`) waits, name resolution, connection, TLS and answer together."""
TRUE_VALUES = ("1", "ON", "YES", "TRUE")
"""What huggingface_hub reads as true in HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE."""


def hub_offline() -> str | None:
    """The setting that keeps huggingface_hub (and transformers) offline, as `HF_HUB_OFFLINE=1`, or None. Read
    now, as huggingface_hub reads it when imported: HF_HUB_OFFLINE's value, else TRANSFORMERS_OFFLINE's."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(var)
        if value:  # the first one set decides, as `HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE` does there
            return f"{var}={value}" if value.upper() in TRUE_VALUES else None
    return None


def hub_cache() -> str:
    """The hub cache folder from_pretrained reads ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def hub_endpoint() -> str:
    """The hub files are downloaded from: $HF_ENDPOINT, else https://huggingface.co."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT


def unanswered(url: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None when `url` answers a HEAD request (any HTTP status) within `timeout_s`, else why not. The request runs
    in a daemon thread the caller waits for at most `timeout_s`, so a resolver that hangs cannot hold it longer.
    Proxies come from the usual variables (https_proxy, no_proxy); the certificate is not checked (nothing is
    sent but the request line: only whether something answers matters here)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    result: list[str | None] = []

    def head() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s,
                                        context=context):
                result.append(None)
        except urllib.error.HTTPError:  # an HTTP status: something answers
            result.append(None)
        except (OSError, ValueError) as err:  # URLError (refused, no such host, timeout), a malformed URL
            reason = getattr(err, "reason", err)
            result.append(" ".join(str(reason).split()) or type(reason).__name__)

    thread = threading.Thread(target=head, name="rlvr-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return result[0] if result else f"no answer within {timeout_s:g} s"


def unanswered_probe(url: str, timeout_s: float) -> str | None:
    """`unanswered`, its reason saying how long the probe waited (a tracker server's finding)."""
    why = unanswered(url, timeout_s)
    return why if why is None or why.startswith("no answer") else f"{why}, within a {timeout_s:g}-s probe"


@dataclass(frozen=True)
class Threads:
    """No more torch threads than the cores this process may run on (`threads=`, rlvr/threads.py): more only
    wait for each other, and on a shared node slow every other job (threads=1000 on 2 cores: a warm-up ~100×
    slower, a load of ~400)."""

    setting: int | str | None
    at_start: bool = True

    @property
    def item(self) -> str:
        return "threads"

    def check(self) -> Finding:
        from rlvr.threads import resolve, usable_cores

        if self.setting != "auto" and self.setting is not None and (not isinstance(self.setting, int) or isinstance(
                self.setting, bool) or self.setting < 1):
            return Finding("ok", f"threads={self.setting!r}: not a thread count (the config check says so)")
        cores, threads = usable_cores(), resolve(self.setting)  # type: ignore[arg-type]
        if threads is None:
            return Finding("ok", f"torch's default (one per core: {cores})")
        if threads > cores:
            return Finding("missing", f"threads={self.setting} is more than the {cores} cores this process may run "
                                      f"on: set threads={cores} at most (threads=auto runs {resolve('auto')} here)")
        return Finding("ok", f"{threads} torch thread(s) on {cores} usable cores")


FREE_DISK_FLOOR = 256 * 2**20
"""Bytes a run folder needs whatever the model: metrics, samples, logs and a small checkpoint."""


@dataclass(frozen=True)
class FreeDisk:
    """Room for the run: the base weights where they are downloaded (the hub cache, when they are not there yet and
    their size is known) and a checkpoint in the run folder (LoRA: the adapter and its optimizer, small; full
    fine-tuning: the weights and AdamW's two moments, 3× the weights in float32)."""

    folder: str
    name_or_path: str | None
    """model.name_or_path; None for a model built in this process (model=tiny)."""
    revision: str | None
    full_fine_tuning: bool
    at_start: bool = True

    @property
    def item(self) -> str:
        return "disk"

    def check(self) -> Finding:
        import shutil
        from pathlib import Path

        weights, where = weight_bytes(self.name_or_path, self.revision)
        need = FREE_DISK_FLOOR + (3 * weights if self.full_fine_tuning else weights // 20)
        folder = existing_ancestor(Path(self.folder))
        free = shutil.disk_usage(folder).free
        if free < need:
            return Finding("missing", f"{gib(free)} free under {folder}, the run folder's file system; a checkpoint of "
                                      f"this run needs about {gib(need)}: free some space or give the run another "
                                      "hydra.run.dir")
        detail = f"{gib(free)} free under {folder} (a checkpoint needs about {gib(need)})"
        if where == "download":
            return Finding("ok", detail + "; the base weights' download size is not known before it starts")
        return Finding("ok", detail)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def existing_ancestor(path):
    """`path`, or its nearest ancestor that exists (a run folder not made yet)."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def weight_bytes(name_or_path: str | None, revision: str | None) -> tuple[int, str]:
    """(bytes of the model's weight files where they lie now, `local` | `cached` | `download` | `built`)."""
    import os
    from pathlib import Path

    if not name_or_path:
        return 0, "built"
    folder = Path(os.path.expanduser(name_or_path))
    if not folder.is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(name_or_path, "config.json", cache_dir=hub_cache(), revision=revision)
        except Exception:  # noqa: BLE001 - an unreadable cache is the model's own requirement to report
            found = None
        if not isinstance(found, str):
            return 0, "download"
        folder = Path(found).parent
    files = [p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin")]
    return sum(p.stat().st_size for p in files if p.exists()), "local" if folder == Path(name_or_path) else "cached"
