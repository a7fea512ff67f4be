"""`rlvr compare`: per-condition means across seeds, bootstrap CIs, paired differences to a baseline."""

import json

import numpy as np

from rlvr.cli.compare import bootstrap_ci
from rlvr.cli.main import main

# final eval/accuracy per seed, as tests/cli/conftest.py writes them
GRPO_FINAL = {0: 0.40, 1: 0.50, 2: 0.30}
SEPA_FINAL = {0: 0.55, 1: 0.60, 2: 0.50}


def compare_json(path, capsys, *extra) -> dict:
    assert main(["compare", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_final_accuracy_means_and_the_paired_difference(campaign, capsys):
    out = compare_json(campaign, capsys)
    assert out["baseline"] == "grpo+none" and out["metric"] == "eval/accuracy"
    rows = {r["condition"]: r for r in out["conditions"]}
    # grpo finals 0.40, 0.50, 0.30 (the killed seed's last evaluation) → mean 0.40
    assert rows["grpo+none"]["n"] == 3 and abs(rows["grpo+none"]["mean"] - 0.40) < 1e-12
    # sepa finals 0.55, 0.60 (preempted: its last evaluation), 0.50 → mean 0.55
    assert abs(rows["maxrl_gtpo_sepa"]["mean"] - 0.55) < 1e-12
    # per-seed differences 0.15, 0.10, 0.20 → mean 0.15, all three seeds won
    diff = rows["maxrl_gtpo_sepa"]["diff"]
    per_seed = [SEPA_FINAL[s] - GRPO_FINAL[s] for s in (0, 1, 2)]
    assert abs(diff["mean"] - np.mean(per_seed)) < 1e-12 and abs(diff["mean"] - 0.15) < 1e-12
    assert (diff["n_paired"], diff["wins"]) == (3, 3)
    for ci, mean in ((rows["grpo+none"]["ci95"], 0.40), (rows["maxrl_gtpo_sepa"]["ci95"], 0.55),
                     (diff["ci95"], 0.15)):
        assert ci[0] <= mean <= ci[1]
    # hicra's seeds 0, 1 each evaluated only at step 0 (0.2); paired with grpo seeds 0, 1
    hicra = rows["gtpo+hicra"]
    assert hicra["n"] == 2 and abs(hicra["diff"]["mean"] - ((0.2 - 0.4) + (0.2 - 0.5)) / 2) < 1e-12


def test_output_is_reproducible(campaign, capsys):
    assert compare_json(campaign, capsys) == compare_json(campaign, capsys)
    assert main(["compare", str(campaign)]) == 0
    first = capsys.readouterr().out
    assert main(["compare", str(campaign)]) == 0
    assert capsys.readouterr().out == first


def test_last_k_averages_the_last_values_of_a_training_metric(campaign, capsys):
    out = compare_json(campaign, capsys, "--metric", "mean_reward", "--at", "last-k", "--k", "2",
                       "--baseline", "maxrl_gtpo_sepa")
    rows = {r["condition"]: r for r in out["conditions"]}
    # grpo seed s, 10 steps: rewards at steps 8, 9 = 0.1·s + 0.08, 0.1·s + 0.09 → 0.1·s + 0.085;
    # seed 2 killed after step 6: steps 5, 6 → 0.2 + 0.055.  Mean = (0.085 + 0.185 + 0.255) / 3
    assert abs(rows["grpo+none"]["mean"] - (0.085 + 0.185 + 0.255) / 3) < 1e-12
    assert out["baseline"] == "maxrl_gtpo_sepa" and "diff" not in rows["maxrl_gtpo_sepa"]


def test_a_single_seed_has_no_interval():
    assert bootstrap_ci([0.5]) is None
    assert bootstrap_ci([0.5, 0.5]) == [0.5, 0.5]


def test_text_table_names_the_method_and_the_baseline(campaign, capsys):
    assert main(["compare", str(campaign)]) == 0
    text = capsys.readouterr().out
    assert "percentile bootstrap, 10000 resamples" in text and "baseline: grpo+none" in text
    assert "maxrl_gtpo_sepa  3  0.5500" in text and "+0.1500" in text and "3/3" in text
