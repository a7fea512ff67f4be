"""`rlvr compare PATH`: a metric per condition across seeds, with percentile-bootstrap 95% intervals.

Per run the metric is reduced to one number: `final` = its last value (evaluation rows for `eval/…`,
training rows otherwise), `last-k` = the mean of its last k values. Per condition: n seeds, the mean, and a
percentile bootstrap CI of the mean (10,000 resamples of the seeds, numpy `default_rng(0)`, so the output
is identical on every call). Against the baseline the difference is paired by seed (only seeds both
conditions have): mean of per-seed differences and its bootstrap CI, plus how many seeds it won. A CI needs
n >= 2; with fewer it is reported as null/—.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rlvr.cli.runs import CliError, Run, load_runs, require_metric

RESAMPLES = 10_000
RNG_SEED = 0
DEFAULT_BASELINES = ("grpo", "grpo+none")


def reduce_run(run: Run, metric: str, at: str, k: int) -> float | None:
    values = [v for _, v in run.series(metric)]
    if not values:
        return None
    return values[-1] if at == "final" else float(np.mean(values[-k:]))


def bootstrap_ci(values: list[float], resamples: int = RESAMPLES, seed: int = RNG_SEED) -> list[float] | None:
    """Percentile bootstrap 95% CI of the mean; None for fewer than 2 values."""
    if len(values) < 2:
        return None
    data = np.asarray(values, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    means = data[idx].mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def per_seed(runs: list[Run], metric: str, at: str, k: int) -> dict[str, dict[int | None, float]]:
    """condition → seed → value. Two runs of one condition and seed: the most recently written one counts."""
    table: dict[str, dict[int | None, float]] = {}
    used: dict[tuple[str, int | None], list[Run]] = {}
    for run in sorted(runs, key=lambda r: r.mtime):
        value = reduce_run(run, metric, at, k)
        if value is not None:
            table.setdefault(run.condition, {})[run.seed] = value
            used.setdefault((run.condition, run.seed), []).append(run)
    for (condition, seed), same in used.items():
        if len(same) > 1:
            print(f"warning: {condition} seed={seed} has {len(same)} runs; using the newest, {same[-1].path}",
                  file=sys.stderr)
    return dict(sorted(table.items()))


def pick_baseline(conditions: list[str], requested: str | None) -> str:
    if requested is not None:
        if requested not in conditions:
            raise CliError(f"baseline {requested!r} is not a condition here; conditions: {', '.join(conditions)}")
        return requested
    return next((c for c in DEFAULT_BASELINES if c in conditions), conditions[0])


def compare(runs: list[Run], metric: str, at: str = "final", k: int = 10, baseline: str | None = None) -> dict:
    require_metric(runs, metric)
    table = per_seed(runs, metric, at, k)
    base = pick_baseline(list(table), baseline)
    rows = []
    for condition, seeds in table.items():
        values = list(seeds.values())
        row = {"condition": condition, "n": len(values), "seeds": sorted(seeds, key=lambda s: (s is None, s or 0)),
               "mean": float(np.mean(values)), "ci95": bootstrap_ci(values), "values": values}
        if condition != base:
            paired = sorted(set(seeds) & set(table[base]), key=lambda s: (s is None, s or 0))
            diffs = [seeds[s] - table[base][s] for s in paired]
            row["diff"] = {
                "n_paired": len(diffs),
                "mean": float(np.mean(diffs)) if diffs else None,
                "ci95": bootstrap_ci(diffs),
                "wins": sum(d > 0 for d in diffs),
            }
        rows.append(row)
    return {"metric": metric, "at": at, "k": k if at == "last-k" else None, "baseline": base,
            "ci_method": f"percentile bootstrap, {RESAMPLES} resamples, numpy default_rng({RNG_SEED})",
            "conditions": rows}


def _ci(ci: list[float] | None) -> str:
    return "—" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def render(result: dict) -> str:
    at = "final value" if result["at"] == "final" else f"mean of last {result['k']} values"
    lines = [f"{result['metric']} ({at} per run); 95% CI: {result['ci_method']}",
             f"baseline: {result['baseline']} (differences paired by seed)", ""]
    table = [("condition", "n", "mean", "95% CI", "Δ vs baseline", "95% CI", "wins")]
    for r in result["conditions"]:
        d = r.get("diff")
        if d is None:
            tail = ("(baseline)", "", "")
        elif d["mean"] is None:
            tail = ("no shared seeds", "", "")
        else:
            tail = (f"{d['mean']:+.4f}", _ci(d["ci95"]), f"{d['wins']}/{d['n_paired']}")
        table.append((r["condition"], str(r["n"]), f"{r['mean']:.4f}", _ci(r["ci95"]), *tail))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in table]
    return "\n".join(lines)


def run(path: Path, metric: str, at: str, k: int, baseline: str | None, as_json: bool) -> str:
    result = compare(load_runs(path), metric, at, k, baseline)
    return json.dumps(result, indent=2) if as_json else render(result)
