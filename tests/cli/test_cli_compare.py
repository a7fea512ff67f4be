"""`rlvr compare`: per-condition means across seeds, paired differences to a baseline, 95% t-intervals
from at least 3 seeds (per-seed values and the reason below that)."""

import json

import numpy as np

from rlvr.cli.compare import t_975, t_interval
from rlvr.cli.main import main
from tests.cli.conftest import make_run

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
    assert abs(rows["maxrl+sepa"]["mean"] - 0.55) < 1e-12
    # per-seed differences 0.15, 0.10, 0.20 → mean 0.15, all three seeds won
    diff = rows["maxrl+sepa"]["diff"]
    per_seed = [SEPA_FINAL[s] - GRPO_FINAL[s] for s in (0, 1, 2)]
    assert abs(diff["mean"] - np.mean(per_seed)) < 1e-12 and abs(diff["mean"] - 0.15) < 1e-12
    assert (diff["n"], diff["wins"]) == (3, 3) and diff["seeds"] == [0, 1, 2]
    # differences 0.15, 0.10, 0.20: sd 0.05, half-width t(0.975, 2)·0.05/√3 = 4.3027·0.028868 = 0.124208
    assert np.allclose(diff["ci95"], [0.15 - 0.124208, 0.15 + 0.124208], atol=1e-6)
    assert diff["ci95"] == t_interval(diff["values"]) and diff["no_ci"] is None
    for est, mean in ((rows["grpo+none"], 0.40), (rows["maxrl+sepa"], 0.55)):
        assert est["ci95"] == t_interval(est["values"]) and est["ci95"][0] < mean < est["ci95"][1]
    # hicra's seeds 0, 1 each evaluated only at step 0 (0.2); paired with grpo seeds 0, 1: no intervals
    hicra = rows["gtpo+hicra"]
    assert hicra["n"] == 2 and abs(hicra["diff"]["mean"] - ((0.2 - 0.4) + (0.2 - 0.5)) / 2) < 1e-12
    assert hicra["ci95"] is None and hicra["no_ci"] == "2 seeds; an interval needs at least 3"
    assert hicra["diff"]["ci95"] is None and hicra["diff"]["no_ci"] == "2 paired seeds; an interval needs at least 3"
    assert np.allclose(hicra["diff"]["values"], [0.2 - 0.4, 0.2 - 0.5])

def test_output_is_reproducible(campaign, capsys):
    assert compare_json(campaign, capsys) == compare_json(campaign, capsys)
    assert main(["compare", str(campaign)]) == 0
    first = capsys.readouterr().out
    assert main(["compare", str(campaign)]) == 0
    assert capsys.readouterr().out == first


def test_last_k_averages_the_last_values_of_a_training_metric(campaign, capsys):
    out = compare_json(campaign, capsys, "--metric", "mean_reward", "--at", "last-k", "--k", "2",
                       "--baseline", "maxrl+sepa")
    rows = {r["condition"]: r for r in out["conditions"]}
    # grpo seed s, 10 steps: rewards at steps 8, 9 = 0.1·s + 0.08, 0.1·s + 0.09 → 0.1·s + 0.085;
    # seed 2 killed after step 6: steps 5, 6 → 0.2 + 0.055.  Mean = (0.085 + 0.185 + 0.255) / 3
    assert abs(rows["grpo+none"]["mean"] - (0.085 + 0.185 + 0.255) / 3) < 1e-12
    assert out["baseline"] == "maxrl+sepa" and "diff" not in rows["maxrl+sepa"]


def test_fewer_than_three_values_have_no_interval():
    assert t_interval([]) is None and t_interval([0.5]) is None and t_interval([0.045, 0.050]) is None
    # [1, 2, 3]: mean 2, sd 1, half = 4.3027/√3 = 2.484165
    assert np.allclose(t_interval([1.0, 2.0, 3.0]), [2 - 2.484165, 2 + 2.484165], atol=1e-6)
    assert t_interval([0.5, 0.5, 0.5]) == [0.5, 0.5]


def test_t_quantiles():
    # t(0.975, df) to 4 decimals: df 1, 2, 9, 30 from the table; 40, 120 from the expansion
    for df, t in ((1, 12.7062), (2, 4.3027), (9, 2.2622), (30, 2.0423), (40, 2.0211), (120, 1.9799)):
        assert abs(t_975(df) - t) < 5e-5, df
    assert abs(t_975(31) - 2.0395) < 5e-5 and t_975(10**6) > 1.95996


def test_text_table_names_the_method_and_n_beside_each_interval(campaign, capsys):
    assert main(["compare", str(campaign)]) == 0
    text = capsys.readouterr().out
    assert "Student t, mean ± t(0.975, n−1)·sd/√n" in text and "baseline: grpo+none" in text
    # sepa: mean 0.55, values 0.55, 0.60, 0.50 → sd 0.05 → ± 0.1242; Δ +0.15 ± 0.1242, won 3 of 3
    assert "maxrl+sepa  0.5500  [0.4258, 0.6742] (t, n=3)  +0.1500" in text
    assert "[+0.0258, +0.2742] (t, n=3)  3/3" in text


def test_two_seeds_print_their_values_and_why_there_is_no_interval(tmp_path, capsys):
    """The issue's case: two seeds, Δ +0.0475 from per-seed differences 0.045 and 0.050; a percentile
    bootstrap printed [0.045, 0.050]."""
    for seed, (base, treated) in enumerate([(0.400, 0.445), (0.430, 0.480)]):
        for condition, final in (("grpo+none", base), ("maxrl+sepa", treated)):
            algorithm, transform = condition.split("+")
            make_run(tmp_path / condition / f"seed={seed}", seed=seed, algorithm=algorithm, transform=transform,
                     condition_choice=None, steps_done=10, evals={0: 0.1, 10: final})
    assert main(["compare", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "[0.0450, 0.0500]" not in text and "[" not in text.split("\n\n")[1]  # no interval anywhere in the table
    assert "maxrl+sepa  0.4625  none (n=2)  +0.0475         none (n=2)  2/2" in text
    assert "No interval from fewer than 3 seeds: from 2, a 95% t-interval is the mean ± 12.7 × half their gap" in text
    assert "maxrl+sepa − grpo+none  seed 0: +0.0450, seed 1: +0.0500" in text
    assert "grpo+none               seed 0: 0.4000, seed 1: 0.4300" in text
    diff = {r["condition"]: r for r in compare_json(tmp_path, capsys)["conditions"]}["maxrl+sepa"]["diff"]
    assert diff["ci95"] is None and diff["no_ci"] == "2 paired seeds; an interval needs at least 3"
    assert diff["seeds"] == [0, 1] and np.allclose(diff["values"], [0.045, 0.050])


def test_reach_counts_the_steps_until_a_threshold_fewer_winning(campaign, capsys):
    out = compare_json(campaign, capsys, "--reach", "0.55")
    rows = {r["condition"]: r for r in out["conditions"]}
    # maxrl+sepa evaluations: seed 0 {0: 0.1, 5: 0.3, 10: 0.55} → step 10; seed 1 {0: 0.1, 5: 0.60} → step 5;
    # seed 2 {0: 0.1, 5: 0.3, 10: 0.50} never reaches 0.55 → its 10 steps (a lower bound, counted as unreached)
    sepa = rows["maxrl+sepa"]
    assert sepa["values"] == [10.0, 5.0, 10.0] and sepa["unreached"] == 1
    # grpo never reaches 0.55 (finals 0.40, 0.50, 0.30): each counts as its 10 planned steps, the killed one too
    assert rows["grpo+none"]["unreached"] == 3 and rows["grpo+none"]["values"] == [10.0, 10.0, 10.0]
    diffs = [s - g for s, g in zip(sepa["values"], rows["grpo+none"]["values"], strict=True)]
    assert sepa["diff"]["values"] == diffs and sepa["diff"]["wins"] == sum(d < 0 for d in diffs)
    assert main(["compare", str(campaign), "--reach", "0.55"]) == 0
    text = capsys.readouterr().out
    assert "steps until it is ≥ 0.55, fewer winning" in text
    assert "Never reached 0.55 (counted at their planned last step, a lower bound): " in text
    assert "maxrl+sepa 1/3" in text
