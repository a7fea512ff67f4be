"""`rlvr status PATH`: one row per run (condition, seed, progress, latest reward and held-out accuracy,
state, time since its files last changed) and a count per state. State rule: `rlvr/cli/runs.py`."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from rlvr.cli.runs import STALE_AFTER_S, CliError, Run, as_number, label, load_runs

STATE_ORDER = ("running", "stale", "dead", "failed", "preempted", "pending", "finished")
REASON_WIDTH = 60
"""Characters of a failure's reason the table shows: its first line, cut with "…" (`--json` has it whole)."""


def first_line(text: str, width: int = REASON_WIDTH) -> str:
    """The first non-blank line of `text`, stripped, at most `width` characters (ending in "…" when cut, or
    when more lines follow): a ConfigError listing keys or a traceback must not break the table's rows."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0]
    if len(line) > width:
        return line[:width - 1].rstrip() + "…"
    return line + (" …" if len(lines) > 1 else "")


def age_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def run_row(run: Run, root: Path, now: float, stale_after_s: float) -> dict:
    last = run.train_rows[-1] if run.train_rows else {}
    reward_key = "mean_reward" if as_number(last.get("mean_reward")) is not None else "correct_rate"
    evals = run.series("eval/accuracy")
    return {
        "condition": run.condition,
        "seed": run.seed,
        "step": run.steps_done,
        "max_steps": run.max_steps,
        "warmup_step": run.warmup[0] if run.warmup else None,
        "warmup_steps": run.warmup[1] if run.warmup else None,
        "reward_metric": reward_key,
        "reward": as_number(last.get(reward_key)),
        "eval_accuracy": evals[-1][1] if evals else None,
        "eval_step": evals[-1][0] if evals else None,
        "state": run.state(now, stale_after_s),
        "written_state": run.status.get("state"),
        "reason": run.status.get("reason"),
        "age_s": round(now - run.mtime, 1),
        "slurm_job_id": run.status.get("slurm_job_id"),
        "pack": run.status.get("pack"),
        "bad_lines": run.bad_lines,
        "folder": label(run, root),
    }


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def render(rows: list[dict]) -> str:
    header = ("condition", "seed", "step", "reward", "eval acc", "state", "updated", "folder")
    table = [header]
    for r in rows:
        step = f"{r['step']}/{r['max_steps'] if r['max_steps'] is not None else '?'}"
        if r.get("warmup_steps") and r["warmup_step"] < r["warmup_steps"] and r["step"] == 0:
            step = f"warm-up {r['warmup_step']}/{r['warmup_steps']}"
        acc = "—" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.3f} @{r['eval_step']}"
        reason = first_line(r["reason"]) if r["reason"] and r["state"] != "finished" else ""
        state = r["state"] + (f" ({reason})" if reason else "")
        table.append((
            r["condition"], "—" if r["seed"] is None else str(r["seed"]), step, _fmt(r["reward"]), acc,
            state, f"{age_text(r['age_s'])} ago", r["folder"] + (f"  (pack {r['pack']})" if r.get("pack") else ""),
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in table]
    counts = Counter(r["state"] for r in rows)
    order = [s for s in STATE_ORDER if s in counts] + sorted(set(counts) - set(STATE_ORDER))
    lines.append(f"{len(rows)} runs: " + ", ".join(f"{counts[s]} {s}" for s in order))
    return "\n".join(line.rstrip() for line in lines)


def manifest_rows(path: Path, rows: list[dict]) -> list[dict]:
    """Runs a campaign's manifest.json lists whose folder does not exist yet (not started)."""
    manifest = path / "manifest.json"
    if not manifest.is_file():
        return []
    data = json.loads(manifest.read_text())
    seen = {r["folder"] for r in rows}
    return [
        {
            "condition": entry["condition"], "seed": entry["seed"], "step": 0, "max_steps": data.get("max_steps"),
            "warmup_step": None, "warmup_steps": None,
            "reward_metric": None, "reward": None, "eval_accuracy": None, "eval_step": None,
            "state": entry.get("state") or "pending", "written_state": entry.get("state"), "reason": None,
            "age_s": round(time.time() - manifest.stat().st_mtime, 1), "slurm_job_id": entry.get("slurm_job_id"),
            "bad_lines": 0, "folder": f"{entry['condition']}/seed={entry['seed']}",
        }
        for entry in data.get("runs", [])
        if f"{entry['condition']}/seed={entry['seed']}" not in seen
    ]


def run(path: Path, as_json: bool = False, stale_after_s: float = STALE_AFTER_S) -> str:
    now = time.time()
    try:
        runs = load_runs(path)
    except CliError:
        if not (path / "manifest.json").is_file():
            raise
        runs = []  # a campaign whose runs have not started yet
    rows = [run_row(r, path, now, stale_after_s) for r in runs]
    rows += manifest_rows(path, rows)
    if as_json:
        counts = Counter(r["state"] for r in rows)
        return json.dumps({"root": str(path), "runs": rows, "counts": dict(sorted(counts.items()))}, indent=2)
    return render(rows)
