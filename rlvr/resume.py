"""Where a run starts: from scratch, or from the checkpoint its folder already holds.

    resume=auto   continue from `checkpoints/latest` when the folder has one, else start fresh
    resume=never  start fresh; if the folder already holds a run, use a new sibling folder `<dir>.N`
                  (the old run is never touched)
    resume=must   continue, or fail when the folder has no complete checkpoint

The same command continues an interrupted run. Its default folder (conf/train.yaml) is new each time (it ends
in the time), so before starting fresh, `interrupted_run` looks among its siblings (`outputs/<task>/<label>/`)
for the newest run of the same command (`config_id`: the whole composed config, bookkeeping keys included, less
`SAME_COMMAND_MAY_DIFFER` = resume and resume_allow_changes; status.json records it) that was stopped
(preempted), crashed (failed) or killed (status `running`, no live process holding its folder's lock,
rlvr/folder_lock.py) after a complete checkpoint, and the run continues there. A run interrupted before its first
checkpoint, a finished run, or a run of another config (even one that differs only in `trainer.max_steps`) is
never continued that way: the same command starts a new run (and names an interrupted run of another config,
with the keys that differ and the `hydra.run.dir=` that continues it); `resume=never` always starts a new one.

A resume compares the composed config with the one stored in the checkpoint and fails, listing the
changed keys, when anything that affects training differs. Keys that only change bookkeeping
(`SAFE_TO_CHANGE`: more steps, eval/save/log cadence, threads, memory knobs, the logger) may always differ;
`resume_allow_changes` names more (["*"] allows any change).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import socket
import sys
from pathlib import Path

from rlvr.checkpoint import Checkpoints
from rlvr.errors import ConfigError
from rlvr.folder_lock import alive, is_held

SAFE_TO_CHANGE = (
    "trainer.max_steps", "trainer.save_every", "trainer.eval_every", "trainer.log_every", "trainer.keep_last",
    "trainer.samples_per_step", "trainer.max_nonfinite_skips", "trainer.max_skipped_steps", "trainer.evaluate",
    "trainer.max_failed_steps", "trainer.warmup.cache_dir", "threads", "resume", "resume_allow_changes",
    "backend.micro_batch_size", "backend.packing", "backend.max_tokens_per_micro_batch", "backend.device",
    "engine.max_batch_rows", "engine.max_batch_mb", "logger", "trainer.capture_steps",
)
ADDED = {"trainer.partial_rollouts": False}
"""Keys added after runs were stored, with the value that keeps those runs' behaviour: a stored config without the
key resumes under that value as if it had it (a run started before an upgrade continues after it)."""
SAME_COMMAND_MAY_DIFFER = ("resume", "resume_allow_changes")
"""The keys in which a command may differ from an interrupted run's and still continue it by the "same command"
rule: they say how to resume, not what the run is."""

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


def differences(saved: dict, current: dict) -> dict[str, list]:
    """{dotted key: [saved value, current value]} for every key whose value differs (an absent key counts, but for
    one `ADDED` since, at its value then)."""
    old, new = flatten(saved), flatten(current)
    old |= {k: v for k, v in ADDED.items() if k not in old and k in new}
    return {k: [old.get(k, "<absent>"), new.get(k, "<absent>")] for k in sorted(old.keys() | new.keys())
            if old.get(k, "<absent>") != new.get(k, "<absent>")}


def changed_keys(saved: dict, current: dict, allowed: list[str]) -> list[str]:
    """Dotted keys whose values differ (added or removed keys count), minus the allowed ones."""
    if "*" in allowed:
        return []
    free = (*SAFE_TO_CHANGE, *allowed)
    return [k for k in differences(saved, current) if not under(k, free)]


def config_id(config: dict) -> str:
    """What makes a command "the same command" as a run's: a hash of its whole composed config, bookkeeping
    included, less SAME_COMMAND_MAY_DIFFER."""
    kept = {k: v for k, v in flatten(config).items() if not under(k, SAME_COMMAND_MAY_DIFFER)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def interrupted_run(parent: Path, config: dict, fresh: Path) -> Path | None:
    """The newest folder under `parent` (other than `fresh`) whose status.json records a run of this command's
    config (`config_id`) that was interrupted (preempted, failed, or `running` with no live process holding its
    folder) after a complete checkpoint. The newest interrupted run of another config is named in the log, with
    the keys that differ and how to continue it."""
    identity = config_id(config)
    found: list[tuple[float, Path, Path]] = []
    others: list[tuple[float, Path, Path]] = []
    for status_file in parent.glob("*/status.json"):
        folder = status_file.parent
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            continue
        if folder == fresh or not isinstance(status, dict) or not interrupted(folder, status):
            continue
        latest = Checkpoints(folder / "checkpoints", 0).latest()
        if latest is None:
            continue  # stopped before its first checkpoint (or failed at start): nothing to continue
        (found if status.get("config_id") == identity else others).append((status_file.stat().st_mtime, folder,
                                                                           latest))
    if found:
        return max(found)[1]
    if others:
        _, folder, latest = max(others)
        keys = list(differences(Checkpoints.read_state(latest)["config"], config))
        log.info("not continuing the interrupted run in %s: this command differs from it in %s. To continue it, "
                 "add hydra.run.dir=%s (and resume_allow_changes=[...] for keys other than %s)", folder,
                 ", ".join(keys[:6]) + (" …" if len(keys) > 6 else ""), folder, ", ".join(SAFE_TO_CHANGE))
    return None


def interrupted(folder: Path, status: dict) -> bool:
    """Stopped, crashed, or killed: `running` in status.json while no live process holds the folder's lock (or,
    for a run older than the lock, its pid is gone from this host)."""
    if status.get("state") in INTERRUPTED:
        return True
    if status.get("state") != "running":
        return False
    held = is_held(folder)
    return process_gone(status) if held is None else not held


def process_gone(status: dict) -> bool:
    """The run's process no longer exists: it ran on this host and its pid is not alive."""
    if status.get("host") != socket.gethostname() or not isinstance(status.get("pid"), int):
        return False
    return not alive(status["pid"])


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
            f"resume_allow_changes=[{','.join(changed)}] (these may always change on a resume: "
            f"{', '.join(SAFE_TO_CHANGE)})"
        )
    return folder, latest


def fresh_sibling(folder: Path) -> Path:
    """`<folder>.1`, `.2`, …: the first that does not exist (the run's record is written there once accepted)."""
    n = 1
    while folder.with_name(f"{folder.name}.{n}").exists():
        n += 1
    new = folder.with_name(f"{folder.name}.{n}")
    new.mkdir(parents=True)
    return new
