"""`rlvr plot PATH`: one curve per condition, the mean over seeds at each step with a 95% t-interval band
(mean ± t(0.975, n-1)·sd/√n over the seeds that logged that step; no band where only one seed did).
`--smooth N` takes a trailing mean over N logged values of each run before averaging over seeds.
`eval/…` metrics are drawn from evaluation rows (step = optimizer steps done), with markers."""

from __future__ import annotations

import math
from pathlib import Path

from rlvr.cli.runs import Run, load_runs, require_metric

# two-sided 95% Student t quantiles, df = 1..30; the normal 1.96 beyond
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean: out[i] = mean(values[i-window+1 : i+1]) (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def t_band(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width 0 for a single value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, (T_975[n - 2] if n - 1 <= len(T_975) else 1.96) * sd / math.sqrt(n)


def curves(runs: list[Run], metric: str, window: int = 1) -> dict[str, dict]:
    """condition → {"steps", "mean", "half", "n_runs"}, the seeds pooled step by step."""
    pooled: dict[str, dict[int, list[float]]] = {}
    n_runs: dict[str, int] = {}
    for run in runs:
        series = run.series(metric)
        if not series:
            continue
        n_runs[run.condition] = n_runs.get(run.condition, 0) + 1
        steps = [s for s, _ in series]
        for step, value in zip(steps, smooth([v for _, v in series], max(1, window)), strict=True):
            pooled.setdefault(run.condition, {}).setdefault(step, []).append(value)
    out = {}
    for condition, by_step in sorted(pooled.items()):
        steps = sorted(by_step)
        bands = [t_band(by_step[s]) for s in steps]
        out[condition] = {"steps": steps, "mean": [m for m, _ in bands], "half": [h for _, h in bands],
                          "n_runs": n_runs[condition]}
    return out


def default_out(path: Path, metric: str) -> Path:
    base = path if path.is_dir() else path.parent
    return base / f"plot_{metric.replace('/', '_')}.png"


def run(path: Path, metric: str, out: Path | None, window: int) -> str:
    runs = load_runs(path)
    require_metric(runs, metric)
    data = curves(runs, metric, window)
    out = Path(out) if out is not None else default_out(path, metric)

    import matplotlib  # here, not at the top: `rlvr status` and `compare` stay quick

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for condition, c in data.items():
        lo = [m - h for m, h in zip(c["mean"], c["half"], strict=True)]
        hi = [m + h for m, h in zip(c["mean"], c["half"], strict=True)]
        (line,) = ax.plot(c["steps"], c["mean"], marker="o" if metric.startswith("eval/") else None,
                          label=f"{condition} (n={c['n_runs']})")
        ax.fill_between(c["steps"], lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    smoothing = f", trailing mean over {window}" if window > 1 else ""
    ax.set(xlabel="step", ylabel=metric, title=f"{metric}: mean over seeds ± 95% t-interval{smoothing}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return str(out)
