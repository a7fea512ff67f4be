"""`rlvr plot`: a PNG per metric, curves averaged over seeds."""

from rlvr.cli.main import main
from rlvr.cli.plot import curves, smooth, t_band
from rlvr.cli.runs import load_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
    # step 10 has seeds 0, 1 only (seed 2 was killed at 7): mean of 0.40, 0.50
    assert c["steps"] == [0, 5, 10] and c["n_runs"] == 3 and abs(c["mean"][2] - 0.45) < 1e-12
    assert abs(c["half"][0]) < 1e-12  # all three seeds 0.1 at step 0: no spread


def test_smoothing_and_band_arithmetic():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    # [0, 2]: mean 1, sd √2, t(0.975, 1) = 12.706 → half = 12.706·√2/√2 = 12.706
    mean, half = t_band([0.0, 2.0])
    assert mean == 1.0 and abs(half - 12.706) < 1e-9
    assert t_band([3.0]) == (3.0, 0.0)
