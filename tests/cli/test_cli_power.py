"""Power of a seed-paired comparison (rlvr/cli/power.py): the noncentral-t power, the smallest difference n seeds
detect at 95% confidence and 80% power, the seeds a named difference needs; the lines `rlvr compare` and
`rlvr plan --pilot` print. Reference values from scipy 1.17.1 (not a dependency of rlvr):
scipy.stats.nct.sf(c, df, λ) + nct.cdf(−c, df, λ) with c = scipy.stats.t.ppf(0.975, df), solved with brentq."""

import json

import pytest

from rlvr.cli.main import main
from rlvr.cli.power import mde, power, power_line, power_of, seeds_needed
from tests.cli.conftest import make_run
from tests.cli.test_compare_sampled_eval import sampled_campaign


def test_power_matches_scipys_noncentral_t():
    for lam, df, expected in ((1.0, 1, 0.072989), (3.0, 2, 0.387400), (2.5, 4, 0.477261), (5.0, 4, 0.954837),
                              (2.0, 9, 0.431326), (3.0, 29, 0.826231)):
        assert abs(power(lam, df) - expected) < 3e-5, (lam, df)
    # no difference: the test's size, 5% (to the precision of the t(0.975) table)
    for df in (1, 2, 4, 9, 99, 10_000):
        assert abs(power(0.0, df) - 0.05) < 5e-6, df


def test_minimum_detectable_difference_matches_scipy_and_the_normal_limit():
    # scipy: the Δ/σ with power 0.8 at n = 2, 3, 5, 10, 30 seed pairs
    for n, expected in ((2, 11.549888), (3, 3.264044), (5, 1.681997), (10, 0.996001), (30, 0.529236)):
        assert abs(mde(n, 1.0) - expected) < 1e-4 * expected, n
    assert abs(mde(5, 0.05) - 0.05 * mde(5, 1.0)) < 1e-12  # linear in the sd
    # hand arithmetic: as n grows, σ known: MDE·√n/σ → z(0.975) + z(0.8) = 1.959964 + 0.841621 = 2.801585
    assert abs(mde(10_000, 1.0) * 100 - 2.801585) < 1e-3
    # the textbook approximation (t(0.975, 4) + t(0.8, 4))/√5 = (2.7764 + 0.9410)/√5 = 1.66247 is 1% low at n = 5
    assert 1.66247 < mde(5, 1.0) < 1.66247 * 1.02


def test_seeds_needed_match_scipy():
    # the smallest n ≥ 2 whose power at d reaches 0.8, σ known (scipy, counting n up one by one)
    for d, sd, n in ((0.05, 0.05, 10), (0.05, 0.08, 23), (0.02, 0.05, 52), (0.1, 0.03, 3), (0.001, 0.05, 19625)):
        assert seeds_needed(d, sd) == n, (d, sd)
        assert mde(n, sd) <= d < mde(n - 1, sd) or n == 2
    assert seeds_needed(1.0, 0.01) == 2  # a difference far beyond the noise still needs 2 seeds for an sd


def test_power_says_what_is_missing_instead_of_a_number():
    assert power_line(power_of([0.1], 0.05)) == "power: unknown (1 paired seed; their sd needs at least 2)"
    assert power_line(power_of([0.1, 0.1, 0.1], None)) == (
        "power: unknown (the 3 paired differences are all equal (sd 0): no spread to size a test by)")
    assert power_line(power_of([0.1, 0.2], None, seeds=1)) == (
        "power: unknown (1 seed; a paired t-test needs at least 2)")


def test_compare_prints_a_power_line_per_pair(campaign, capsys):
    assert main(["compare", str(campaign), "--detect", "0.05"]) == 0
    out = capsys.readouterr().out
    # maxrl+sepa − grpo+none: differences 0.15, 0.10, 0.20, sd 0.05, n 3 → MDE 3.264044·0.05 = 0.1632;
    # 0.05 = 1 sd needs 10 seeds (scipy, above)
    assert ("maxrl+sepa − grpo+none:  power: with 3 seeds this grid detects |Δ| ≥ 0.163 (95% confidence, 80% power); "
            "0.05 needs 10 seeds; sd of the paired differences 0.0500, taken as known") in out
    # gtpo+hicra − grpo+none: differences −0.2, −0.3, sd 0.0707, n 2 → 11.549888·0.070711 = 0.8167
    assert "gtpo+hicra − grpo+none:  power: with 2 seeds this grid detects |Δ| ≥ 0.817" in out
    assert main(["compare", str(campaign), "--json"]) == 0
    rows = {r["condition"]: r for r in json.loads(capsys.readouterr().out)["conditions"]}
    power_est = rows["maxrl+sepa"]["diff"]["power"]
    assert power_est["n"] == 3 and abs(power_est["sd"] - 0.05) < 1e-12 and power_est["seeds_needed"] is None
    assert abs(power_est["mde"] - 3.264044 * 0.05) < 1e-5


def test_compare_without_metric_reports_pass_at_1_and_pass_at_k_where_logged(tmp_path, capsys):
    root = sampled_campaign(tmp_path / "camp")
    assert main(["compare", str(root), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["metric"] for r in results] == ["eval/pass@1", "eval/pass@4"]
    # pass@4 differences 0.20, 0.05, 0.25: sd 0.104083, MDE 3.264044·0.104083 = 0.339732
    assert abs(results[1]["conditions"][1]["diff"]["power"]["mde"] - 3.264044 * 0.104083) < 1e-4
    assert main(["compare", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count("Paired t-test power") == 2 and "eval/pass@4 (final value per run)" in out


def test_compare_power_with_one_shared_seed_says_so(tmp_path, capsys):
    for algorithm, seeds in (("grpo", (0, 1)), ("maxrl", (0,))):
        for seed in seeds:
            make_run(tmp_path / algorithm / f"seed={seed}", seed=seed, algorithm=algorithm, transform="none",
                     condition_choice=None, steps_done=2, evals={2: 0.3 + 0.1 * seed})
    assert main(["compare", str(tmp_path), "--detect", "0.05"]) == 0
    assert "maxrl+none − grpo+none:  power: unknown (1 paired seed; their sd needs at least 2)" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("command", ["compare", "plan"])
def test_detect_must_be_a_positive_difference(campaign, capsys, command):
    args = ["compare", str(campaign)] if command == "compare" else ["plan", "campaign=smoke", "--pilot", str(campaign)]
    assert main([*args, "--detect", "-0.05"]) == 2
    assert "--detect must be a difference > 0, got -0.05" in capsys.readouterr().err


def test_plan_sizes_the_campaign_from_a_pilot(campaign, capsys):
    # the campaign launches 5 seeds; the pilot's maxrl+sepa − grpo+none differences have sd 0.05
    five_seeds = "hydra.sweeper.params.seed='0,1,2,3,4'"
    assert main(["plan", "campaign=smoke", five_seeds, "--pilot", str(campaign), "--detect", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "2 conditions × 5 seeds" in out
    assert f"power from the pilot {campaign} (eval/accuracy, final values, paired by seed):" in out
    # MDE at 5 seeds: 1.681997 (scipy, above)·0.05 = 0.0841; 0.05 = 1 sd needs 10 seeds
    assert ("maxrl+sepa − grpo+none: power: with 5 seeds this grid detects |Δ| ≥ 0.0841 (95% confidence, "
            "80% power); 0.05 needs 10 seeds") in out
