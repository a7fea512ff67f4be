"""Failures a user can cause: no runs under PATH, a metric nobody logged, a baseline that is not there."""

from rlvr.cli.main import main


def test_a_path_without_runs_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    for command in ("status", "compare", "plot"):
        assert main([command, str(tmp_path / "empty")]) == 2
        assert f"no run folders under {tmp_path / 'empty'}" in capsys.readouterr().err


def test_a_missing_path_exits_2(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nope")]) == 2
    assert "nope: no such file or directory" in capsys.readouterr().err


def test_an_unknown_metric_lists_the_known_ones(campaign, capsys):
    for command in ("compare", "plot"):
        assert main([command, str(campaign), "--metric", "eval/acc"]) == 2
        err = capsys.readouterr().err
        assert "unknown metric 'eval/acc'" in err and "eval/accuracy" in err and "mean_reward" in err


def test_an_unknown_baseline_lists_the_conditions(campaign, capsys):
    assert main(["compare", str(campaign), "--baseline", "ppo"]) == 2
    assert "grpo+none, gtpo+hicra, maxrl+sepa" in capsys.readouterr().err
