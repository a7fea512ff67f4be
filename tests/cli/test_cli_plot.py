"""`rlvr plot`: figures for a paper, per metric a PNG (≥ 1,600 px wide), a PDF and an SVG; curves averaged
over seeds, each condition its own colour and line style in every figure of a call; bands only from ≥ 3
seeds, shaded and cut to the metric's range, their edge lines ending on the bound and never running along
it; one-line titles and axis labels in words. tests/cli/test_cli_plot_paper.py: the caption, the options,
the smoothing over steps, the agreement with `rlvr compare`."""

import json
import math
import struct

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex

from rlvr.cli import plot
from rlvr.cli.main import main
from rlvr.cli.plot import band_segments, caption, curves, figure, unit_interval, value_range, words
from rlvr.cli.runs import load_runs
from tests.cli.conftest import make_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


@pytest.fixture
def drawn(monkeypatch):
    """The figures `plot.run` draws, in order (it closes them, which leaves their artists readable)."""
    figures = []

    def spy(*args, **kwargs):
        figures.append(real(*args, **kwargs))
        return figures[-1]

    real = plot.figure
    monkeypatch.setattr(plot, "figure", spy)
    return figures


def labelled_lines(fig):
    return [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]


def band_edges(fig):
    return [line for line in fig.axes[0].get_lines() if line.get_label() == "_band_edge"]


def bands(fig):
    return [c for c in fig.axes[0].collections if c.get_label() == "_band"]


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])


def test_default_outputs_are_png_pdf_and_svg_in_the_path(campaign, capsys):
    assert main(["plot", str(campaign)]) == 0
    png = campaign / "plot_mean_reward.png"
    written = [png, png.with_suffix(".pdf"), png.with_suffix(".svg")]
    assert capsys.readouterr().out.splitlines()[:3] == [str(p) for p in written]
    width, height = png_size(png)
    assert width >= 1600 and height >= 900
    assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    svg = png.with_suffix(".svg").read_text()
    assert "<svg" in svg and "Mean reward" in svg  # text kept as text (svg.fonttype none): editable


def test_eval_metric_with_smoothing_to_a_chosen_file(campaign, tmp_path, capsys):
    out = tmp_path / "figs" / "acc.png"
    assert main(["plot", str(campaign), "--metric", "eval/accuracy", "--smooth", "2", "--out", str(out)]) == 0
    assert png_size(out)[0] >= 1600
    assert (tmp_path / "figs" / "acc.pdf").is_file() and (tmp_path / "figs" / "acc.svg").is_file()


def test_several_metrics_make_several_figures_into_a_folder(campaign, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["plot", str(campaign), "--metric", "eval/accuracy", "--metric", "mean_reward",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"plot_{m}.{ext}" for m in ("eval_accuracy", "mean_reward") for ext in ("png", "pdf", "svg"))
    assert main(["plot", str(campaign), "--metric", "eval/accuracy", "--metric", "mean_reward",
                 "--out", str(tmp_path / "one.png")]) == 2
    assert "--out is a folder" in capsys.readouterr().err


def test_curves_pool_seeds_step_by_step(campaign):
    c = curves(load_runs(campaign), "eval/accuracy")["grpo+none"]
    # seed 2 was killed at 7, its last evaluation 0.30 at step 5: held at step 10 beside 0.40 and 0.50
    assert c["steps"] == [0, 5, 10] and len(c["runs"]) == 3 and abs(c["mean"][2] - 0.40) < 1e-12
    assert c["n"] == [3, 3, 3] and c["held"] == [(2, 5)] and c["low"][2] < 0.40 < c["high"][2]
    assert c["low"][0] == pytest.approx(0.1) and c["high"][0] == pytest.approx(0.1)  # three seeds 0.1: no spread


def test_each_condition_has_its_own_colour_and_line_style(tmp_path, close_figures):
    names = ["grpo", "maxrl", "maxrl_gtpo", "maxrl_gtpo_sepa", "maxrl_gtpo_hicra"]
    for i, algorithm in enumerate(names):
        for seed in (0, 1, 2):
            make_run(tmp_path / algorithm / f"seed={seed}", seed=seed, algorithm=algorithm, transform="none",
                     condition_choice=None, steps_done=10, evals={0: 0.1, 10: 0.1 * i + 0.01 * seed})
    fig = figure(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    lines = labelled_lines(fig)
    assert len(lines) == 5
    assert len({line.get_color() for line in lines}) == 5
    # four line styles for five conditions: the fifth repeats the first's style, in another colour
    assert [line.get_linestyle() for line in lines] == ["-", "--", ":", "-.", "-"]
    # each band is a translucent fill under two thin edge lines, all in its condition's colour
    edges, fills = band_edges(fig), bands(fig)
    assert [e.get_color() for e in edges] == [line.get_color() for line in lines for _ in range(2)]
    assert all(e.get_linewidth() < lines[0].get_linewidth() for e in edges)
    assert [to_hex(f.get_facecolor()[0], keep_alpha=False) for f in fills] == [to_hex(line.get_color())
                                                                               for line in lines]
    # the legend names the conditions; make_run's mean_reward depends on seed and step only: every curve is
    # grpo's, and the caption says so
    assert [line.get_label() for line in lines] == sorted(f"{name}+none" for name in names)
    data = curves(load_runs(tmp_path), "mean_reward")
    assert "maxrl+none's mean curve is grpo+none's, drawn over it." in caption(data, "mean_reward")
    # evaluation curves differ (final accuracy 0.1·i) and carry markers, cycled like the line styles
    fig = figure(curves(load_runs(tmp_path), "eval/accuracy"), "eval/accuracy")
    assert [line.get_marker() for line in labelled_lines(fig)] == ["o", "s", "^", "D", "o"]
    assert "mean curve is" not in caption(curves(load_runs(tmp_path), "eval/accuracy"), "eval/accuracy")


def test_a_condition_keeps_its_colour_in_every_figure_of_a_call(tmp_path, drawn, capsys):
    """`policy/cov_fraction` is logged only by the kl_cov runs: drawn alone, they must not take the first
    colour (grpo's in the accuracy figure of the same call)."""
    for seed in (0, 1, 2):
        make_run(tmp_path / "a" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=10, evals={0: 0.1, 10: 0.3})
        run = make_run(tmp_path / "b" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                       condition_choice=None, steps_done=10, evals={0: 0.1, 10: 0.4},
                       config={"algorithm": {"loss": {"mode": "kl_cov"}}})
        with (run / "metrics.jsonl").open("a") as f:
            for step in range(10):
                f.write(json.dumps({"step": step, "policy/cov_fraction": 0.02 + 0.001 * seed}) + "\n")
    assert main(["plot", str(tmp_path), "--metric", "eval/accuracy", "--metric", "policy/cov_fraction",
                 "--out", str(tmp_path / "figs")]) == 0
    accuracy, cov = (
        {line.get_label().split(" (")[0]: (line.get_color(), line.get_linestyle()) for line in labelled_lines(f)}
        for f in drawn)
    assert list(accuracy) == ["grpo+none", "grpo+none,loss=kl_cov"] and list(cov) == ["grpo+none,loss=kl_cov"]
    assert cov["grpo+none,loss=kl_cov"] == accuracy["grpo+none,loss=kl_cov"] != accuracy["grpo+none"]


def test_a_band_that_leaves_the_unit_interval_ends_on_the_bound_and_never_runs_along_it(tmp_path, close_figures):
    # accuracies per seed at steps 0, 5, 10, 15: at 5 and 10 they are 0.0, 0.0, 0.9 → mean 0.3, sd 0.5196,
    # half 4.3027·0.5196/√3 = 1.2908 → t-interval [-0.99, 1.59]: outside [0, 1] on both sides
    for seed, acc in enumerate([(0.5, 0.0, 0.0, 0.5), (0.5, 0.0, 0.0, 0.5), (0.6, 0.9, 0.9, 0.6)]):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=15, max_steps=15, evals=dict(zip((0, 5, 10, 15), acc)))
    c = curves(load_runs(tmp_path), "eval/accuracy")["grpo+none"]
    assert c["range"] == (0.0, 1.0)
    assert c["low"][1] == pytest.approx(0.3 - 1.2908, abs=1e-4)
    assert c["high"][1] == pytest.approx(0.3 + 1.2908, abs=1e-4)
    fig = figure({"grpo+none": c}, "eval/accuracy")
    edges = band_edges(fig)
    assert len(edges) == 2
    for edge in edges:
        xs, ys = (np.asarray(v, dtype=float) for v in edge.get_data())
        drawn = np.isfinite(ys)
        assert drawn.any() and (ys[drawn] >= 0.0).all() and (ys[drawn] <= 1.0).all()
        # no drawn segment (two consecutive finite points) lies on a bound: nothing is flattened into a line
        for y0, y1 in zip(ys[:-1], ys[1:], strict=True):
            assert not (np.isfinite(y0) and np.isfinite(y1) and y0 == y1 and y0 in (0.0, 1.0))
    # the lower edge falls from 0.39 at step 0 (values 0.5, 0.5, 0.6) through 0 between steps 0 and 5 and ends
    # there, exactly on the bound where the straight edge crosses it; it comes back between steps 10 and 15
    low = np.asarray(edges[0].get_ydata(), dtype=float)
    lx = np.asarray(edges[0].get_xdata(), dtype=float)
    on_bound = lx[low == 0.0]
    assert len(on_bound) == 2 and 0 < on_bound[0] < 5 and 10 < on_bound[1] < 15
    expected = 0 + (0 - c["low"][0]) / (c["low"][1] - c["low"][0]) * 5
    assert on_bound[0] == pytest.approx(expected)
    # the fill reaches the bounds, not past them
    (fill,) = bands(fig)
    ys = np.concatenate([path.vertices[:, 1] for path in fill.get_paths()])
    assert ys.min() == 0.0 and ys.max() == 1.0
    assert "Intervals cut at [0, 1], the metric's range: grpo+none." in caption({"grpo+none": c}, "eval/accuracy")


def test_band_segments_cut_exactly_and_split_where_no_interval():
    segs = band_segments([0, 1, 2, 3, 4], [0.2, -0.2, None, 0.1, 0.1], [0.4, 0.6, None, 0.3, 0.3], 0.0, 1.0)
    assert len(segs) == 2  # step 2 has no interval (fewer than 3 seeds): the band stops there
    first = segs[0]
    assert first["x"] == [0.0, 0.5, 1.0]  # the lower edge crosses 0 half-way between steps 0 and 1
    assert first["low_edge"][:2] == [0.2, 0.0] and math.isnan(first["low_edge"][2])
    assert first["bottom"] == [0.2, 0.0, 0.0] and first["cut"] and not segs[1]["cut"]
    assert band_segments([0, 1], [1.0, 2.0], [3.0, 4.0], -math.inf, math.inf)[0]["x"] == [0.0, 1.0]


def test_axes_are_labelled_in_words_on_one_line_and_no_title_is_drawn(campaign, close_figures):
    for metric, expected in (("eval/accuracy", "Held-out accuracy"), ("mean_reward", "Mean reward"),
                             ("step_time_s", "Step time (s)")):
        fig = figure(curves(load_runs(campaign), metric), metric)
        ax = fig.axes[0]
        assert ax.get_title(loc="left") + ax.get_title() + ax.get_title(loc="right") == ""  # the caption's job
        assert (ax.get_ylabel(), ax.get_xlabel()) == (expected, "RL step") and "\n" not in ax.get_ylabel()
    assert words("some/custom_metric") == "some/custom_metric"  # not in the table: the key itself


def test_the_mean_reward_is_cut_at_0_and_1_only_when_every_verifier_scores_there():
    assert value_range("mean_reward", [{"reward": {"_target_": "rlvr.reward.exact.ExactMatch"}}]) == (0.0, 1.0)
    assert value_range("eval/mean_reward", [{"reward": {"_target_": "rlvr.reward.math.MathVerify"}}]) == (0.0, 1.0)
    function = {"reward": {"_target_": "rlvr.reward.function.FunctionReward", "function": "m.f"}}
    assert value_range("mean_reward", [function]) == (-math.inf, math.inf)
    assert value_range("mean_reward", []) == (-math.inf, math.inf)  # no config: unknown
    assert value_range("mean_completion_length") == (0.0, math.inf)
    assert not unit_interval("mean_reward") and unit_interval("eval/accuracy") and unit_interval("clip_fraction")


def test_fewer_than_three_runs_show_each_run_instead_of_a_band(tmp_path, close_figures):
    for seed in (0, 1):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=10)
    fig = figure(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    assert not band_edges(fig) and not bands(fig)
    (mean,) = labelled_lines(fig)
    assert mean.get_label() == "grpo+none"
    runs = [line for line in fig.axes[0].get_lines() if line is not mean]
    assert len(runs) == 2 and all(line.get_color() == mean.get_color() for line in runs)
    text = caption(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    assert "grpo+none: 2 seeds" in text and "fewer than 3 seeds, no interval; each run is drawn" in text


def test_step_ticks_are_integers(tmp_path, close_figures):
    # three logged steps, 0..2: matplotlib's default ticks would be 0, 0.25, 0.5, …
    for seed in (0, 1, 2):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=3)
    fig = figure(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)


def test_no_edges_where_the_seeds_agree_but_they_fan_out_from_the_mean():
    # SEPA's λ: 0 for every seed until step 2, then spreading out
    (seg,) = band_segments([0, 1, 2, 3], [0.0, 0.0, 0.0, 0.1], [0.0, 0.0, 0.0, 0.3], 0.0, 1.0)
    assert [math.isnan(v) for v in seg["low_edge"]] == [True, True, False, False]
    assert seg["high_edge"][2:] == [0.0, 0.3]
