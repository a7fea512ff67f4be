"""Where a run starts: from scratch, or from the checkpoint its folder already holds.

    resume=auto   continue from `checkpoints/latest` when the folder has one, else start fresh
    resume=never  start fresh; if the folder already holds a run, use a new sibling folder `<dir>.N`
                  (the old run is never touched)
    resume=must   continue, or fail when the folder has no complete checkpoint

The same command continues an interrupted run. Its default folder (conf/train.yaml) is new each time (it ends
in the time), so before starting fresh, `interrupted_run` looks among its siblings (`outputs/<task>/<label>/`)
for the newest run of the same config (`config_id`: the composed config without the keys that may change on a
resume, as status.json records it) that was stopped (preempted), crashed (failed) or killed (status `running`,
its process gone from this host), and the run continues there. A finished run is never continued that way
(the same command then starts a new run); `resume=never` always starts a new one.

A resume compares the composed config with the one stored in the checkpoint and fails, listing the
changed keys, when anything that affects training differs. Keys that only change bookkeeping
(`SAFE_TO_CHANGE`: more steps, eval/save/log cadence, threads, memory knobs, the logger) may always differ;
`resume_allow_changes` names more (["*"] allows any change).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

from rlvr.checkpoint import Checkpoints
from rlvr.errors import ConfigError

SAFE_TO_CHANGE = (
    "trainer.max_steps", "trainer.save_every", "trainer.eval_every", "trainer.log_every", "trainer.keep_last",
    "trainer.samples_per_step", "trainer.max_nonfinite_skips", "trainer.max_skipped_steps", "trainer.evaluate",
    "trainer.max_failed_steps", "trainer.warmup.cache_dir", "threads", "resume", "resume_allow_changes",
    "backend.micro_batch_size", "backend.packing", "backend.max_tokens_per_micro_batch", "backend.device",
    "engine.max_batch_rows", "engine.max_batch_mb", "logger", "trainer.capture_steps",
)


log = logging.getLogger("rlvr")
INTERRUPTED = ("preempted", "failed")
"""status.json states of a run the same command continues (and `running` when its process is gone)."""


class ResumeError(ConfigError):
    """The run folder and the `resume` setting disagree; the message says how (printed as a config error)."""


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def under(key: str, prefixes) -> bool:
    """`key` is one of `prefixes` or inside one (trainer.warmup.steps is under trainer.warmup)."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def changed_keys(saved: dict, current: dict, allowed: list[str]) -> list[str]:
    """Dotted keys whose values differ (added or removed keys count), minus the allowed ones."""
    old, new = flatten(saved), flatten(current)
    if "*" in allowed:
        return []
    free = (*SAFE_TO_CHANGE, *allowed)
    return sorted(
        k for k in old.keys() | new.keys()
        if old.get(k, "<absent>") != new.get(k, "<absent>") and not under(k, free)
    )


def config_id(config: dict) -> str:
    """What makes two runs the same run: a hash of the composed config without the keys a resume may change."""
    kept = {k: v for k, v in flatten(config).items() if not under(k, SAFE_TO_CHANGE)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def interrupted_run(parent: Path, identity: str, fresh: Path) -> Path | None:
    """The newest folder under `parent` (other than `fresh`) whose status.json records a run of config `identity`
    that was interrupted: preempted, failed, or `running` with its process gone from this host."""
    found = []
    for status_file in parent.glob("*/status.json"):
        folder = status_file.parent
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            continue
        if folder == fresh or not isinstance(status, dict) or status.get("config_id") != identity:
            continue
        if status.get("state") in INTERRUPTED or (status.get("state") == "running" and process_gone(status)):
            found.append((status_file.stat().st_mtime, folder))
    return max(found)[1] if found else None


def process_gone(status: dict) -> bool:
    """The run's process no longer exists: it ran on this host and its pid is not alive."""
    if status.get("host") != socket.gethostname() or not isinstance(status.get("pid"), int):
        return False
    try:
        os.kill(status["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def resume_command() -> str:
    """The command that continues this run: the one that started it, when it was train.py."""
    if sys.argv and Path(sys.argv[0]).name == "train.py":
        return shlex.join(["python", *sys.argv])
    return "the same command"


def holds_a_run(folder: Path) -> bool:
    return (folder / "metrics.jsonl").exists() or (folder / "checkpoints").exists()


def resume_point(mode: str, folder: Path, config: dict, allowed: list[str]) -> tuple[Path, Path | None]:
    """(the folder to run in, the checkpoint to continue from or None)."""
    if mode not in ("auto", "never", "must"):
        raise ResumeError(f"resume={mode!r}: expected auto, never or must")
    latest = Checkpoints(folder / "checkpoints", 0).latest()
    if mode == "never":
        folder = fresh_sibling(folder) if holds_a_run(folder) else folder
        log.info("resume=never: a new run in %s", folder)
        return folder, None
    if latest is None:
        if mode == "must":
            raise ResumeError(f"resume=must, but {folder / 'checkpoints'} holds no complete checkpoint to continue")
        return folder, None
    changed = changed_keys(Checkpoints.read_state(latest)["config"], config, allowed)
    if changed:
        raise ResumeError(
            f"cannot resume {latest}: these keys differ from the checkpoint's config: {', '.join(changed)}. "
            "Start a new run (resume=never, or another hydra.run.dir), or allow them explicitly with "
            f"resume_allow_changes=[{','.join(changed)}]"
        )
    return folder, latest


def fresh_sibling(folder: Path) -> Path:
    """`<folder>.1`, `.2`, …: the first that does not exist, with Hydra's `.hydra/` record copied in."""
    n = 1
    while folder.with_name(f"{folder.name}.{n}").exists():
        n += 1
    new = folder.with_name(f"{folder.name}.{n}")
    new.mkdir(parents=True)
    if (folder / ".hydra").is_dir():
        shutil.copytree(folder / ".hydra", new / ".hydra")
    return new
