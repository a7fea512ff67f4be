"""The MaxRL maze table beside rlvr's, from a `campaign=maxrl_maze` folder (docs/maze.md#the-campaign).

    python train.py campaign=maxrl_maze hydra/launcher=slurm ...     # the campaign: the long part (~2 h on 2 cores)
    .venv/bin/python -m bench.maze                                   # reads outputs/maxrl_maze/cpu
    .venv/bin/python -m bench.maze outputs/maxrl_maze/paper --json

Per method (the paper's names; RLOO is not in its table): the paper's pass@1 / pass@128 / pass@256 (arXiv
2602.02710, "Performance comparison across methods in maze", 17 × 17 mazes), then rlvr's pass@1 and pass@K at
the largest K every run measured at its last evaluation, each the mean over seeds with its 95% Student-t
interval, and the difference from GRPO paired by seed, as `rlvr compare --baseline grpo+none,scale=std` computes
them (rlvr/cli/compare.py: the same runs, the same refusals). Under the table: the warm-up's pass@1 (the first
evaluation, the same for every method of a seed), the paper's ordering MaxRL > PKPO > GRPO + entropy > GRPO
checked pair by pair (each adjacent pair's paired interval), the power line of MaxRL − GRPO, and the campaign's
wall time (its first run's first log line to its last run's summary) with the runs' own wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import datetime
from pathlib import Path

from rlvr.cli.compare import compare
from rlvr.cli.power import power_line
from rlvr.cli.runs import Run, load_runs

PAPER = {  # method → (pass@1, pass@128, pass@256), percent
    "GRPO": (39.6, 42.4, 43.0),
    "GRPO + entropy bonus": (47.2, 53.4, 54.0),
    "PKPO": (74.5, 77.6, 77.9),
    "MaxRL": (84.4, 92.0, 94.3),
}
ORDER = ["GRPO", "GRPO + entropy bonus", "PKPO", "MaxRL"]
"""The paper's ordering, worst to best."""
BASELINE = "GRPO"
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")


def method(label: str) -> str:
    """The paper's name for a run's condition label (rlvr/labels.py), or the label itself."""
    if label.startswith("grpo+none,scale=std,ent="):
        return "GRPO + entropy bonus"
    if label == "grpo+none,scale=std":
        return "GRPO"
    if label.startswith("pkpo+none"):
        return "PKPO"
    return {"maxrl+none": "MaxRL", "rloo+none": "RLOO"}.get(label, label)


def largest_k(runs: list[Run]) -> int:
    """The largest K whose eval/pass@K every run logged at its last evaluation."""
    common = None
    for run in runs:
        last = run.eval_rows[-1] if run.eval_rows else {}
        ks = {int(key.split("@")[1]) for key in last if key.startswith("eval/pass@")}
        common = ks if common is None else common & ks
    if not common:
        raise SystemExit("bench.maze: no run has a sampled evaluation (eval/pass@k) at its end")
    return max(common)


def wall(runs: list[Run]) -> dict:
    """The campaign's span (first train.log line to the last summary.json) and the runs' summed wall seconds."""
    starts, ends, seconds = [], [], 0.0
    for run in runs:
        log = run.path / "train.log"
        first = log.open().readline() if log.is_file() else ""
        if (m := _STAMP.match(first)) is not None:
            starts.append(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S").timestamp())
        if run.summary is not None:
            ends.append(os.path.getmtime(run.path / "summary.json"))
            seconds += float(run.summary.get("wall_seconds") or 0.0)
    finished = sum(run.summary is not None for run in runs)
    return {"span_s": max(ends) - min(starts) if starts and ends else None, "runs_wall_s": seconds,
            "finished": finished, "runs": len(runs)}


def table(path: Path) -> dict:
    runs = load_runs(path)
    labels = {run.condition for run in runs}
    base = next((label for label in labels if method(label) == BASELINE), None)
    if base is None:
        raise SystemExit(f"bench.maze: no GRPO run (condition grpo_scaled) under {path}")
    k = largest_k(runs)
    results = {metric: compare(runs, metric, baseline=base, detect=0.05)
               for metric in ("eval/pass@1", f"eval/pass@{k}")}
    initial = [run.eval_rows[0]["eval/pass@1"] for run in runs if run.eval_rows and "eval/pass@1" in run.eval_rows[0]]
    by_method = {method(label): label for label in labels}
    steps = []
    for lower, upper in zip(ORDER, ORDER[1:], strict=False):
        if lower in by_method and upper in by_method:
            for metric in results:
                row = next(r for r in compare(runs, metric, baseline=by_method[lower])["conditions"]
                           if r["condition"] == by_method[upper])
                steps.append({"pair": f"{upper} − {lower}", "metric": metric, "mean": row["diff"]["mean"],
                              "ci95": row["diff"]["ci95"], "n": row["diff"]["n"]})
    return {"path": str(path), "k": k, "results": results, "initial_pass1": initial, "ordering": steps,
            "wall": wall(runs)}


def fmt(est: dict, scale: float = 100.0, sign: bool = False) -> str:
    if est["mean"] is None:
        return "—"
    mean = f"{est['mean'] * scale:+.1f}" if sign else f"{est['mean'] * scale:.1f}"
    ci = est["ci95"]
    return mean + (f" [{ci[0] * scale:+.1f}, {ci[1] * scale:+.1f}]" if sign and ci else
                   f" [{ci[0] * scale:.1f}, {ci[1] * scale:.1f}]" if ci else f" (n={est['n']}, no interval)")


def render(result: dict) -> str:
    k = result["k"]
    one, big = result["results"]["eval/pass@1"], result["results"][f"eval/pass@{k}"]
    rows = {r["condition"]: r for r in one["conditions"]}
    rows_k = {r["condition"]: r for r in big["conditions"]}
    names = sorted(rows, key=lambda c: (ORDER.index(method(c)) if method(c) in ORDER else len(ORDER), c))
    lines = [f"| method | paper pass@1 | paper pass@128 | paper pass@256 | rlvr pass@1 | rlvr pass@{k} | "
             f"Δ pass@1 vs GRPO | Δ pass@{k} vs GRPO |", "|---|---|---|---|---|---|---|---|"]
    for c in names:
        paper = PAPER.get(method(c))
        cells = [f"{v:.1f}" for v in paper] if paper else ["—"] * 3
        diff1 = fmt(rows[c]["diff"], sign=True) if "diff" in rows[c] else "(baseline)"
        diffk = fmt(rows_k[c]["diff"], sign=True) if c in rows_k and "diff" in rows_k[c] else "(baseline)"
        lines.append(f"| {method(c)} (`{c}`) | " + " | ".join(cells) + f" | {fmt(rows[c])} | "
                     f"{fmt(rows_k[c]) if c in rows_k else '—'} | {diff1} | {diffk} |")
    n = len(result["initial_pass1"])
    if n:
        mean = sum(result["initial_pass1"]) / n * 100
        lines.append(f"\nAfter the warm-up (first evaluation, {n} runs): pass@1 {mean:.1f} on average.")
    lines.append("Percent; rlvr: mean over seeds [95% Student-t interval]; Δ paired by seed.")
    lines.append("\nThe paper's ordering, pair by pair (Δ [95% interval], paired by seed):")
    for step in result["ordering"]:
        ci = step["ci95"]
        verdict = ("holds" if ci and ci[0] > 0 else "reversed" if ci and ci[1] < 0 else "not separated")
        lines.append(f"  {step['pair']:<34} {step['metric']:<13} {fmt(step, sign=True):<24} {verdict}")
    for metric, res in result["results"].items():
        row = next((r for r in res["conditions"] if method(r["condition"]) == "MaxRL"), None)
        if row is not None:
            lines.append(f"  MaxRL − GRPO, {metric}: {power_line(row['diff']['power'])}")
    w = result["wall"]
    if w["span_s"] is not None:
        lines.append(f"\nWall time: {w['span_s'] / 60:.0f} min from the first run's start to the last run's end "
                     f"({w['finished']}/{w['runs']} runs finished; their own wall times sum to "
                     f"{w['runs_wall_s'] / 60:.0f} min).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.maze", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, nargs="?", default=Path("outputs/maxrl_maze/cpu"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = table(args.path)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
