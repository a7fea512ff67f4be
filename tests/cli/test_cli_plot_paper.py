"""`rlvr plot` for a paper (issue 37, requirement 8): bands as shaded areas cut to the metric's range; the
explanation printed by the command and stored in each file's metadata, never inside the axes; `--smooth` over
a window of steps; `--size`, `--font-size`, `--legend`; each curve's last point is `rlvr compare`'s final value."""

import html
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from PIL import Image

from rlvr.cli import plot
from rlvr.cli.compare import compare
from rlvr.cli.main import main
from rlvr.cli.plot import curves, figure, smooth
from rlvr.cli.runs import load_runs
from tests.cli.conftest import make_run


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


def mean_lines(fig) -> dict:
    return {line.get_label(): line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}


def out_of_range_runs(root):
    """Accuracies per seed at steps 0, 5, 10, 15: at 5 and 10 the 95% t-interval is [-0.99, 1.59]."""
    for seed, acc in enumerate([(0.5, 0.0, 0.0, 0.5), (0.5, 0.0, 0.0, 0.5), (0.6, 0.9, 0.9, 0.6)]):
        make_run(root / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=15, max_steps=15, evals=dict(zip((0, 5, 10, 15), acc)))


def test_bands_are_shaded_areas_cut_to_the_metrics_range_under_the_mean(tmp_path):
    out_of_range_runs(tmp_path)
    fig = figure(curves(load_runs(tmp_path), "eval/accuracy"), "eval/accuracy")
    (band,) = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() == 0.0 and ys.max() == 1.0  # filled up to the bounds, not past them
    assert band.get_alpha() <= 0.3  # translucent: two overlapping bands stay readable, the lines on top
    (mean,) = mean_lines(fig).values()
    assert np.allclose(band.get_facecolor()[0][:3], plt.matplotlib.colors.to_rgb(mean.get_color()))
    assert mean.get_zorder() > band.get_zorder()
    plt.close(fig)


def test_the_explanation_is_printed_and_stored_in_the_figure_not_drawn_in_it(tmp_path, drawn, capsys):
    out_of_range_runs(tmp_path)
    assert main(["plot", str(tmp_path), "--metric", "eval/accuracy"]) == 0
    out = capsys.readouterr().out
    png = tmp_path / "plot_eval_accuracy.png"
    assert out.splitlines()[:3] == [str(png.with_suffix(s)) for s in (".png", ".pdf", ".svg")]
    said = " ".join(out.split()[3:])
    for words in ("mean over seeds", "95% Student-t interval", "grpo+none: 3 seeds", "cut at [0, 1]",
                  "not smoothed"):
        assert words in said
    assert Image.open(png).text["Description"] == said
    assert "Held-out accuracy" in Image.open(png).text["Title"]
    svg = png.with_suffix(".svg").read_text()
    assert html.unescape(re.search(r"<dc:description>(.*?)</dc:description>", svg, re.S).group(1)) == said
    pdf = png.with_suffix(".pdf").read_bytes()  # a PDF text string: UTF-16BE after a byte-order mark
    assert b"/Subject (\xfe\xff" + "Held-out accuracy per RL step: for each condition".encode("utf-16-be") in pdf
    # in the figure: the condition's name, nothing else; no text in the axes
    (fig,) = drawn
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["grpo+none"]
    assert fig.legends[0].get_title().get_text() == ""
    assert not fig.axes[0].texts


def test_smoothing_is_a_window_of_steps_so_a_sparse_evaluation_ends_on_its_last_value(tmp_path, drawn, capsys):
    assert smooth([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert smooth([0, 1, 5, 6], [1.0, 3.0, 5.0, 7.0], 3) == [1.0, 2.0, 5.0, 6.0]  # steps 3..5, 4..6
    for seed in (0, 1, 2):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice=None, steps_done=100, max_steps=100,
                 evals={0: 0.1, 25: 0.2, 50: 0.3, 75: 0.4, 100: 0.5 + 0.01 * seed})
    assert main(["plot", str(tmp_path), "--metric", "eval/accuracy", "--metric", "mean_reward", "--smooth", "10",
                 "--out", str(tmp_path / "figs")]) == 0
    accuracy, reward = (next(iter(mean_lines(f).values())).get_ydata() for f in drawn)
    assert accuracy[-1] == pytest.approx(0.51)  # the last evaluation's value, not a mean with the one before
    # every step logged: a mean over the 10 steps 90..99 of 0.1·seed + 0.01·step, over the seeds
    assert reward[-1] == pytest.approx(0.1 + 0.01 * 94.5)
    assert "trailing mean over a window of 10 steps" in " ".join(capsys.readouterr().out.split())


def test_size_font_size_and_legend_options(tmp_path, drawn, capsys):
    out_of_range_runs(tmp_path)
    png = tmp_path / "fig.png"
    assert main(["plot", str(tmp_path), "--metric", "eval/accuracy", "--out", str(png), "--size", "3.3x2.5",
                 "--font-size", "7", "--legend", "upper-right"]) == 0
    assert Image.open(png).size == (990, 750)  # inches × 300 dpi
    fig = drawn[-1]
    assert fig.axes[0].yaxis.label.get_fontsize() == 7
    assert fig.axes[0].get_legend() is not None and not fig.legends  # in the axes, at the corner asked
    assert main(["plot", str(tmp_path), "--metric", "eval/accuracy", "--out", str(png), "--legend", "none"]) == 0
    assert drawn[-1].axes[0].get_legend() is None and not drawn[-1].legends
    assert main(["plot", str(tmp_path), "--metric", "eval/accuracy", "--out", str(png), "--legend", "right"]) == 0
    fig = drawn[-1]
    fig.canvas.draw()
    assert fig.legends[0].get_window_extent().x0 >= fig.axes[0].get_window_extent().x1  # beside the axes
    capsys.readouterr()
    for args, named in ((["--size", "3x"], "--size"), (["--size", "0x2"], "--size"), (["--size", "abc"], "--size"),
                        (["--size", "nanx2"], "--size"), (["--font-size", "0"], "--font-size"),
                        (["--font-size", "nan"], "--font-size"), (["--smooth", "0"], "--smooth"),
                        (["--legend", "middle"], "--legend")):
        assert main(["plot", str(tmp_path), "--metric", "eval/accuracy", "--out", str(png), *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"rlvr plot: error: {named}") and "Traceback" not in err, err
    assert "upper-left" in err  # a bad --legend lists the choices


@pytest.mark.parametrize("metric", ["eval/accuracy", "mean_reward"])
def test_the_last_point_of_each_curve_is_rlvr_compares_final_value(campaign, metric, drawn, capsys):
    """The campaign has a run killed at step 7 (its last evaluation at step 5), one preempted at 6, and here an
    older duplicate of grpo seed 0 that compare leaves out: the figure agrees with compare all the same."""
    make_run(campaign / "grpo" / "seed=0-old", seed=0, algorithm="grpo", transform="none", condition_choice=None,
             steps_done=10, evals={0: 0.1, 10: 0.9}, age_s=3600, config={"algorithm": {}})
    table = {row["condition"]: row for row in compare(load_runs(campaign), metric)["conditions"]}
    assert main(["plot", str(campaign), "--metric", metric]) == 0
    lines = mean_lines(drawn[0])
    assert sorted(lines) == sorted(table)
    data = curves(load_runs(campaign), metric)
    for condition, row in table.items():
        assert lines[condition].get_ydata()[-1] == pytest.approx(row["mean"], abs=1e-12)
        c = data[condition]
        assert c["mean"][-1] == pytest.approx(row["mean"], abs=1e-12) and c["n"][-1] == row["n"]
        if row["ci95"] is None:
            assert c["low"][-1] is None
        else:
            assert [c["low"][-1], c["high"][-1]] == pytest.approx(row["ci95"], abs=1e-12)
    if metric == "eval/accuracy":  # the killed run's last evaluation (0.30 at step 5) is held to step 10
        said = " ".join(capsys.readouterr().out.split())
        assert "grpo+none seed 2 logged it last at step 5: that value is held to step 10" in said
