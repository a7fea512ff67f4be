"""Finding run folders under a path and reading them into `Run` records.

A run folder is any folder holding `metrics.jsonl` or `.hydra/config.yaml` (rlvr/outputs.py); the walk
does not descend into one, so `checkpoints/` and `samples/` are never mistaken for runs. Nothing here needs
a campaign's `manifest.json`.

A run's condition is `rlvr.labels.condition_label` of its composed config (`.hydra/config.yaml`), never the
name of a Hydra choice (`condition=grpo algorithm=reinforce_pp` trains REINFORCE++ and is labelled so); only
a folder without a readable config falls back to the `condition` of its metrics rows, then `?`.
`check_comparable` is the rule `rlvr compare` and `rlvr plot` apply before putting runs side by side.

State rule (`Run.state`), applied to what `status.json` says:
    finished | failed | preempted   as written.
    running                         `dead` when no live process holds the folder's lock (rlvr/folder_lock.py; a
                                    run older than the lock: its pid is not alive on this very host);
                                    else `stale` when no file of the run changed for `stale_after_s`
                                    (default 1800 s: longer than a slow step plus an evaluation);
                                    else `running`.
    no status.json                  `finished` with a summary.json; otherwise `running`/`stale` by age, or
                                    `pending` when there are no metrics at all.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlvr.errors import CliError as CliError  # the commands' failure, raised by their helpers outside rlvr/cli
from rlvr.folder_lock import alive, is_held
from rlvr.labels import condition_label

STALE_AFTER_S = 1800.0
_WATCHED_FILES = ("metrics.jsonl", "warmup.jsonl", "status.json", "summary.json", "train.log")


@dataclass
class Run:
    path: Path
    condition: str
    seed: int | None
    max_steps: int | None
    train_rows: list[dict] = field(default_factory=list)
    eval_rows: list[dict] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    summary: dict | None = None
    mtime: float = 0.0
    """Newest modification time of the run's files: the last sign of life."""
    bad_lines: int = 0
    """Lines of metrics.jsonl that did not parse (a run killed mid-write leaves one)."""
    warmup: tuple[int, int] | None = None
    """(steps done, steps) of the SFT warm-up, from warmup.jsonl's last row; None without one."""
    config: dict = field(default_factory=dict)
    """The composed config the run was built from (`.hydra/config.yaml`); {} when missing or unreadable."""

    @property
    def steps_done(self) -> int:
        return max((int(r["step"]) + 1 for r in self.train_rows), default=0)

    def state(self, now: float | None = None, stale_after_s: float = STALE_AFTER_S) -> str:
        age = (time.time() if now is None else now) - self.mtime
        written = self.status.get("state")
        if written is None:
            if self.summary is not None:
                return "finished"
            if not self.train_rows and not self.eval_rows:
                return "pending"
            return "stale" if age > stale_after_s else "running"
        if written != "running":
            return str(written)
        if not process_holds(self.path, self.status):
            return "dead"
        return "stale" if age > stale_after_s else "running"

    def series(self, metric: str) -> list[tuple[int, float]]:
        """(step, value) of every row holding `metric` as a finite number, one per step (the last row of a
        step wins), in step order. Evaluation metrics (`eval/…`) come from evaluation rows only."""
        rows = self.eval_rows if metric.startswith("eval/") else self.train_rows
        by_step: dict[int, float] = {}
        for row in rows:
            value = as_number(row.get(metric))
            if value is not None and "step" in row:
                by_step[int(row["step"])] = value
        return sorted(by_step.items())


def as_number(value) -> float | None:
    """A finite float, or None: booleans, strings and the writer's "nan"/"inf" strings are not numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def process_holds(folder: Path, status: dict) -> bool:
    """A live process holds the run: its folder's lock is taken (from any host of a shared file system); for a run
    older than the lock, its pid is alive or not on this host (missing evidence does not make a run dead)."""
    held = is_held(folder)
    if held is not None:
        return held
    pid = status.get("pid")
    if status.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return True
    return alive(pid)


def find_run_dirs(root: Path) -> list[Path]:
    """Every run folder at or under `root`, sorted; raises CliError (exit 2) when there is none."""
    root = Path(root)
    if not root.exists():
        raise CliError(f"{root}: no such file or directory")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if "metrics.jsonl" in filenames or (here / ".hydra" / "config.yaml").is_file():
            found.append(here)
            dirnames.clear()
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    if not found:
        raise CliError(f"no run folders under {root} (a run folder holds metrics.jsonl or .hydra/config.yaml)")
    return sorted(found)


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_warmup(path: Path) -> tuple[int, int] | None:
    """(steps done, steps) from the last complete row of warmup.jsonl (rlvr/warmup.py writes `step` and
    `steps` in each; a row naming where the result was loaded from counts as all steps done)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("steps"), int) and isinstance(row.get("step"), int):
            return min(row["step"] + ("loss" in row), row["steps"]), row["steps"]
    return None


def read_metrics(path: Path) -> tuple[list[dict], list[dict], int]:
    """(training rows, evaluation rows, unparsable lines). A row with `eval/accuracy` is an evaluation row,
    as in `RunDir.truncate`."""
    train: list[dict] = []
    evals: list[dict] = []
    bad = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return train, evals, bad
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict) and "step" in row:
            (evals if "eval/accuracy" in row else train).append(row)
    return train, evals, bad


def _condition(config: dict, train_rows: list[dict]) -> str:
    """`condition_label` of the composed config; without one, what the metrics rows say; else `?`."""
    if config:
        return condition_label(config)
    for row in train_rows:
        if row.get("condition"):
            return str(row["condition"])
    return "?"


def _seed(config: dict, path: Path) -> int | None:
    if isinstance(config.get("seed"), int):
        return config["seed"]
    if path.name.startswith("seed="):  # the campaign layout names it even before .hydra/ is written
        try:
            return int(path.name.removeprefix("seed="))
        except ValueError:
            return None
    return None


def load_run(path: Path) -> Run:
    config = _read_yaml(path / ".hydra" / "config.yaml")
    train, evals, bad = read_metrics(path / "metrics.jsonl")
    status = _read_json(path / "status.json") or {}
    max_steps = status.get("max_steps") or (config.get("trainer") or {}).get("max_steps")
    mtimes = [(path / name).stat().st_mtime for name in _WATCHED_FILES if (path / name).exists()]
    return Run(
        path=path,
        condition=_condition(config, train),
        seed=_seed(config, path),
        max_steps=max_steps if isinstance(max_steps, int) else None,
        train_rows=train,
        eval_rows=evals,
        status=status,
        summary=_read_json(path / "summary.json"),
        mtime=max(mtimes, default=path.stat().st_mtime),
        bad_lines=bad,
        warmup=read_warmup(path / "warmup.jsonl"),
        config=config,
    )


def load_runs(root: Path) -> list[Run]:
    """Every run under `root`, sorted by condition, then seed, then folder."""
    runs = [load_run(p) for p in find_run_dirs(Path(root))]
    return sorted(runs, key=lambda r: (r.condition, r.seed is None, r.seed or 0, str(r.path)))


def known_metrics(runs: list[Run]) -> list[str]:
    names: set[str] = set()
    for run in runs:
        for row in run.train_rows + run.eval_rows:
            names.update(k for k, v in row.items() if k != "step" and as_number(v) is not None)
    return sorted(names)


def require_metric(runs: list[Run], metric: str) -> None:
    names = known_metrics(runs)
    if metric not in names:
        raise CliError(f"unknown metric {metric!r}; the runs have: {', '.join(names) or '(none)'}")


def label(run: Run, root: Path) -> str:
    try:
        rel = run.path.relative_to(root)
    except ValueError:
        rel = run.path
    return str(rel) if str(rel) != "." else run.path.name



CONDITION_GROUPS = ("algorithm", "transform", "turn_credit", "trainer.dynamic_sampling", "trainer.max_sample_batches",
                    "trainer.overlong", "trainer.off_policy_steps", "trainer.off_policy_mode",
                    "trainer.partial_rollouts", "distill")
"""The config groups and keys `condition_label` reads (a recipe such as `condition=dapo` sets the trainer's dynamic
sampling and overlong handling): they may differ between conditions (and `backend`, where the conditions' backends
differ); every other key must be equal, or it is not the condition that is compared."""
MAX_KEYS_SHOWN = 6
"""Differing keys named per condition (a different model or dataset differs in many; the first few say enough)."""
_ABSENT = object()


def _under(key: str, prefixes) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _shown(value) -> str:
    if value is _ABSENT:
        return "absent"
    return "null" if value is None else json.dumps(value) if isinstance(value, list | dict) else str(value)


def _differences(runs: list[Run], flat: dict[int, dict], skip) -> dict[str, dict[str, list[Run]]]:
    """key → shown value → the runs holding it, for each key (not `skip`ped) whose value is not the same in all."""
    out = {}
    for key in sorted({k for r in runs for k in flat[id(r)] if not skip(k)}):
        by_value: dict[str, list[Run]] = {}
        for run in runs:
            by_value.setdefault(_shown(flat[id(run)].get(key, _ABSENT)), []).append(run)
        if len(by_value) > 1:
            out[key] = by_value
    return out


def _listed(items: list[str], noun: str) -> list[str]:
    more = len(items) - MAX_KEYS_SHOWN
    return items[:MAX_KEYS_SHOWN] + ([f"and {more} more {noun}{'s' if more > 1 else ''}"] if more > 0 else [])


def check_comparable(runs: list[Run], ignore_keys=()) -> None:
    """Refuse (CliError, exit 2) to put side by side runs whose configs differ in more than what is compared.

    A cell is (condition, seed). Within one condition, runs must have equal configs but for `seed` and the
    keys that do not change what is learnt (`rlvr.resume.SAFE_TO_CHANGE`: step count, eval/save/log cadence,
    threads, resume, logger, …); across conditions, every key outside the groups that make the condition
    (`CONDITION_GROUPS`, and `backend` where the conditions' backends differ) must be equal too: grpo at one
    learning rate against maxrl at another is not a comparison of algorithms. `ignore_keys` (and everything
    under them) are left out. Runs with no readable config are not checked. Two runs of one cell with equal
    configs (a repeated run) pass: the caller uses the newest. The message names, per condition, each
    differing key with its values and a folder holding each value."""
    from rlvr.labels import name
    from rlvr.resume import SAFE_TO_CHANGE, flatten  # here, not at the top: `rlvr status` stays free of numpy

    checked = [r for r in runs if r.config]
    free = ("seed", *SAFE_TO_CHANGE, "resume_allow_changes", *ignore_keys)
    flat = {id(r): flatten(r.config) for r in checked}
    conditions = sorted({r.condition for r in checked})
    problems: list[str] = []
    keys: list[str] = []
    for condition in conditions:
        within = _differences([r for r in checked if r.condition == condition], flat, lambda k: _under(k, free))
        keys += within
        parts = [f"{key} (" + ", ".join(f"{value} in {held[0].path}" for value, held in values.items()) + ")"
                 for key, values in within.items()]
        if parts:
            problems.append(f"runs of {condition} differ in {', '.join(_listed(parts, 'key'))}")
    if len(conditions) > 1:
        groups = CONDITION_GROUPS + (("backend",) if len({name(r.config.get("backend")) for r in checked}) > 1
                                     else ())
        parts = []
        for key, values in _differences(checked, flat, lambda k: _under(k, (*free, *groups))).items():
            if key in keys:  # already named for the condition(s) it differs within
                continue
            keys.append(key)
            parts.append(f"{key} (" + "; ".join(
                f"{value} in {', '.join(dict.fromkeys(r.condition for r in held))}, e.g. {held[0].path}"
                for value, held in values.items()) + ")")
        if parts:
            which = " and ".join(conditions) if len(conditions) < 4 else f"the {len(conditions)} conditions"
            outside = ", ".join(groups)
            problems.append(f"runs of {which} differ outside {outside}, in {', '.join(_listed(parts, 'key'))}")
    if not problems:
        return
    keys = list(dict.fromkeys(keys))
    hint = "compare runs of one setting, or pass " + " ".join(f"--ignore-key {k}" for k in keys[:MAX_KEYS_SHOWN])
    hint += " …" if len(keys) > MAX_KEYS_SHOWN else ""
    if len(problems) == 1:
        raise CliError(f"{problems[0]}; {hint}")
    raise CliError("the runs' configs differ:\n" + "".join(f"  {p}\n" for p in problems) + hint)
