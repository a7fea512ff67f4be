"""`rlvr plot PATH`: figures for a paper, one per metric: per condition the mean over seeds at each step,
with a 95% band, written as PNG (1,920 px wide), PDF and SVG.

The band is `rlvr compare`'s interval (rlvr/cli/compare.py `t_interval`: Student t over the seeds that
logged that step, mean ± t(0.975, n−1)·sd/√n) and, as there, it needs at least MIN_SEEDS = 3 of them: where
fewer logged a step there is no band, and a condition with fewer runs than that shows each run's curve
(thin, faint) instead. The band is never moved or flattened: where it leaves the metric's range
(`value_range`: [0, 1] for accuracies, rates, fractions, shares and SEPA's λ, and for the mean reward of
runs whose verifiers all score in [0, 1]; [0, ∞) for lengths, times, token counts and other quantities that
cannot be negative; no range otherwise) only the part inside the range is drawn: an edge that crosses a
bound ends exactly on it (the crossing point is computed, not moved to the nearest step) and is not drawn
outside, so no line ever runs along a bound; the legend then says "cut at [0, 1]".

Colours and styles belong to the call, not to a figure: every condition of the runs under PATH (sorted by
name) gets tab10 colour i mod 10 and line style i mod 4 (-, --, :, -.), and marker i mod 4 on `eval/…`
metrics, before any figure is drawn; so a condition keeps its look in every figure of a call (and across
calls on the same runs), even in a figure of a metric that only some conditions log. Distinct colours up to
10 conditions, distinct colour-and-style pairs up to 20. Identical curves hide each other (on the tiny task
several conditions can train identically), so the legend names the earlier condition a curve equals.

A band is drawn as its two edges only: thin lines in the condition's colour and line style, the mean
thick between them. Translucent fills were tried on real runs (rlvr plot of two conditions × three seeds):
with 3 seeds the t-intervals are wide and overlap over most steps, and the overlap of two fills is a
third colour that dominates the figure and belongs to no condition; hatching keeps the colours apart but
turns 3+ overlapping bands into a mesh. Edges mix nothing, each says whose it is by colour and dash (also
in grey-scale print), and they stay readable with several conditions.

Words, not keys: the title is one line, the metric in words (`METRIC_WORDS`, from docs/metrics.md; the raw
key for a metric not listed), and so is the y label; x is "RL step" (an evaluation's step is the number of
optimizer steps done when it ran). What the curves and bands are (mean over seeds, the interval, its n, the
smoothing, the cut) is in the legend, below the axes, never over a curve. `--smooth N` takes a trailing mean
over N logged values of each run before averaging over seeds. Several `--metric`s make several figures.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr.cli.compare import MIN_SEEDS, t_interval
from rlvr.cli.runs import CliError, Run, check_comparable, load_runs, require_metric

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")
PNG_DPI = 300
FIG_WIDTH_IN = 6.4  # 1,920 px at PNG_DPI; a two-column figure's width in print
AXES_HEIGHT_IN = 3.5  # the figure's height without its legend
BAND_WIDTH = 0.7  # the band's edge lines; the mean is MEAN_WIDTH
MEAN_WIDTH = 1.8
_UNIT_INTERVAL = re.compile(r"(accuracy|_rate|_frac|_fraction|_fraction_mean|_share|^sepa_lambda|^sepa_gate_open)$")
_NON_NEGATIVE = re.compile(r"(length|_time_s|tokens|_tokens|tokens_per_step|tokens_per_second|num_datums|"
                           r"batch_size|group_size|grad_norm|^lr|_mb|abs_kl|ratio_max|_surprisal_mean|"
                           r"_entropy_mean|_var|examples|turns_mean|_count|_skips)$")

METRIC_WORDS = {
    # docs/metrics.md, step rows
    "loss": "policy loss",
    "mean_reward": "mean reward",
    "correct_rate": "fraction of completions correct",
    "running_correct_rate": "fraction of completions correct, cumulative",
    "reward_unique_fraction_mean": "fraction of distinct rewards per group",
    "num_datums": "completions trained on",
    "batch_size": "prompts per step",
    "group_size": "completions per prompt",
    "mean_completion_length": "completion length (tokens)",
    "max_token_hit_rate": "fraction of completions cut at max_tokens",
    "rl/completion_tokens": "completion tokens sampled",
    "rl/completion_surprisal_mean": "mean surprisal of completion tokens (nats)",
    "rl/nonzero_advantage_action_tokens": "tokens with a non-zero advantage",
    "rl/optimizer_nonzero_advantage_action_tokens": "tokens in the loss",
    "tokens_per_step": "tokens per step",
    "step_time_s": "step time (s)",
    "sample_time_s": "sampling time (s)",
    "score_time_s": "scoring time (s)",
    "advantage_time_s": "advantage time (s)",
    "train_time_s": "training time (s)",
    "tokens_per_second": "tokens per second",
    "sample_share": "share of step time sampling",
    "train_share": "share of step time training",
    "process_max_rss_mb": "peak resident memory (MB)",
    "reward/timeout_frac": "fraction of gradings timed out",
    "reward/error_frac": "fraction of gradings failed",
    "reward/parse_fail_frac": "fraction of completions without an answer",
    "train/nonfinite_skips": "non-finite updates skipped, cumulative",
    # from the backend
    "clip_fraction": "fraction of tokens with a clipped ratio",
    "policy/abs_kl": "mean |log π_θ − log π_old|",
    "policy/ratio_max": "largest importance ratio",
    "grad_norm": "gradient norm before clipping",
    "lr": "learning rate",
    # from the algorithm and the transform
    "batch_adv_mean": "batch advantage mean",
    "batch_adv_std": "batch advantage sd",
    "adv_cap_fraction": "fraction of advantages capped",
    "planning_token_fraction": "fraction of planning tokens",
    "sepa_lambda": "SEPA λ",
    "sepa_gate_open": "SEPA gate open",
    "entropy_mask_fraction": "fraction of tokens masked by entropy",
    "policy/cov_fraction": "fraction of tokens picked by covariance",
    "discover_beta": "TTT-Discover β",
    "discover_kl": "TTT-Discover KL",
    "exec_surprisal_mean": "mean surprisal, execution tokens",
    "plan_surprisal_mean": "mean surprisal, planning tokens",
    "post_exec_surprisal_mean": "mean surprisal after SEPA, execution tokens",
    "post_plan_surprisal_mean": "mean surprisal after SEPA, planning tokens",
    # multi-turn steps
    "env/turns_mean": "actions per episode",
    "env/truncated_frac": "fraction of episodes truncated",
    "env/error_frac": "fraction of episodes failed",
    "env/timeout_frac": "fraction of episodes timed out",
    # evaluation rows
    "eval/accuracy": "held-out accuracy",
    "eval/mean_reward": "held-out mean reward",
    "eval/mean_completion_length": "held-out completion length (tokens)",
    "eval/examples": "held-out examples evaluated",
    "eval/turns_mean": "held-out actions per episode",
    "eval/truncated_frac": "fraction of held-out episodes truncated",
    "eval/reward_timeout_frac": "fraction of held-out gradings timed out",
    "eval/reward_error_frac": "fraction of held-out gradings failed",
    "eval/reward_parse_fail_frac": "fraction of held-out completions without an answer",
    "eval_time_s": "evaluation time (s)",
}
"""Metric key → its words on an axis (docs/metrics.md's meanings, shortened); `words` falls back to the key."""
STEP_WORDS = "RL step"


def words(metric: str) -> str:
    """The metric in words (`METRIC_WORDS`), or its key when it is not listed."""
    return METRIC_WORDS.get(metric, metric)


def unit_interval(metric: str) -> bool:
    """Whether `metric` lies in [0, 1] by definition (docs/metrics.md)."""
    return bool(_UNIT_INTERVAL.search(metric.rsplit("/", 1)[-1]))


UNIT_REWARDS = ("exact", "match", "math", "judge", "reasoning_gym")
"""Verifiers (rlvr/labels.py names) whose every score lies in [0, 1]; `function` may return any number."""


def value_range(metric: str, configs: Iterable[dict] = ()) -> tuple[float, float]:
    """The values `metric` can take by definition: [0, 1], [0, ∞) or (−∞, ∞); the band is cut to it. The
    mean reward is in [0, 1] when every run's config (`configs`) is single-turn with a verifier of
    `UNIT_REWARDS`; unknown otherwise (a run without a config, a reward function, an environment)."""
    from rlvr.labels import name

    if unit_interval(metric):
        return 0.0, 1.0
    configs = list(configs)
    if metric in ("mean_reward", "eval/mean_reward") and configs and all(
            c and not c.get("env") and name(c.get("reward")) in UNIT_REWARDS for c in configs):
        return 0.0, 1.0
    if _NON_NEGATIVE.search(metric.rsplit("/", 1)[-1]):
        return 0.0, math.inf
    return -math.inf, math.inf


def range_text(lo: float, hi: float) -> str:
    return f"[{lo:g}, {'∞)' if math.isinf(hi) else f'{hi:g}]'}"


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean: out[i] = mean(values[i-window+1 : i+1]) (fewer at the start); window 1 returns the values."""
    return [sum(values[max(0, i - window + 1):i + 1]) / min(i + 1, window) for i in range(len(values))]


def curves(runs: list[Run], metric: str, window: int = 1) -> dict[str, dict]:
    """condition → {"steps", "mean", "n" (seeds that logged each step), "low", "high" (the 95% t-interval,
    None where fewer than MIN_SEEDS seeds logged the step; not cut), "range" (`value_range` of the metric
    and the runs' configs), "runs" (each
    run's (steps, values))}, the seeds pooled step by step."""
    per_run: dict[str, list[tuple[list[int], list[float]]]] = {}
    configs = []
    for run in runs:
        series = run.series(metric)
        if series:
            values = smooth([v for _, v in series], max(1, window))
            per_run.setdefault(run.condition, []).append(([s for s, _ in series], values))
            configs.append(run.config)
    bounds = value_range(metric, configs)
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
            "n": [len(by_step[s]) for s in steps],
            "low": [None if b is None else b[0] for b in bands],
            "high": [None if b is None else b[1] for b in bands],
            "range": bounds, "runs": lines,
        }
    return out


def styles(conditions: Iterable[str]) -> dict[str, dict]:
    """condition → its colour, line style and marker (drawn on `eval/…` metrics): condition i of the sorted
    set gets tab10 colour i mod 10, line style and marker i mod 4. Pass every condition of the call, so that
    each keeps its look in every figure."""
    import matplotlib

    colours = matplotlib.color_sequences["tab10"]
    names = sorted(set(conditions))
    if len(names) > math.lcm(len(colours), len(LINE_STYLES)):
        print(f"warning: {len(names)} conditions; past {math.lcm(len(colours), len(LINE_STYLES))} colour and "
              "line-style pairs repeat", file=sys.stderr)
    return {c: {"color": colours[i % len(colours)], "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
                "marker": MARKERS[i % len(MARKERS)]}
            for i, c in enumerate(names)}


def band_segments(steps: Sequence[int], low: Sequence[float | None], high: Sequence[float | None],
                  lo: float, hi: float) -> list[dict]:
    """The band cut to [lo, hi], one dict per stretch of consecutive steps that have an interval: "x",
    "bottom", "top" (the part of the band inside the range, with a point added wherever an edge crosses a
    bound, so the cut is exact rather than moved to the nearest step), "low_edge", "high_edge" (each edge
    where it is inside the range, NaN where it is outside: a line drawn from them ends on the bound where
    the edge crosses it and never runs along it; NaN too amid steps where the interval has no width), and
    "cut" (whether any of the band left the range)."""
    stretches, start = [], None
    for i in range(len(steps) + 1):
        has = i < len(steps) and low[i] is not None
        if has and start is None:
            start = i
        elif not has and start is not None:
            stretches.append(range(start, i))
            start = None
    # read at the steps of a stretch only, where both edges of the interval are numbers
    low_at, high_at = cast("Sequence[float]", low), cast("Sequence[float]", high)
    out = []
    for stretch in stretches:
        xs: list[float] = []
        edges: dict[str, list[float]] = {"low": [], "high": []}
        for i in stretch:
            if i > stretch.start:  # where an edge crosses a bound between the previous step and this one
                x0, x1 = steps[i - 1], steps[i]
                cuts: dict[float, dict[str, float]] = {}
                for key, e in (("low", low_at), ("high", high_at)):
                    for bound in (lo, hi):
                        if math.isfinite(bound) and (e[i - 1] - bound) * (e[i] - bound) < 0:
                            x = x0 + (bound - e[i - 1]) / (e[i] - e[i - 1]) * (x1 - x0)
                            cuts.setdefault(x, {})[key] = bound  # exactly on the bound, not rounded near it
                for x in sorted(cuts):
                    xs.append(x)
                    for key, e in (("low", low_at), ("high", high_at)):
                        between = e[i - 1] + (x - x0) / (x1 - x0) * (e[i] - e[i - 1])
                        edges[key].append(cuts[x].get(key, between))
            xs.append(float(steps[i]))
            edges["low"].append(low_at[i])
            edges["high"].append(high_at[i])
        # where the seeds agree (zero width, e.g. SEPA's λ before its ramp) the interval is the mean line itself:
        # no edges over it, but kept next to a point with width, so that the edges still fan out from the mean
        flat = [h - low_ <= 1e-12 * max(1.0, abs(h)) for low_, h in zip(edges["low"], edges["high"], strict=True)]
        hidden = [f and (i == 0 or flat[i - 1]) and (i == len(flat) - 1 or flat[i + 1]) for i, f in enumerate(flat)]

        out.append({
            "x": xs,
            "bottom": [min(max(v, lo), hi) for v in edges["low"]],
            "top": [min(max(v, lo), hi) for v in edges["high"]],
            "low_edge": _edge(edges["low"], hidden, lo, hi),
            "high_edge": _edge(edges["high"], hidden, lo, hi),
            "cut": any(v < lo for v in edges["low"]) or any(v > hi for v in edges["high"]),
        })
    return out


def _edge(values: list[float], hidden: list[bool], lo: float, hi: float) -> list[float]:
    return [v if lo <= v <= hi and not h else math.nan for v, h in zip(values, hidden, strict=True)]


def _draw(ax, c: dict, label: str, style: dict) -> tuple[bool, bool]:
    """One condition's mean curve, and its band's edges or (fewer than MIN_SEEDS runs) each run:
    (a band drawn, a band cut at the range)."""
    import numpy as np

    ax.plot(c["steps"], c["mean"], label=label, linewidth=MEAN_WIDTH, markersize=4, zorder=3, **style)
    if len(c["runs"]) < MIN_SEEDS:
        for steps, values in c["runs"]:
            ax.plot(steps, values, linewidth=0.8, alpha=0.35, color=style["color"], linestyle=style["linestyle"],
                    label="_run", zorder=2)
    lo, hi = c["range"]
    segments = band_segments(c["steps"], c["low"], c["high"], lo, hi)
    for seg in segments:
        for key in ("low_edge", "high_edge"):
            ax.plot(seg["x"], np.asarray(seg[key], dtype=float), color=style["color"], linestyle=style["linestyle"],
                    linewidth=BAND_WIDTH, alpha=0.9, label="_band_edge", zorder=2)
    return bool(segments), any(seg["cut"] for seg in segments)


def _band_text(data: dict[str, dict], cut: bool) -> str:
    """The legend's line for the bands: the interval, over how many seeds, and where it was cut."""
    ns = sorted({len(c["runs"]) for c in data.values() if len(c["runs"]) >= MIN_SEEDS})
    seeds = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    lo, hi = next(iter(data.values()))["range"]
    text = f"95% t-interval over {seeds} seeds"
    text += f", cut at {range_text(lo, hi)}" if cut else ""
    return text


def figure(data: dict[str, dict], metric: str, window: int = 1, look: dict[str, dict] | None = None):
    """The matplotlib Figure of `curves(...)`. `look` (`styles` of every condition of the call) fixes each
    condition's colour, line style and marker; by default, from the conditions in `data`. A curve equal to an
    earlier condition's says so in the legend."""
    import matplotlib  # here, not at the top: `rlvr status` and `compare` stay quick

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    look = look if look is not None else styles(data)
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, AXES_HEIGHT_IN), layout="constrained")
        first_with: dict[tuple, str] = {}  # a curve → the first condition drawing it
        any_band = any_cut = False
        few = []
        for condition, c in data.items():
            style = dict(look[condition])
            if not metric.startswith("eval/"):
                style["marker"] = None
            same = first_with.setdefault((tuple(c["steps"]), tuple(c["mean"])), condition)
            n = len(c["runs"])
            notes = [f"{n} seed{'s' if n != 1 else ''}"] + (["each run shown"] if n < MIN_SEEDS else [])
            notes += [f"same curve as {same}"] if same != condition else []
            few += [condition] if n < MIN_SEEDS else []
            band, cut = _draw(ax, c, f"{condition} ({', '.join(notes)})", style)
            any_band, any_cut = any_band or band, any_cut or cut
        handles, labels = ax.get_legend_handles_labels()
        if any_band:
            handles.append(Line2D([], [], color="0.35", linewidth=BAND_WIDTH))
            labels.append(_band_text(data, any_cut))
        if few:
            handles.append(Line2D([], [], color="0.5", linewidth=0.8, alpha=0.5))
            labels.append(f"each run (no interval from fewer than {MIN_SEEDS} seeds)")
        ax.set_title(words(metric)[:1].upper() + words(metric)[1:], loc="left")
        ax.set(xlabel=STEP_WORDS, ylabel=words(metric))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        ax.margins(x=0.01)
        ax.grid(alpha=0.25, linewidth=0.6)
        smoothing = f", trailing mean over {window} logged values" if window > 1 else ""
        title = f"thick: mean over seeds per step{smoothing}" + ("; thin: its 95% t-interval" if any_band else "")
        _legend(fig, handles, labels, title)
    return fig


def _legend(fig, handles, labels, title: str) -> None:
    """The legend below the axes, in as many columns (3, 2, 1) as fit the figure's width; the figure grows
    by its rows so that the axes keep their height."""
    renderer = fig.canvas.get_renderer()
    for ncols in (3, 2, 1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=min(ncols, len(labels)), title=title,
                            frameon=False, handlelength=2.6, columnspacing=1.5)
        if legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width or ncols == 1:
            break
        legend.remove()
    rows = math.ceil(len(labels) / min(ncols, len(labels)))
    fig.set_figheight(AXES_HEIGHT_IN + 0.17 * (rows + 1))


RC: dict[RcKeyType, Any] = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8.5,
    "legend.title_fontsize": 8.5, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "axes.spines.top": False, "axes.spines.right": False,
    "pdf.fonttype": 42, "ps.fonttype": 42,  # TrueType in the PDF: text stays text, as venues ask
    "svg.fonttype": "none",  # SVG text as text, editable
}


def default_out(path: Path, metric: str) -> Path:
    base = path if path.is_dir() else path.parent
    return base / f"plot_{metric.replace('/', '_')}.png"


def outputs(path: Path, metrics: Sequence[str], out: Path | None) -> dict[str, Path]:
    """metric → the PNG to write (the PDF and SVG go beside it, same stem). `out` names the file for one
    metric (any suffix: its stem is used), a folder for several."""
    if out is None:
        return {m: default_out(path, m) for m in metrics}
    out = Path(out)
    if len(metrics) == 1 and not out.is_dir():
        return {metrics[0]: out.with_suffix(".png") if out.suffix in (".png", ".pdf", ".svg") else
                out.with_name(out.name + ".png")}
    if out.suffix in (".png", ".pdf", ".svg"):
        raise CliError(f"--out {out}: with {len(metrics)} metrics, --out is a folder (plot_<metric>.png in it)")
    return {m: out / default_out(out, m).name for m in metrics}


def run(path: Path, metrics: str | Sequence[str], out: Path | None, window: int, ignore_keys: Sequence[str] = ()
        ) -> str:
    """Write each metric's figure as PNG, PDF and SVG; returns the paths written, one per line."""
    metrics = [metrics] if isinstance(metrics, str) else list(dict.fromkeys(metrics))
    runs = load_runs(path)
    for metric in metrics:
        require_metric(runs, metric)
        check_comparable([r for r in runs if r.series(metric)], ignore_keys)
    targets = outputs(Path(path), metrics, out)
    import matplotlib.pyplot as plt

    look = styles(r.condition for r in runs)  # every condition of the call, before any figure is drawn
    written = []
    for metric in metrics:
        fig = figure(curves(runs, metric, window), metric, window, look)
        png = targets[metric]
        png.parent.mkdir(parents=True, exist_ok=True)
        with plt.rc_context(RC):
            for target, dpi in ((png, PNG_DPI), (png.with_suffix(".pdf"), None), (png.with_suffix(".svg"), None)):
                fig.savefig(target, dpi=dpi, metadata=_metadata(target))
                written.append(str(target))
        plt.close(fig)
    return "\n".join(written)


def _metadata(target: Path) -> dict:
    """No creation date in the PDF/SVG: the same runs give the same bytes."""
    return {"CreationDate": None} if target.suffix == ".pdf" else {"Date": None} if target.suffix == ".svg" else {}
