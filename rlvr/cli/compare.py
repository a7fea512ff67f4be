"""`rlvr compare PATH`: a metric per condition across seeds, with 95% Student-t intervals that say their n.

Per run the metric is reduced to one number: `final` = its last value (evaluation rows for `eval/…`,
training rows otherwise), `last-k` = the mean of its last k values; `--reach X` = the first step at which it is
≥ X, fewer steps winning (a run that never reaches X counts as its trainer.max_steps, or its last logged step if
later: a lower bound; the table says how many did not). Per condition: the seeds' values, their
mean and the 95% t-interval of the mean, mean ± t(0.975, n−1)·sd/√n (sd with n−1). Against the baseline
the difference is paired by seed (only seeds both conditions have): the per-seed differences, their mean
and t-interval, and how many seeds it won.

Why Student t, and why at least 3 seeds. Runs are expensive, so n is 2–10 seeds. The t-interval is exact
for normally distributed per-seed values and close for per-seed accuracies over a few hundred items
(tests/cli/test_compare_coverage.py measures 94.8–95.8% coverage at n = 3, 5, 10). On the same draws
the percentile bootstrap this command used before covered about 50% at n = 2, 74% at n = 3, 85% at n = 5
and 90% at n = 10: n resampled values never spread more than the n values do. With 2 seeds the
t-interval covers, but it is the mean ± 12.7 × half their gap, a width resting on one degree of freedom;
so below MIN_SEEDS values no interval is given: the per-seed values are printed with the reason (in
--json: `ci95` null and `no_ci` the reason). Intervals are not clipped to the metric's range.

What is compared. A run's condition is the label of its composed config (rlvr/labels.py), and a cell is
(condition, seed). Before anything is computed, `check_comparable` (rlvr/cli/runs.py) refuses runs whose
configs differ in more than the condition and the seed: within a condition any key but the seed and
bookkeeping (`rlvr.resume.SAFE_TO_CHANGE`), across conditions any key outside the groups that make the
condition. `--ignore-key KEY` (repeatable) leaves a key the user knows does not matter out of that check.

Whether it could find a difference. Under each table, a power line per pair (rlvr/cli/power.py): from the sd of
the paired differences, the smallest |Δ| these seeds detect with the paired t-test at 95% confidence and 80% power,
and with `--detect D` the seeds D needs. Without `--metric`, the metrics are eval/pass@1 and the largest logged
eval/pass@k of a sampled evaluation, else eval/accuracy.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from rlvr.cli.power import power_line, power_of, t_975
from rlvr.cli.runs import CliError, Run, check_comparable, known_metrics, load_runs, require_metric

MIN_SEEDS = 3
DEFAULT_BASELINES = ("grpo", "grpo+none")
METHOD = "t"
METHOD_TEXT = "Student t, mean ± t(0.975, n−1)·sd/√n over seeds"


def t_interval(values: Sequence[float]) -> list[float] | None:
    """95% Student-t interval of the mean of `values`; None for fewer than MIN_SEEDS values."""
    n = len(values)
    if n < MIN_SEEDS:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_975(n - 1) * sd / math.sqrt(n)
    return [mean - half, mean + half]


def no_interval_reason(n: int, paired: bool = False) -> str | None:
    """Why n values get no interval (None when they get one)."""
    if n >= MIN_SEEDS:
        return None
    what = ("paired seed" if paired else "seed") + ("" if n == 1 else "s")
    return f"{n} {what}; an interval needs at least {MIN_SEEDS}"


def reduce_run(run: Run, metric: str, at: str, k: int, reach: float | None = None) -> float | None:
    series = run.series(metric)
    if not series:
        return None
    if reach is not None:  # the first step at or above `reach`; never: the steps it was to run (censored)
        return float(next((step for step, v in series if v >= reach), max(run.max_steps or 0, series[-1][0])))
    values = [v for _, v in series]
    return values[-1] if at == "final" else float(np.mean(values[-k:]))


def reached(run: Run, metric: str, reach: float) -> bool:
    return any(v >= reach for _, v in run.series(metric))


def cells(runs: list[Run], metric: str) -> dict[str, dict[int | None, Run]]:
    """condition → seed → the run that counts for `metric` (one that logged it), conditions sorted. Two runs of
    one condition and seed: the most recently written one counts. `rlvr plot` draws the same runs."""
    table: dict[str, dict[int | None, Run]] = {}
    used: dict[tuple[str, int | None], list[Run]] = {}
    for run in sorted(runs, key=lambda r: r.mtime):
        if run.series(metric):
            table.setdefault(run.condition, {})[run.seed] = run
            used.setdefault((run.condition, run.seed), []).append(run)
    for (condition, seed), same in used.items():
        if len(same) > 1:
            print(f"warning: {condition} seed={seed} has {len(same)} runs; using the newest, {same[-1].path}",
                  file=sys.stderr)
    return dict(sorted(table.items()))


def per_seed(runs: list[Run], metric: str, at: str, k: int, reach: float | None = None
             ) -> dict[str, dict[int | None, float]]:
    """condition → seed → value (`cells`)."""
    return {condition: {seed: cast(float, reduce_run(run, metric, at, k, reach)) for seed, run in by_seed.items()}
            for condition, by_seed in cells(runs, metric).items()}


def pick_baseline(conditions: list[str], requested: str | None) -> str:
    if requested is not None:
        if requested not in conditions:
            raise CliError(f"baseline {requested!r} is not a condition here; conditions: {', '.join(conditions)}")
        return requested
    return next((c for c in DEFAULT_BASELINES if c in conditions), conditions[0])


def _seed_order(seeds) -> list:
    return sorted(seeds, key=lambda s: (s is None, s or 0))


def estimate(seeds: list, values: list[float], paired: bool = False) -> dict:
    """The per-seed values, their mean, and the interval or the reason there is none."""
    return {"n": len(values), "seeds": seeds, "values": values,
            "mean": sum(values) / len(values) if values else None,
            "ci95": t_interval(values), "no_ci": no_interval_reason(len(values), paired)}


def default_metrics(runs: list[Run]) -> list[str]:
    """pass@1 and the largest pass@k of a sampled evaluation where the runs log them, else eval/accuracy."""
    names = known_metrics(runs)
    ks = sorted(int(m.removeprefix("eval/pass@")) for m in names
                if m.startswith("eval/pass@") and m.removeprefix("eval/pass@").isdigit())
    return [f"eval/pass@{k}" for k in sorted({ks[0], ks[-1]})] if ks else ["eval/accuracy"]


def compare(runs: list[Run], metric: str, at: str = "final", k: int = 10, baseline: str | None = None,
            ignore_keys: Sequence[str] = (), detect: float | None = None, reach: float | None = None) -> dict:
    require_metric(runs, metric)
    check_comparable([r for r in runs if reduce_run(r, metric, at, k) is not None], ignore_keys)
    table = per_seed(runs, metric, at, k, reach)
    base = pick_baseline(list(table), baseline)
    by_cell = cells(runs, metric)
    rows = []
    for condition, by_seed in table.items():
        seeds = _seed_order(by_seed)
        row = {"condition": condition, **estimate(seeds, [by_seed[s] for s in seeds])}
        if reach is not None:
            row["unreached"] = sum(not reached(by_cell[condition][s], metric, reach) for s in seeds)
        if condition != base:
            paired = _seed_order(set(by_seed) & set(table[base]))
            diffs = [by_seed[s] - table[base][s] for s in paired]
            wins = sum(d < 0 for d in diffs) if reach is not None else sum(d > 0 for d in diffs)
            row["diff"] = {**estimate(paired, diffs, paired=True), "wins": wins, "power": power_of(diffs, detect)}
        rows.append(row)
    return {"metric": metric, "at": at, "k": k if at == "last-k" else None, "reach": reach, "baseline": base,
            "ci_method": f"{METHOD_TEXT}; none from fewer than {MIN_SEEDS} seeds",
            "ignored_keys": sorted(ignore_keys), "conditions": rows}


def _ci(est: dict, sign: str = "") -> str:
    if est["ci95"] is None:
        return f"none (n={est['n']})"
    low, high = est["ci95"]
    return f"[{low:{sign}.4f}, {high:{sign}.4f}] ({METHOD}, n={est['n']})"


def _values(est: dict, sign: str = "") -> str:
    return ", ".join(f"seed {s}: {v:{sign}.4f}" for s, v in zip(est["seeds"], est["values"], strict=True))


def _columns(table: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]


def render(result: dict) -> str:
    at = "final value" if result["at"] == "final" else f"mean of last {result['k']} values"
    base, reach = result["baseline"], result.get("reach")
    if reach is not None:
        at = f"steps until it is ≥ {reach:g}, fewer winning"
    lines = [f"{result['metric']} ({at} per run); 95% CI: {result['ci_method']}",
             f"baseline: {base} (differences paired by seed)"]
    if result.get("ignored_keys"):
        lines.append(f"config differences ignored (--ignore-key): {', '.join(result['ignored_keys'])}")
    lines.append("")
    table = [("condition", "mean", "95% CI", f"Δ vs {base}", "95% CI", "wins")]
    without = []  # (what, per-seed values) of every estimate too small for an interval
    for r in result["conditions"]:
        d = r.get("diff")
        if d is None:
            tail = ("(baseline)", "", "")
        elif d["mean"] is None:
            tail = ("no shared seeds", "", "")
        else:
            tail = (f"{d['mean']:+.4f}", _ci(d, "+"), f"{d['wins']}/{d['n']}")
        table.append((r["condition"], f"{r['mean']:.4f}", _ci(r), *tail))
        if r["ci95"] is None:
            without.append((r["condition"], _values(r)))
        if d is not None and d["mean"] is not None and d["ci95"] is None:
            without.append((f"{r['condition']} − {base}", _values(d, "+")))
    lines += _columns(table)
    unreached = [f"{r['condition']} {r['unreached']}/{r['n']}" for r in result["conditions"] if r.get("unreached")]
    if unreached:
        lines += ["", f"Never reached {reach:g} (counted at their planned last step, a lower bound): "
                      f"{', '.join(unreached)}"]
    if without:
        lines += ["", f"No interval from fewer than {MIN_SEEDS} seeds: from 2, a 95% t-interval is the mean ± 12.7 × "
                      "half their gap,",
                  "and a percentile-bootstrap one covers the truth about half the time. Per seed:"]
        lines += ["  " + line for line in _columns(without)]
    pairs = [(f"{r['condition']} − {base}:", power_line(r["diff"]["power"])) for r in result["conditions"]
             if r.get("diff") is not None]
    if pairs:
        lines += ["", "Paired t-test power from the seeds' spread (docs/metrics.md#power):"]
        lines += ["  " + line for line in _columns(pairs)]
    return "\n".join(lines)


def run(path: Path, metrics: Sequence[str] | None, at: str, k: int, baseline: str | None, as_json: bool,
        ignore_keys: Sequence[str] = (), detect: float | None = None, reach: float | None = None) -> str:
    """One table per metric (`default_metrics` when none is named); in --json one object, a list for several."""
    runs = load_runs(path)
    results = [compare(runs, metric, at, k, baseline, ignore_keys, detect, reach)
               for metric in metrics or default_metrics(runs)]
    if as_json:
        return json.dumps(results[0] if len(results) == 1 else results, indent=2)
    return "\n\n".join(render(result) for result in results)
