"""bench.maze on a synthetic campaign folder (the real one is the ~2 h campaign): the paper's table beside the
runs' means, intervals and differences from GRPO paired by seed, as rlvr compare computes them."""

import json

import pytest

from rlvr.cli.compare import t_interval
from tests.cli.conftest import make_run

# condition folder → (algorithm, its config, per-seed (pass@1, pass@2, pass@4) at the end)
ARMS = {
    "grpo_scaled": ("grpo", {"algorithm": {"scale": "std"}}, [(0.20, 0.30, 0.40), (0.22, 0.33, 0.44),
                                                                (0.18, 0.28, 0.38)]),
    "maxrl": ("maxrl", {}, [(0.25, 0.40, 0.55), (0.26, 0.42, 0.57), (0.24, 0.39, 0.52)]),
}


@pytest.fixture
def campaign(tmp_path):
    root = tmp_path / "maxrl_maze" / "cpu"
    for folder, (algorithm, config, seeds) in ARMS.items():
        for seed, values in enumerate(seeds):
            run = make_run(root / folder / f"seed={seed}", seed=seed, algorithm=algorithm, transform="none",
                           condition_choice=folder, steps_done=2, max_steps=2, config=config)
            rows = [{"step": 0, "eval/accuracy": 0.1, "eval/pass@1": 0.1, "eval/pass@2": 0.15},
                    {"step": 2, "eval/accuracy": values[0],
                     **{f"eval/pass@{k}": v for k, v in zip((1, 2, 4), values, strict=True)}}]
            with open(run / "metrics.jsonl", "a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
    return root


def test_the_table_holds_compares_numbers_at_the_largest_k(campaign, run_bench):
    result = json.loads(run_bench("-m", "bench.maze", str(campaign), "--json"))
    assert result["k"] == 4  # every run's last evaluation measured k = 1, 2, 4
    rows = {r["condition"]: r for r in result["results"]["eval/pass@4"]["conditions"]}
    assert set(rows) == {"grpo+none,scale=std", "maxrl+none"}
    diffs = [m[2] - g[2] for m, g in zip(ARMS["maxrl"][2], ARMS["grpo_scaled"][2], strict=True)]
    assert rows["maxrl+none"]["diff"]["mean"] == pytest.approx(sum(diffs) / 3)  # (0.15 + 0.13 + 0.14) / 3 = 0.14
    assert rows["maxrl+none"]["diff"]["ci95"] == pytest.approx(t_interval(diffs))
    assert result["initial_pass1"] == [0.1] * 6
    assert result["ordering"] == []  # no GRPO + entropy or PKPO arm: no adjacent pair of the paper's ordering


def test_the_command_prints_the_paper_beside_the_runs(campaign, run_bench):
    out = run_bench("-m", "bench.maze", str(campaign))
    assert "| GRPO (`grpo+none,scale=std`) | 39.6 | 42.4 | 43.0 | 20.0 [" in out
    assert "| MaxRL (`maxrl+none`) | 84.4 | 92.0 | 94.3 | 25.0 [" in out and "+14.0 [" in out
    assert "MaxRL − GRPO, eval/pass@1: power:" in out
