"""Sampled evaluation's numbers (rlvr/rollout/sampled_eval.py): the unbiased pass@k estimator of Chen et al. 2021
against hand-computed values and against enumerating every subset, avg@k, maj@k and its tie rule."""

import itertools
import math

import pytest

from composing import compose_config
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.rollout.sampled_eval import majority_correct, majority_metric, pass_at_k, pass_sizes, sampled_metrics
from rlvr.telemetry import eval_line


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 2, 0.7),            # 1 − C(3,2)/C(5,2) = 1 − 3/10
    (5, 2, 1, 0.4),            # 1 − C(3,1)/C(5,1) = 1 − 3/5 = c/n
    (5, 2, 3, 0.9),            # 1 − C(3,3)/C(5,3) = 1 − 1/10
    (5, 2, 4, 1.0),            # n − c = 3 < 4: every 4-subset holds a correct one
    (4, 1, 2, 0.5),            # 1 − C(3,2)/C(4,2) = 1 − 3/6
    (10, 3, 5, 1 - 21 / 252),  # 1 − C(7,5)/C(10,5) = 1 − 21/252 ≈ 0.9167
    (4, 0, 4, 0.0),            # nothing correct: C(4,4)/C(4,4) = 1
    (4, 4, 1, 1.0),            # all correct
])
def test_pass_at_k_equals_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_fraction_of_k_subsets_holding_a_correct_sample():
    """Brute force: every k-subset of n samples (c correct), counted; for n up to 8 every (c, k)."""
    for n in range(1, 9):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)


def test_pass_at_k_stays_exact_where_the_binomials_are_huge():
    # n = 200, c = 1, k = 100: 1 − C(199,100)/C(200,100) = 1 − (200 − 100)/200 = 0.5
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5, abs=1e-12)
    # n = 1000, c = 10, k = 50: against exact integers
    exact = 1 - math.comb(990, 50) / math.comb(1000, 50)
    assert pass_at_k(1000, 10, 50) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_pass_sizes_are_the_powers_of_two_below_k_and_k():
    assert pass_sizes(2) == [1, 2]
    assert pass_sizes(4) == [1, 2, 4]
    assert pass_sizes(6) == [1, 2, 4, 6]
    assert pass_sizes(16) == [1, 2, 4, 8, 16]


def test_sampled_metrics_average_each_examples_estimate():
    # example 0: rewards 1, 0, 0, 1 → c = 2 of 4; example 1: 0.75 counts (> 0.5), 0.5 does not → c = 1 of 4
    rows = [[1.0, 0.0, 0.0, 1.0], [0.75, 0.5, 0.0, 0.0]]
    m = sampled_metrics(rows)
    assert m["eval/avg@4"] == pytest.approx((2 + 1) / 8)
    # pass@1 = c/n averaged: (2/4 + 1/4) / 2 = 0.375 = avg@4
    assert m["eval/pass@1"] == pytest.approx(0.375)
    # pass@2: (1 − C(2,2)/C(4,2)) = 1 − 1/6 and (1 − C(3,2)/C(4,2)) = 1 − 3/6 → (5/6 + 1/2) / 2 = 2/3
    assert m["eval/pass@2"] == pytest.approx(2 / 3)
    # pass@4: both examples have a correct sample → 1
    assert m["eval/pass@4"] == 1.0
    assert list(m) == ["eval/avg@4", "eval/pass@1", "eval/pass@2", "eval/pass@4"]


def test_majority_vote_ties_go_to_the_answer_seen_first():
    # "3" and "4" both twice: "3" came first (sample 0), it is correct
    assert majority_correct(["3", "4", "4", "3"], [True, False, False, True]) is True
    # the same tie, "4" first: wrong
    assert majority_correct(["4", "3", "3", "4"], [False, True, True, False]) is False
    # a strict majority wins wherever it starts
    assert majority_correct(["4", "3", "3", "3"], [False, True, True, True]) is True
    # no answer does not vote; the one answer given wins
    assert majority_correct([None, None, "5"], [False, False, True]) is True
    # no answer at all: wrong
    assert majority_correct([None, None], [False, False]) is False


def test_majority_metric_reads_each_examples_rows():
    # example 0: "7" ×2 (wrong) beats "8" ×1 (right) → wrong; example 1: "1" ×2 right → right; maj@3 = 1/2
    answers = ["7", "8", "7", "1", None, "1"]
    rewards = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert majority_metric(answers, rewards, 3) == {"eval/maj@3": 0.5}


def test_the_console_line_shows_the_sampled_numbers_and_keeps_the_greedy_one():
    greedy = {"step": 25, "eval/accuracy": 0.612, "eval/mean_reward": 0.612, "eval/examples": 1000,
              "eval_time_s": 2.1}
    assert eval_line(greedy) == "eval after step 25: accuracy 0.612 | mean reward 0.612 | 1000 prompts in 2.1s"
    sampled = {**greedy, "eval/avg@4": 0.612, "eval/pass@1": 0.612, "eval/pass@2": 0.75, "eval/pass@4": 0.81,
               "eval/maj@4": 0.7, "eval_time_s": 7.9}
    assert eval_line(sampled) == ("eval after step 25: avg@4 0.612 | pass@4 0.810 | maj@4 0.700 | mean reward 0.612 | "
                                  "1000 prompts × 4 samples in 7.9s")


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.eval_samples=-1"], "trainer.eval_samples=-1 must be an integer >= 0"),
    (["trainer.eval_samples=4", "trainer.eval_temperature=0"],
     "trainer.eval_temperature=0 must be > 0 with trainer.eval_samples=4"),
    (["trainer.final_eval_samples=-2"], "trainer.final_eval_samples=-2 must be an integer >= 0"),
    (["trainer.final_eval_samples=256", "trainer.eval_temperature=0"],
     "trainer.eval_temperature=0 must be > 0 with trainer.final_eval_samples=256"),
    (["trainer.eval_rows=0"], "trainer.eval_rows=0 must be an integer >= 1"),
])
def test_bad_sampled_evaluation_settings_are_config_errors_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check(compose_config(overrides))


def test_greedy_settings_pass_whatever_the_temperature():
    check(compose_config(["trainer.eval_temperature=0"]))  # unused when greedy
    check(compose_config(["trainer.eval_samples=1", "trainer.eval_temperature=0"]))
