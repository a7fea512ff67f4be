"""Where a run starts: from scratch, or from the checkpoint its folder already holds.

    resume=auto   continue from `checkpoints/latest` when the folder has one, else start fresh
    resume=never  start fresh; if the folder already holds a run, use a new sibling folder `<dir>.N`
                  (the old run is never touched)
    resume=must   continue, or fail when the folder has no complete checkpoint

A resume compares the composed config with the one stored in the checkpoint and fails, listing the
changed keys, when anything that affects training differs. Keys that only change bookkeeping
(`SAFE_TO_CHANGE`: more steps, eval/save/log cadence, threads, memory knobs, the logger) may always differ;
`resume_allow_changes` names more (["*"] allows any change).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlvr.checkpoint import Checkpoints
from rlvr.errors import ConfigError

SAFE_TO_CHANGE = (
    "trainer.max_steps", "trainer.save_every", "trainer.eval_every", "trainer.log_every", "trainer.keep_last",
    "trainer.samples_per_step", "trainer.max_nonfinite_skips", "trainer.warmup.cache_dir", "threads", "resume",
    "resume_allow_changes", "backend.micro_batch_size", "backend.device", "engine.max_batch_rows", "logger",
)


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


def changed_keys(saved: dict, current: dict, allowed: list[str]) -> list[str]:
    """Dotted keys whose values differ (added or removed keys count), minus the allowed ones."""
    old, new = flatten(saved), flatten(current)
    if "*" in allowed:
        return []
    free = (*SAFE_TO_CHANGE, *allowed)
    return sorted(
        k for k in old.keys() | new.keys()
        if old.get(k, "<absent>") != new.get(k, "<absent>") and not any(k == f or k.startswith(f + ".") for f in free)
    )


def holds_a_run(folder: Path) -> bool:
    return (folder / "metrics.jsonl").exists() or (folder / "checkpoints").exists()


def resume_point(mode: str, folder: Path, config: dict, allowed: list[str]) -> tuple[Path, Path | None]:
    """(the folder to run in, the checkpoint to continue from or None)."""
    if mode not in ("auto", "never", "must"):
        raise ResumeError(f"resume={mode!r}: expected auto, never or must")
    latest = Checkpoints(folder / "checkpoints", 0).latest()
    if mode == "never":
        return (fresh_sibling(folder) if holds_a_run(folder) else folder), None
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
