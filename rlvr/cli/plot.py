"""`rlvr plot PATH`: one curve per condition, the mean over seeds at each step, with a 95% band.

The band is `rlvr compare`'s interval (rlvr/cli/compare.py `t_interval`: Student t over the seeds that
logged that step) and, as there, it needs at least MIN_SEEDS = 3 of them: where fewer logged a step there
is no band, and a condition with fewer runs than that shows each run's curve (thin, faint) instead.
The band is clipped to the metric's range: [0, 1] for accuracies, rates, fractions, shares and SEPA's λ
(`unit_interval`); for any other metric (a custom verifier's reward may be any number) the range of the
values the runs logged, so a band never reaches past every value seen.

Condition i (in name order) is drawn in tab10 colour i mod 10 with line style i mod 4 (-, --, :, -.):
distinct colours up to 10 conditions, distinct colour-and-style pairs up to 20. Identical curves still
hide each other (on the tiny task several conditions train identically), so the legend names the earlier
condition a curve equals; it sits below the axes, never over a curve. Steps are integers, and so are the
x ticks. `--smooth N` takes a trailing mean over N logged values of each run before averaging over seeds.
`eval/…` metrics are drawn from evaluation rows (step = optimizer steps done), with markers i mod 4.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from rlvr.cli.compare import MIN_SEEDS, t_interval
from rlvr.cli.runs import Run, load_runs, require_metric

LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")
_UNIT_INTERVAL = re.compile(r"(accuracy|_rate|_frac|_fraction|_fraction_mean|_share|^sepa_lambda)$")


def unit_interval(metric: str) -> bool:
    """Whether `metric` lies in [0, 1] by definition (docs/metrics.md)."""
    return bool(_UNIT_INTERVAL.search(metric.rsplit("/", 1)[-1]))


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean: out[i] = mean(values[i-window+1 : i+1]) (fewer at the start); window 1 returns the values."""
    return [sum(values[max(0, i - window + 1):i + 1]) / min(i + 1, window) for i in range(len(values))]


def curves(runs: list[Run], metric: str, window: int = 1) -> dict[str, dict]:
    """condition → {"steps", "mean", "low", "high" (None where fewer than MIN_SEEDS seeds logged the step;
    clipped to `range`), "range", "runs" (each run's (steps, values))}, the seeds pooled step by step."""
    per_run: dict[str, list[tuple[list[int], list[float]]]] = {}
    for run in runs:
        series = run.series(metric)
        if series:
            values = smooth([v for _, v in series], max(1, window))
            per_run.setdefault(run.condition, []).append(([s for s, _ in series], values))
    seen = [v for lines in per_run.values() for _, values in lines for v in values]
    lo, hi = (0.0, 1.0) if unit_interval(metric) else (min(seen, default=0.0), max(seen, default=0.0))
    out = {}
    for condition, lines in sorted(per_run.items()):
        by_step: dict[int, list[float]] = {}
        for steps, values in lines:
            for step, value in zip(steps, values, strict=True):
                by_step.setdefault(step, []).append(value)
        steps = sorted(by_step)
        bands = [t_interval(by_step[s]) for s in steps]
        out[condition] = {
            "steps": steps, "mean": [sum(by_step[s]) / len(by_step[s]) for s in steps],
            "low": [None if b is None else max(lo, b[0]) for b in bands],
            "high": [None if b is None else min(hi, b[1]) for b in bands],
            "range": (lo, hi), "runs": lines,
        }
    return out


def _draw(ax, c: dict, label: str, style: dict) -> bool:
    """One condition's mean curve, and its band or (fewer than MIN_SEEDS runs) each run; True if a band."""
    ax.plot(c["steps"], c["mean"], label=label, **style)
    if len(c["runs"]) < MIN_SEEDS:
        for steps, values in c["runs"]:
            ax.plot(steps, values, linewidth=0.8, alpha=0.4, color=style["color"], linestyle=style["linestyle"])
    has_band = [low is not None for low in c["low"]]
    if any(has_band):
        nan = float("nan")
        ax.fill_between(c["steps"], [nan if v is None else v for v in c["low"]],
                        [nan if v is None else v for v in c["high"]], where=has_band,
                        facecolor=(*style["color"], 0.12), edgecolor=style["color"], linewidth=0.7,
                        linestyle=style["linestyle"])
    return any(has_band)


def figure(data: dict[str, dict], metric: str, window: int = 1):
    """The matplotlib Figure of `curves(...)`; condition i gets colour i mod 10, line style (and, for
    evaluation metrics, marker) i mod 4. A curve equal to an earlier condition's says so in the legend."""
    import matplotlib  # here, not at the top: `rlvr status` and `compare` stay quick

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    colours = matplotlib.colormaps["tab10"].colors
    if len(data) > math.lcm(len(colours), len(LINE_STYLES)):
        print(f"warning: {len(data)} conditions; past {math.lcm(len(colours), len(LINE_STYLES))} colour and "
              "line-style pairs repeat", file=sys.stderr)
    fig, ax = plt.subplots(figsize=(8, 5 + 0.25 * len(data)), layout="constrained")  # + legend rows
    first_with: dict[tuple, str] = {}  # a curve → the first condition drawing it
    any_band = False
    for i, (condition, c) in enumerate(data.items()):
        style = {"color": colours[i % len(colours)], "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
                 "marker": MARKERS[i % len(MARKERS)] if metric.startswith("eval/") else None}
        same = first_with.setdefault((tuple(c["steps"]), tuple(c["mean"])), condition)
        notes = [f"n={len(c['runs'])}"] + (["no band: each run shown"] if len(c["runs"]) < MIN_SEEDS else [])
        notes += [f"same curve as {same}"] if same != condition else []
        any_band |= _draw(ax, c, f"{condition} ({', '.join(notes)})", style)
    lo, hi = next(iter(data.values()))["range"]
    clip = "[0, 1]" if unit_interval(metric) else f"the logged range [{lo:.4g}, {hi:.4g}]"
    band = (f"band: 95% t-interval where ≥ {MIN_SEEDS} seeds logged the step,\nclipped to {clip}" if any_band
            else f"no band: fewer than {MIN_SEEDS} seeds")
    smoothing = f"; trailing mean over {window}" if window > 1 else ""
    ax.set(xlabel="step", ylabel=metric, title=f"{metric}: mean over seeds{smoothing}\n{band}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center")  # below the axes: never over a curve
    return fig


def default_out(path: Path, metric: str) -> Path:
    base = path if path.is_dir() else path.parent
    return base / f"plot_{metric.replace('/', '_')}.png"


def run(path: Path, metric: str, out: Path | None, window: int) -> str:
    runs = load_runs(path)
    require_metric(runs, metric)
    fig = figure(curves(runs, metric, window), metric, window)
    out = Path(out) if out is not None else default_out(path, metric)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(out)
