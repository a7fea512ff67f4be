"""`rlvr plot --passk`: pass@k against k on a log₂ axis at each run's last sampled evaluation, per condition the
mean over seeds with the 95% t band (as compare's intervals), to the largest k all of its seeds measured."""

import json
import math

import matplotlib.pyplot as plt
import pytest

from rlvr.cli import plot
from rlvr.cli.compare import t_interval
from rlvr.cli.main import main
from rlvr.cli.plot import last_passk, passk_caption, passk_curves
from rlvr.cli.runs import load_runs
from tests.cli.conftest import make_run

# condition → seed → pass@k at the last evaluation (k = 1, 2, 4, 8); maxrl seed 2 measured only to k = 4
PASS = {
    "grpo": {0: [0.10, 0.18, 0.30, 0.40], 1: [0.12, 0.20, 0.33, 0.45], 2: [0.08, 0.15, 0.25, 0.36]},
    "maxrl": {0: [0.20, 0.32, 0.48, 0.60], 1: [0.25, 0.38, 0.52, 0.66], 2: [0.22, 0.35, 0.50]},
}


def passk_row(step: int, values: list[float]) -> dict:
    ks = [2 ** i for i in range(len(values))]
    return {"step": step, "eval/accuracy": values[0], "eval/pass@1": values[0],
            **{f"eval/pass@{k}": v for k, v in zip(ks, values, strict=True)}, "eval_time_s": 1.0}


@pytest.fixture
def grid(tmp_path):
    """Two conditions × three seeds; each run's first evaluation at k = 2 (step 0), its last at k = 8 (step 4)."""
    root = tmp_path / "maze"
    for condition, by_seed in PASS.items():
        for seed, values in by_seed.items():
            folder = make_run(root / condition / f"seed={seed}", seed=seed, algorithm=condition, transform="none",
                              condition_choice=condition, steps_done=4, max_steps=4)
            with open(folder / "metrics.jsonl", "a") as f:
                f.write(json.dumps(passk_row(0, [0.05, 0.09])) + "\n")  # the start's, smaller k
                f.write(json.dumps(passk_row(4, values)) + "\n")
    return root


def test_each_run_gives_its_last_evaluation_with_pass_at_k(grid):
    runs = {(r.condition, r.seed): r for r in load_runs(grid)}
    assert last_passk(runs["maxrl+none", 2]) == (4, {1: 0.22, 2: 0.35, 4: 0.50})
    assert last_passk(runs["grpo+none", 0]) == (4, dict(zip([1, 2, 4, 8], PASS["grpo"][0], strict=True)))


def test_curves_are_the_seeds_means_and_intervals_in_log2_k(grid):
    data = passk_curves(load_runs(grid))
    assert list(data) == ["grpo+none", "maxrl+none"]
    grpo, maxrl = data["grpo+none"], data["maxrl+none"]
    assert grpo["ks"] == [1, 2, 4, 8] and grpo["steps"] == [0.0, 1.0, 2.0, 3.0]  # x = log₂ k
    assert maxrl["ks"] == [1, 2, 4]  # seed 2 stopped at k = 4: the curve ends where every seed has a value
    for i in range(len(grpo["ks"])):
        seeds = [PASS["grpo"][s][i] for s in (0, 1, 2)]
        assert grpo["mean"][i] == pytest.approx(sum(seeds) / 3)
        assert (grpo["low"][i], grpo["high"][i]) == pytest.approx(t_interval(seeds))  # compare's interval
    assert grpo["at"] == {0: 4, 1: 4, 2: 4}  # the last evaluation, not the start's k = 2 one
    # pass@1 of grpo: mean 0.10, sd 0.02, t(0.975, 2) = 4.303: half-width 4.303·0.02/√3 = 0.0497
    assert grpo["high"][0] - grpo["mean"][0] == pytest.approx(4.3027 * 0.02 / math.sqrt(3), abs=1e-4)
    text = passk_caption(data)
    assert "step 4" in text and "grpo+none: 3 seeds, k ≤ 8; maxrl+none: 3 seeds, k ≤ 4" in text


def test_the_command_writes_the_figure_on_a_log2_axis(grid, capsys, monkeypatch):
    drawn = []
    real = plot.figure
    monkeypatch.setattr(plot, "figure", lambda *a, **kw: drawn.append(real(*a, **kw)) or drawn[-1])
    assert main(["plot", str(grid), "--passk"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [str(grid / f"plot_passk.{ext}") for ext in ("png", "pdf", "svg")]
    (fig,) = drawn  # --passk alone: no mean_reward figure
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert ax.get_xlabel().startswith("k (samples") and ax.get_ylabel() == "Held-out pass@k"
    plt.close("all")


def test_runs_without_sampled_evaluations_are_refused_by_name(tmp_path, capsys):
    make_run(tmp_path / "g" / "seed=0", seed=0, algorithm="grpo", transform="none", condition_choice=None,
             steps_done=2, evals={0: 0.1, 2: 0.2})
    assert main(["plot", str(tmp_path), "--passk"]) != 0
    assert "eval/pass@1" in capsys.readouterr().err
