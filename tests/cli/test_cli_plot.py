"""`rlvr plot`: a PNG per metric, curves averaged over seeds; each condition its own colour and line style,
bands only from ≥ 3 seeds and inside the metric's range, integer steps on the x axis."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from rlvr.cli.main import main
from rlvr.cli.plot import curves, figure, smooth, unit_interval
from rlvr.cli.runs import load_runs
from tests.cli.conftest import make_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


def labelled_lines(fig):
    return [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]


def band_vertices_y(fig) -> np.ndarray:
    bands = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    return np.concatenate([path.vertices[:, 1] for band in bands for path in band.get_paths()])


def test_default_output_is_a_png_in_the_path(campaign, capsys):
    assert main(["plot", str(campaign)]) == 0
    out = campaign / "plot_mean_reward.png"
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 1000


def test_eval_metric_with_smoothing_to_a_chosen_file(campaign, tmp_path, capsys):
    out = tmp_path / "figs" / "acc.png"
    assert main(["plot", str(campaign), "--metric", "eval/accuracy", "--smooth", "2", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_curves_pool_seeds_step_by_step(campaign):
    c = curves(load_runs(campaign), "eval/accuracy")["grpo+none"]
    # step 10 has seeds 0, 1 only (seed 2 was killed at 7): mean of 0.40, 0.50, and no band from 2 seeds
    assert c["steps"] == [0, 5, 10] and len(c["runs"]) == 3 and abs(c["mean"][2] - 0.45) < 1e-12
    assert c["low"][2] is None and c["high"][2] is None
    assert c["low"][0] == pytest.approx(0.1) and c["high"][0] == pytest.approx(0.1)  # three seeds 0.1: no spread


def test_smoothing():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_each_condition_has_its_own_colour_and_line_style(tmp_path, close_figures):
    for i, condition in enumerate(["grpo", "maxrl", "maxrl_gtpo", "maxrl_gtpo_sepa", "maxrl_gtpo_hicra"]):
        for seed in (0, 1, 2):
            make_run(tmp_path / condition / f"seed={seed}", seed=seed, algorithm=condition, transform="none",
                     condition_choice=condition, steps_done=10, evals={0: 0.1, 10: 0.1 * i})
    fig = figure(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    lines = labelled_lines(fig)
    assert len(lines) == 5
    assert len({line.get_color() for line in lines}) == 5
    # four line styles for five conditions: the fifth repeats the first's style, in another colour
    assert [line.get_linestyle() for line in lines] == ["-", "--", ":", "-.", "-"]
    bands = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert [tuple(b.get_facecolor()[0][:3]) for b in bands] == [tuple(line.get_color()) for line in lines]
    # make_run's mean_reward depends on seed and step only: every curve is grpo's, and the legend says so
    assert [line.get_label() for line in lines][:2] == ["grpo (n=3)", "maxrl (n=3, same curve as grpo)"]
    # evaluation curves differ (final accuracy 0.1·i) and carry markers, cycled like the line styles
    fig = figure(curves(load_runs(tmp_path), "eval/accuracy"), "eval/accuracy")
    assert [line.get_marker() for line in labelled_lines(fig)] == ["o", "s", "^", "D", "o"]
    assert not any("same curve" in line.get_label() for line in labelled_lines(fig))


def test_bands_are_clipped_to_the_unit_interval_for_accuracies(tmp_path, close_figures):
    # step 10: accuracies 0.0, 0.0, 0.9 → mean 0.3, sd 0.5196, half 4.3027·0.5196/√3 = 1.2908 →
    # t-interval [-0.99, 1.59], drawn as [0, 1]
    for seed, final in enumerate([0.0, 0.0, 0.9]):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice="grpo", steps_done=10, evals={0: 0.5, 10: final})
    data = curves(load_runs(tmp_path), "eval/accuracy")
    assert data["grpo"]["range"] == (0.0, 1.0) and (data["grpo"]["low"][-1], data["grpo"]["high"][-1]) == (0.0, 1.0)
    ys = band_vertices_y(figure(data, "eval/accuracy"))
    assert ys.min() == 0.0 and ys.max() == 1.0


def test_bands_of_other_metrics_stay_inside_the_logged_values(campaign, close_figures):
    # mean_reward = 0.1·seed + 0.01·step, seeds 0, 1, 2: at step 0 values 0, 0.1, 0.2 → sd 0.1 →
    # half 4.3027·0.1/√3 = 0.248 → [-0.148, 0.348]; the logged values lie in [0, 0.29]
    data = curves(load_runs(campaign), "mean_reward")["grpo+none"]
    assert data["range"] == (0.0, 0.1 * 2 + 0.01 * 9)
    assert data["low"][0] == 0.0 and data["high"][0] == 0.1 * 2 + 0.01 * 9
    assert not unit_interval("mean_reward") and unit_interval("eval/accuracy") and unit_interval("clip_fraction")


def test_fewer_than_three_runs_show_each_run_instead_of_a_band(tmp_path, close_figures):
    for seed in (0, 1):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice="grpo", steps_done=10)
    fig = figure(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    assert not [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    (mean,) = labelled_lines(fig)
    assert mean.get_label() == "grpo (n=2, no band: each run shown)"
    runs = [line for line in fig.axes[0].get_lines() if line is not mean]
    assert len(runs) == 2 and all(line.get_color() == mean.get_color() for line in runs)
    assert "no band: fewer than 3 seeds" in fig.axes[0].get_title()


def test_step_ticks_are_integers(tmp_path, close_figures):
    # three logged steps, 0..2: matplotlib's default ticks would be 0, 0.25, 0.5, …
    for seed in (0, 1, 2):
        make_run(tmp_path / "grpo" / f"seed={seed}", seed=seed, algorithm="grpo", transform="none",
                 condition_choice="grpo", steps_done=3)
    fig = figure(curves(load_runs(tmp_path), "mean_reward"), "mean_reward")
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
