"""`rlvr plot PATH`: figures for a paper, one per metric: per condition the mean over seeds at each step,
with a shaded 95% band, written as PNG (300 dpi), PDF and SVG, with a caption printed by the command.

Which runs. The same as `rlvr compare`'s (rlvr/cli/compare.py `cells`): one run per condition and seed, the
newest where a seed ran twice, and the same refusal of runs whose configs differ. A run that ended before
its condition's last step (killed, preempted, still running) holds its last value from there on, as
compare's final value takes each run's last value: so, unsmoothed, the last point of every curve and its
band are exactly compare's final mean and interval, and a curve does not jump where a seed drops out. The
caption names each held run and where it ended.

The band is compare's interval (`t_interval`: Student t over the seeds at that step, mean ±
t(0.975, n−1)·sd/√n) and, as there, it needs at least MIN_SEEDS = 3 of them: where fewer logged a step there
is no band, and a condition with fewer runs than that shows each run's curve (thin, faint) instead. It is a
translucent fill (BAND_ALPHA) in the condition's colour with a thin edge line of that colour, under the mean
drawn thick on top: where two bands overlap both means stay readable, and each band's edge says whose it is.
(Edges alone, tried before, read as extra curves in a paper; opaque fills hide each other.) The band is never
moved or flattened: where it leaves the metric's range (`value_range`: [0, 1] for accuracies, rates,
fractions, shares and SEPA's λ, and for the mean reward of runs whose verifiers all score in [0, 1]; [0, ∞)
for lengths, times, token counts and other quantities that cannot be negative; no range otherwise) it is
filled up to the bound, with the crossing point computed rather than moved to the nearest step; its edge
lines end on the bound and never run along it; the caption says which bands were cut.

Colours and styles belong to the call, not to a figure: every condition of the runs under PATH (sorted by
name) gets tab10 colour i mod 10 and line style i mod 4 (-, --, :, -.), and marker i mod 4 on `eval/…`
metrics, before any figure is drawn; so a condition keeps its look in every figure of a call (and across
calls on the same runs), even in a figure of a metric that only some conditions log. Distinct colours up to
10 conditions, distinct colour-and-style pairs up to 20.

Words, not keys: the y label is the metric in words, one line (`METRIC_WORDS`, from docs/metrics.md; the
raw key for a metric not listed); x is "RL step" (an evaluation's step is the number of optimizer steps done
when it ran). No title over the axes: a paper's caption names the figure, and the files' `Title` metadata
holds it. The legend names the conditions and nothing else (a condition's handle is its line over a patch
of its band). What the curves and bands are (mean over seeds, the interval, each
condition's n, held runs, the smoothing, the cut, identical curves) is the caption (`caption`): printed by
the command under the files it wrote, and stored in each file's metadata (PNG `Description`, PDF `Subject`,
SVG `dc:description`, beside the `Title`), never drawn inside the axes.

`--smooth W` replaces each run's value at step s by the mean of its values at steps in (s − W, s] before
the seeds are averaged: a window of steps, not of logged values, so an evaluation logged every 25 steps is
left as it is by W ≤ 25, and a sparse evaluation's last point is still the last evaluation's value.
`--size WxH` is the whole figure in inches, legend included (default 6.4x4: 1,920 × 1,200 px; 3.3x2.5 fits
one column of a two-column paper), `--font-size PT` the text size (default 10; ticks and legend 0.9 of it),
`--legend` where the legend goes (`LEGENDS`: below or right of the axes, never over a curve; best or a corner
inside them; none). Several `--metric`s make several figures.

`--passk` draws one more figure, `plot_passk.png`: pass@k against k on a log₂ axis, at each run's last sampled
evaluation (trainer.final_eval_samples at the end of a run: rlvr/rollout/sampled_eval.py's unbiased
estimator at k = 1, 2, 4, … and the largest k), per condition the mean over seeds with the same band, cut to
[0, 1]; the curve stops at the largest k that all of a condition's seeds measured. The band is computed and cut
in log₂ k, the axis' own coordinates (`passk_curves`).
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr.cli.compare import MIN_SEEDS, _seed_order, cells, t_interval
from rlvr.cli.runs import CliError, Run, check_comparable, load_runs, require_metric

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")
PNG_DPI = 300
SIZE_IN = (6.4, 4.0)  # the whole figure: 1,920 × 1,200 px at PNG_DPI; a two-column figure's width in print
SIZE_LIMITS_IN = (1.0, 40.0)
FONT_PT = 10.0
FONT_LIMITS_PT = (4.0, 40.0)
BAND_ALPHA = 0.15  # two overlapping bands stay readable, with both means drawn on top
EDGE_WIDTH, EDGE_ALPHA = 0.5, 0.5  # the band's edge lines: fainter than the fill's colour, under the mean
MEAN_WIDTH = 1.8
LEGENDS: dict[str, str | None] = {
    "below": "outside lower center", "right": "outside right upper", "best": "best",
    "upper-left": "upper left", "upper-right": "upper right", "lower-left": "lower left",
    "lower-right": "lower right", "none": None,
}
"""--legend → matplotlib's place for it: `outside …` beside the axes (a figure legend), others inside them."""
_UNIT_INTERVAL = re.compile(r"(accuracy|_rate|_frac|_fraction|_fraction_mean|_share|^sepa_lambda|^sepa_gate_open)$")
_NON_NEGATIVE = re.compile(r"(length|_time_s|tokens|_tokens|tokens_per_step|tokens_per_second|num_datums|"
                           r"batch_size|group_size|grad_norm|^lr|_mb|abs_kl|ratio_max|_surprisal_mean|"
                           r"_entropy_mean|_var|examples|turns_mean|_count|_skips|^staleness_mean|^staleness_max|^version_spread_max)$")

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
    # sampling ahead of training (rlvr/overlap.py) and partial rollouts (rlvr/rollout/partial.py)
    "async/trainer_idle_frac": "share of the wall the trainer waited for samples",
    "async/sampler_idle_frac": "share of the wall the sampler had nothing to sample",
    "async/staleness_mean": "mean age of the trained tokens (updates)",
    "async/staleness_max": "oldest trained token's age (updates)",
    "async/partial_frac": "fraction of rows sampled by more than one version",
    "async/version_spread_max": "most versions one row spans, less one",
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
    "eval/pass@k": "held-out pass@k",
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


def smooth(steps: Sequence[int], values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over a window of `window` steps: out[i] = the mean of the values whose step lies in
    (steps[i] − window, steps[i]]; window 1 returns the values. `steps` ascending."""
    out, start = [], 0
    for i, step in enumerate(steps):
        while steps[start] <= step - window:
            start += 1
        out.append(sum(values[start:i + 1]) / (i + 1 - start))
    return out


def curves(runs: list[Run], metric: str, window: int = 1) -> dict[str, dict]:
    """condition → {"steps", "mean", "n" (seeds at each step), "low", "high" (the 95% t-interval, None where
    fewer than MIN_SEEDS seeds; not cut), "range" (`value_range` of the metric and the runs' configs),
    "bands" (`band_segments`: the interval cut to the range), "runs" (each run's smoothed (steps, values)),
    "seeds", "held" ((seed, last step) of each run that ended before the condition's last step: its last
    value is held from there on)}, the runs as compare's `cells`, the seeds pooled step by step."""
    table = cells(runs, metric)
    bounds = value_range(metric, [run.config for by_seed in table.values() for run in by_seed.values()])
    out = {}
    for condition, by_seed in table.items():
        seeds = _seed_order(by_seed)
        lines = []
        for seed in seeds:
            series = by_seed[seed].series(metric)
            steps = [s for s, _ in series]
            lines.append((steps, smooth(steps, [v for _, v in series], max(1, window))))
        grid = sorted({s for steps, _ in lines for s in steps})
        by_step: dict[int, list[float]] = {s: [] for s in grid}
        held = []
        for seed, (steps, values) in zip(seeds, lines, strict=True):
            for step, value in zip(steps, values, strict=True):
                by_step[step].append(value)
            if steps[-1] < grid[-1]:
                held.append((seed, steps[-1]))
                for step in grid[bisect_right(grid, steps[-1]):]:
                    by_step[step].append(values[-1])
        bands = [t_interval(by_step[s]) for s in grid]
        low = [None if b is None else b[0] for b in bands]
        high = [None if b is None else b[1] for b in bands]
        out[condition] = {
            "steps": grid, "mean": [sum(by_step[s]) / len(by_step[s]) for s in grid],
            "n": [len(by_step[s]) for s in grid], "low": low, "high": high, "range": bounds,
            "bands": band_segments(grid, low, high, *bounds), "runs": lines, "seeds": seeds, "held": held,
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


def band_segments(steps: Sequence[float], low: Sequence[float | None], high: Sequence[float | None],
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




def _draw(ax, c: dict, style: dict):
    """One condition: its band (a translucent fill cut to the range, thin edges) or, from fewer than
    MIN_SEEDS runs, each run faintly; the mean thick on top. Returns its legend handle: the mean's line,
    over a patch of the band where there is one."""
    import numpy as np
    from matplotlib.patches import Patch

    mean = ax.plot(c["steps"], c["mean"], label=c["label"], linewidth=MEAN_WIDTH, markersize=4, zorder=3,
                   **style)[0]
    if len(c["runs"]) < MIN_SEEDS:
        for steps, values in c["runs"]:
            ax.plot(steps, values, linewidth=0.8, alpha=0.35, color=style["color"], linestyle=style["linestyle"],
                    label="_run", zorder=2)
    for seg in c["bands"]:
        ax.fill_between(seg["x"], seg["bottom"], seg["top"], color=style["color"], alpha=BAND_ALPHA, linewidth=0,
                        label="_band", zorder=1)
        for key in ("low_edge", "high_edge"):
            ax.plot(seg["x"], np.asarray(seg[key], dtype=float), color=style["color"], linewidth=EDGE_WIDTH,
                    alpha=EDGE_ALPHA, label="_band_edge", zorder=2)
    return (Patch(color=style["color"], alpha=BAND_ALPHA), mean) if c["bands"] else mean


def rc(font_pt: float = FONT_PT) -> dict[RcKeyType, Any]:
    """matplotlib's settings for a figure with text of `font_pt` points."""
    return {
        "font.size": font_pt, "axes.labelsize": font_pt,
        "legend.fontsize": 0.9 * font_pt, "xtick.labelsize": 0.9 * font_pt, "ytick.labelsize": 0.9 * font_pt,
        "axes.spines.top": False, "axes.spines.right": False, "axes.linewidth": 0.8,
        "pdf.fonttype": 42, "ps.fonttype": 42,  # TrueType in the PDF: text stays text, as venues ask
        "svg.fonttype": "none",  # SVG text as text, editable
    }


def title(metric: str) -> str:
    """The metric in words, capitalised: the y label, the files' `Title`, the caption's first words."""
    return words(metric)[:1].upper() + words(metric)[1:]


def figure(data: dict[str, dict], metric: str, look: dict[str, dict] | None = None,
           size: tuple[float, float] = SIZE_IN, font_pt: float = FONT_PT, legend: str = "below",
           x_ticks: dict[float, str] | None = None):
    """The matplotlib Figure of `curves(...)`, `size` inches in all, legend placed as `LEGENDS[legend]`.
    `look` (`styles` of every condition of the call) fixes each condition's colour, line style and marker; by
    default, from the conditions in `data`. `x_ticks` (position → label) replaces the RL-step axis: `--passk`'s
    log₂ k."""
    import matplotlib  # here, not at the top: `rlvr status` and `compare` stay quick

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    look = look if look is not None else styles(data)
    with plt.rc_context(rc(font_pt)):
        fig, ax = plt.subplots(figsize=size, layout="constrained")
        handles = []
        for condition, c in data.items():
            style = dict(look[condition])
            if not metric.startswith("eval/"):
                style["marker"] = None
            handles.append(_draw(ax, {**c, "label": condition}, style))
        if x_ticks is None:
            ax.set(xlabel=STEP_WORDS, ylabel=title(metric))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        else:
            ax.set(xlabel=PASSK_X_WORDS, ylabel=title(metric))
            ax.set_xticks(list(x_ticks), list(x_ticks.values()))
        ax.margins(x=0.01)
        ax.grid(alpha=0.25, linewidth=0.5)
        _legend(fig, ax, handles, list(data), LEGENDS[legend])
    return fig


def _legend(fig, ax, handles: list, labels: list[str], place: str | None) -> None:
    """Below the axes in as many columns (4, 3, 2, 1) as fit the figure's width; right of them in one
    column; or inside them at `place`."""
    if place is None:
        return
    if not place.startswith("outside"):
        ax.legend(handles, labels, loc=place, framealpha=0.85, edgecolor="none", handlelength=2.4)
        return
    renderer = fig.canvas.get_renderer()
    for ncols in (4, 3, 2, 1) if place == "outside lower center" else (1,):
        legend = fig.legend(handles, labels, loc=place, ncols=min(ncols, len(labels)), frameon=False,
                            handlelength=2.4, columnspacing=1.5)
        if legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width or ncols == 1:
            break
        legend.remove()


def caption(data: dict[str, dict], metric: str, window: int = 1) -> str:
    """What the figure shows, in sentences: what the lines and bands are, each condition's seeds, the runs
    held past their end, the conditions drawn run by run, identical curves, where bands were cut, the
    smoothing."""
    lo, hi = next(iter(data.values()))["range"]
    counts = "; ".join(f"{cond}: {len(c['runs'])} seed{'s' if len(c['runs']) != 1 else ''}"
                       for cond, c in data.items())
    text = [f"{title(metric)} per {STEP_WORDS}: for each condition, the mean over seeds at each step (line) and, "
            f"where at least {MIN_SEEDS} seeds logged the step, the 95% Student-t interval of that mean, "
            f"mean ± t(0.975, n−1)·sd/√n over its n seeds (shaded). Seeds: {counts}."]
    for cond, c in data.items():
        for seed, step in c["held"]:
            text.append(f"{cond} seed {seed} logged it last at step {step}: that value is held to step "
                        f"{c['steps'][-1]}, as rlvr compare's final value takes each run's last.")
    few = [cond for cond, c in data.items() if len(c["runs"]) < MIN_SEEDS]
    if few:
        text.append(f"{', '.join(few)}: fewer than {MIN_SEEDS} seeds, no interval; each run is drawn as a thin "
                    "line.")
    first: dict[tuple, str] = {}
    for cond, c in data.items():
        same = first.setdefault((tuple(c["steps"]), tuple(c["mean"])), cond)
        if same != cond:
            text.append(f"{cond}'s mean curve is {same}'s, drawn over it.")
    cut = [cond for cond, c in data.items() if any(seg["cut"] for seg in c["bands"])]
    if cut:
        text.append(f"Intervals cut at {range_text(lo, hi)}, the metric's range: {', '.join(cut)}.")
    if window > 1:
        text.append(f"Each run smoothed before averaging: a trailing mean over a window of {window} steps (its "
                    f"values at steps s−{window - 1}…s); rlvr compare's final values are not smoothed.")
    else:
        text.append("Curves not smoothed; the last point of each is rlvr compare's final value.")
    return " ".join(text)


PASSK = "eval/pass@k"
"""--passk's figure: its file name (plot_passk.png) and its y label."""
PASSK_X_WORDS = "k (samples per maze, log scale)"
_PASS_AT = re.compile(r"^eval/pass@(\d+)$")


def last_passk(run: Run) -> tuple[int, dict[int, float]] | None:
    """(step, k → pass@k) of the run's last evaluation that holds pass@k values; None without one."""
    for row in reversed(run.eval_rows):
        ks = {int(m[1]): float(v) for key, v in row.items() if (m := _PASS_AT.match(key)) and
              isinstance(v, (int, float)) and math.isfinite(v)}
        if ks:
            return int(row["step"]), dict(sorted(ks.items()))
    return None


def passk_curves(runs: list[Run]) -> dict[str, dict]:
    """condition → `curves`' dict over x = log₂ k instead of steps, from each seed's `last_passk` (the runs as
    compare's `cells` of eval/pass@1), plus "ks" and "at" (each seed's step). A condition's curve runs to the
    largest k measured by all its seeds."""
    out = {}
    for condition, by_seed in cells(runs, "eval/pass@1").items():
        seeds = [s for s in _seed_order(by_seed) if last_passk(by_seed[s]) is not None]
        last = {s: cast("tuple[int, dict[int, float]]", last_passk(by_seed[s])) for s in seeds}
        ks = sorted(set.intersection(*(set(values) for _, values in last.values())))
        xs = [math.log2(k) for k in ks]
        lines = [(xs, [last[s][1][k] for k in ks]) for s in seeds]
        bands = [t_interval([values[i] for _, values in lines]) for i in range(len(ks))]
        low = [None if b is None else b[0] for b in bands]
        high = [None if b is None else b[1] for b in bands]
        out[condition] = {
            "steps": xs, "ks": ks, "mean": [sum(v[i] for _, v in lines) / len(lines) for i in range(len(ks))],
            "n": [len(lines)] * len(ks), "low": low, "high": high, "range": (0.0, 1.0),
            "bands": band_segments(xs, low, high, 0.0, 1.0), "runs": lines, "seeds": seeds, "held": [],
            "at": {s: last[s][0] for s in seeds},
        }
    return out


def passk_caption(data: dict[str, dict]) -> str:
    """What `--passk`'s figure shows, in sentences."""
    counts = "; ".join(f"{cond}: {len(c['seeds'])} seed{'s' if len(c['seeds']) != 1 else ''}, k ≤ {c['ks'][-1]}"
                       for cond, c in data.items())
    steps = sorted({step for c in data.values() for step in c["at"].values()})
    text = [f"Pass@k against k (log scale) at each run's last sampled evaluation (step "
            f"{', '.join(map(str, steps))}): the unbiased estimator 1 − C(n−c, k)/C(n, k) per held-out example from "
            f"its n samples, c of them correct, averaged over the examples; for each condition the mean over seeds "
            f"(line) and, from at least {MIN_SEEDS} seeds, the 95% Student-t interval of that mean (shaded). "
            f"Seeds: {counts}."]
    few = [cond for cond, c in data.items() if len(c["seeds"]) < MIN_SEEDS]
    if few:
        text.append(f"{', '.join(few)}: fewer than {MIN_SEEDS} seeds, no interval; each run is drawn as a thin "
                    "line.")
    cut = [cond for cond, c in data.items() if any(seg["cut"] for seg in c["bands"])]
    if cut:
        text.append(f"Intervals cut at [0, 1]: {', '.join(cut)}.")
    return " ".join(text)


def options(size: str | None, font_pt: float, legend: str, window: int) -> tuple[float, float]:
    """Check the figure's options before any run is read; returns the size in inches."""
    if window < 1:
        raise CliError(f"--smooth {window}: expected a window of at least 1 step (1: no smoothing)")
    low, high = FONT_LIMITS_PT
    if not low <= font_pt <= high:
        raise CliError(f"--font-size {font_pt:g}: expected points between {low:g} and {high:g} "
                       f"(default {FONT_PT:g})")
    if legend not in LEGENDS:
        raise CliError(f"--legend {legend!r}: expected one of {', '.join(LEGENDS)}")
    if size is None:
        return SIZE_IN
    low, high = SIZE_LIMITS_IN
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*[x×]\s*(\d+(?:\.\d*)?|\.\d+)\s*", size)
    inches = (float(match[1]), float(match[2])) if match else (0.0, 0.0)
    if not all(low <= v <= high for v in inches):
        raise CliError(f"--size {size!r}: expected WIDTHxHEIGHT in inches, each between {low:g} and {high:g}, "
                       f"e.g. 3.3x2.5 (one column of a two-column paper) or 6.4x4 (the default)")
    return inches


def default_out(path: Path, metric: str) -> Path:
    base = path if path.is_dir() else path.parent
    return base / ("plot_passk.png" if metric == PASSK else f"plot_{metric.replace('/', '_')}.png")


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


def run(path: Path, metrics: str | Sequence[str], out: Path | None, window: int = 1, ignore_keys: Sequence[str] = (),
        size: str | None = None, font_pt: float = FONT_PT, legend: str = "below", passk: bool = False) -> str:
    """Write each metric's figure (and, `passk`, the pass@k figure) as PNG, PDF and SVG; returns, per figure,
    the paths written (one per line) and its caption (also in each file's metadata)."""
    inches = options(size, font_pt, legend, window)
    metrics = [metrics] if isinstance(metrics, str) else list(dict.fromkeys(metrics))
    runs = load_runs(path)
    for metric in [*metrics, *(["eval/pass@1"] if passk else [])]:
        require_metric(runs, metric)
        check_comparable([r for r in runs if r.series(metric)], ignore_keys)
    targets = outputs(Path(path), [*metrics, *([PASSK] if passk else [])], out)
    import matplotlib.pyplot as plt

    look = styles(r.condition for r in runs)  # every condition of the call, before any figure is drawn
    said = []
    for metric in [*metrics, *([PASSK] if passk else [])]:
        if metric == PASSK:
            data = passk_curves(runs)
            text = passk_caption(data)
            ticks = {x: str(k) for c in data.values() for x, k in zip(c["steps"], c["ks"], strict=True)}
            fig = figure(data, metric, look, inches, font_pt, legend, dict(sorted(ticks.items())))
        else:
            data = curves(runs, metric, window)
            text = caption(data, metric, window)
            fig = figure(data, metric, look, inches, font_pt, legend)
        png = targets[metric]
        png.parent.mkdir(parents=True, exist_ok=True)
        with plt.rc_context(rc(font_pt)):
            for target, dpi in ((png, PNG_DPI), (png.with_suffix(".pdf"), None), (png.with_suffix(".svg"), None)):
                fig.savefig(target, dpi=dpi, metadata=_metadata(target, title(metric), text))
                said.append(str(target))
        plt.close(fig)
        said.append(textwrap.fill(text, 110, initial_indent="  ", subsequent_indent="  "))
    return "\n".join(said)


def _metadata(target: Path, name: str, text: str) -> dict:
    """The title and caption in each format's field for them; no creation date in the PDF/SVG: the same runs
    give the same bytes."""
    if target.suffix == ".pdf":
        return {"Title": name, "Subject": text, "CreationDate": None}
    if target.suffix == ".svg":
        return {"Title": name, "Description": text, "Date": None}
    return {"Title": name, "Description": text}
