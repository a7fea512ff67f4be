"""algorithm=discover_entropic (rlvr/algorithm/discover_entropic.py, spec §2.6): Boltzmann weights over a group's
rewards, β fixed or solved for a target KL, the metrics through rlvr.credit.assign_credit, type errors naming the
key, and a 4-step run on the tiny model that resumes from its checkpoint."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from composing import FAST, MIXED, compose_config
from rlvr.algorithm.discover_entropic import DiscoverEntropic, boltzmann, kl_to_uniform
from rlvr.algorithm.loss import PolicyLoss
from rlvr.config_check import check
from rlvr.credit import assign_credit
from rlvr.errors import ConfigError
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run
from rlvr.transform.none import NoTransform
from rlvr.types import TokenSignals

LOSS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)
LOG2, LOG3 = math.log(2.0), math.log(3.0)
WIDTH = 50.0 / 2**24  # the bisection's final bracket: beta_max / 2^beta_search_steps ≈ 2.98e-6


def algo(beta: float | None = None, **knobs) -> DiscoverEntropic:
    return DiscoverEntropic(LOSS, beta=beta, **knobs)


def r64(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def kl_at(rewards: list[float], beta: float) -> float:
    return float(kl_to_uniform(boltzmann(r64([rewards]), torch.tensor([beta], dtype=torch.float64)))[0])


# ---- fixed β: arithmetic by hand ----

def test_two_rewards_fixed_beta():
    # r = [1, 0], β = ln 3: β·(r − max r) = [0, −ln 3] → exp = [1, 1/3], Σ = 4/3 → p = [3/4, 1/4]
    # A = 2·p − 1 = [0.5, −0.5]
    # KL = 0.75·ln(0.75·2) + 0.25·ln(0.25·2) = 0.75·ln 1.5 − 0.25·ln 2 ≈ 0.304099 − 0.173287 = 0.130812
    a = algo(LOG3)
    assert a.advantages(r64([[1.0, 0.0]])).tolist()[0] == pytest.approx([0.5, -0.5], abs=1e-15)
    metrics = a.advantage_metrics(r64([[1.0, 0.0]]))
    assert metrics == pytest.approx({"discover_beta": LOG3, "discover_kl": 0.75 * math.log(1.5) - 0.25 * LOG2,
                                     "discover_reward_max": 1.0, "discover_reward_mean": 0.5}, abs=1e-15)
    assert metrics["discover_kl"] == pytest.approx(0.130812, abs=1e-6)


def test_three_rewards_fixed_beta():
    # r = [2, 1, 0], β = ln 2: β·(r − 2) = [0, −ln 2, −2 ln 2] → exp = [1, 1/2, 1/4], Σ = 7/4 → p = [4/7, 2/7, 1/7]
    # A = 3·p − 1 = [12/7 − 1, 6/7 − 1, 3/7 − 1] = [5/7, −1/7, −4/7]   (sum 0)
    adv = algo(LOG2).advantages(r64([[2.0, 1.0, 0.0]]))
    assert adv.tolist()[0] == pytest.approx([5 / 7, -1 / 7, -4 / 7], abs=1e-15)


def test_a_negative_beta_is_clamped_to_zero():
    # β = max(0, −3) = 0 → p uniform → A = 0; discover_beta reports the β used, 0
    a = algo(-3.0)
    assert a.advantages(r64([[2.0, 1.0, 0.0]])).abs().max() == 0
    assert a.advantage_metrics(r64([[2.0, 1.0, 0.0]]))["discover_beta"] == 0.0


def test_the_exponent_floor_keeps_far_rewards_above_zero():
    # r = [1000, 0], β = 1: β·(r − max) = [0, −1000] → floored to −700 → p₁ = e^−700/(1 + e^−700) ≈ 9.86e−305,
    # not 0 (exp(−1000) underflows to 0); A = 2·p − 1 rounds to [1, −1]
    p = boltzmann(r64([[1000.0, 0.0]]), torch.tensor([1.0], dtype=torch.float64))
    assert p[0, 1].item() == math.exp(-700.0) / (1.0 + math.exp(-700.0)) > 0.0
    assert algo(1.0).advantages(r64([[1000.0, 0.0]])).tolist() == [[1.0, -1.0]]


def test_float32_rewards_give_float32_advantages():
    adv = algo(LOG3).advantages(torch.tensor([[1.0, 0.0]]))
    assert adv.dtype == torch.float32 and adv.tolist() == [[0.5, -0.5]]


# ---- β solved for target_kl ----

def test_bisection_finds_the_beta_of_a_known_kl():
    # r = [1, 0]: KL(ln 3) = 0.75·ln 1.5 − 0.25·ln 2 (above). With that as the target, KL grows with β, so the
    # largest β within it is ln 3 ≈ 1.098612; 24 halvings of [0, 50] keep the lower end, within 50/2^24 below it
    target = 0.75 * math.log(1.5) - 0.25 * LOG2
    metrics = algo(None, target_kl=target).advantage_metrics(r64([[1.0, 0.0]]))
    assert LOG3 - WIDTH <= metrics["discover_beta"] <= LOG3 + 1e-12
    assert metrics["discover_kl"] <= target and metrics["discover_kl"] == pytest.approx(target, abs=1e-6)


def test_bisection_meets_the_default_target_from_below():
    # r = [1, 0, 0, 0], target 0.2: the β found has KL ≤ 0.2 and one bracket width more exceeds it
    # (p = [e^β, 1, 1, 1]/(e^β + 3); β ≈ 1.2875 gives p₀ ≈ 0.52)
    rewards = [1.0, 0.0, 0.0, 0.0]
    metrics = algo(None).advantage_metrics(r64([rewards]))
    beta = metrics["discover_beta"]
    assert beta == pytest.approx(1.2875, abs=1e-3)
    assert metrics["discover_kl"] == kl_at(rewards, beta) <= 0.2 < kl_at(rewards, beta + WIDTH)
    assert metrics["discover_kl"] == pytest.approx(0.2, abs=1e-5)


def test_beta_max_is_used_when_its_kl_is_within_the_target():
    # r = [1, 0], beta_max = 1: p = [σ(1), 1 − σ(1)] = [0.731059, 0.268941]
    # KL = ln 2 − H(p) = 0.693147 − (0.731059·0.313262 + 0.268941·1.313262) = 0.693147 − (0.229013 + 0.353190)
    #    = 0.693147 − 0.582203 ≈ 0.110944 ≤ 0.2  → β = beta_max = 1 exactly (no bisection)
    metrics = algo(None, beta_max=1.0).advantage_metrics(r64([[1.0, 0.0]]))
    assert metrics["discover_beta"] == 1.0 and metrics["discover_kl"] == pytest.approx(0.110944, abs=1e-6)
    s = 1 / (1 + math.exp(-1.0))
    adv = algo(None, beta_max=1.0).advantages(r64([[1.0, 0.0]]))
    assert adv.tolist()[0] == pytest.approx([2 * s - 1, 1 - 2 * s], abs=1e-15)  # A = 2p − 1 = ±0.462117


def test_each_group_solves_its_own_beta():
    # same KL target, a reward gap 10× wider → a β 10× smaller (p depends on β·(r − max r) only); both groups go
    # through one call, each within one bracket width of its own solution
    a = algo(None)
    one = a.advantage_metrics(r64([[1.0, 0.0]]))["discover_beta"]
    ten = a.advantage_metrics(r64([[10.0, 0.0]]))["discover_beta"]
    both = a.advantage_metrics(r64([[1.0, 0.0], [10.0, 0.0]]))["discover_beta"]
    assert ten == pytest.approx(one / 10, abs=2 * WIDTH) and both == pytest.approx((one + ten) / 2, abs=1e-15)


# ---- degenerate groups ----

@pytest.mark.parametrize("beta", [None, 2.0])
def test_a_group_of_one_gives_zeros(beta):
    # n = 1: β = 0, p = [1], A = 1·1 − 1 = 0; KL to the uniform over one element is 0
    a = algo(beta)
    assert a.advantages(r64([[0.7], [0.2]])).tolist() == [[0.0], [0.0]]
    assert a.advantage_metrics(r64([[0.7]])) == {"discover_beta": 0.0, "discover_kl": 0.0,
                                                  "discover_reward_max": 0.7, "discover_reward_mean": 0.7}


@pytest.mark.parametrize("beta", [None, 2.0])
@pytest.mark.parametrize("rewards", [[0.3, 0.3, 0.3], [1.0] * 49, [0.5, 0.5 + 1e-13, 0.5]])
def test_flat_groups_give_exact_zeros(beta, rewards):
    # range ≤ 1e-12 → β = 0 → A = 0 exactly (49·(1/49) − 1 would round to −1.1e−16 without the explicit zero)
    a = algo(beta)
    assert a.advantages(r64([rewards])).abs().max() == 0
    assert a.advantage_metrics(r64([rewards]))["discover_beta"] == 0.0


def test_no_rows_report_nothing():
    assert algo(None).advantage_metrics(torch.zeros(0, 4)) == {}


# ---- through the public credit function ----

def signals(rows: int, tokens: int, group_size: int = 2) -> TokenSignals:
    return TokenSignals(logprobs_PG_T=torch.full((rows, tokens), -0.5), mask_PG_T=torch.ones(rows, tokens, dtype=bool),
                        group_size=group_size, step=0, correct_rate=0.5)


def test_assign_credit_broadcasts_and_averages_metrics_over_untied_groups():
    # β = ln 3 for every group:
    #   [1, 0] → p = [3/4, 1/4] → A = [0.5, −0.5];  KL = 0.75·ln 1.5 − 0.25·ln 2 ≈ 0.130812
    #   [2, 0] → exp = [1, 1/9] → p = [0.9, 0.1] → A = [0.8, −0.8];  KL = 0.9·ln 1.8 + 0.1·ln 0.2 ≈ 0.368064
    #   [5, 5] ties → zeroed by assign_credit, and left out of the metrics (the predecessor skips such a group)
    # metrics: β = ln 3; KL = (0.130812 + 0.368064)/2; max = (1 + 2)/2 = 1.5; mean = (0.5 + 1)/2 = 0.75
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [5.0, 5.0]])
    credit = assign_credit(rewards, signals(6, 3), algo(LOG3), NoTransform())
    assert credit.adv_P_G.flatten().tolist() == pytest.approx([0.5, -0.5, 0.8, -0.8, 0.0, 0.0], abs=1e-6)
    assert credit.adv_PG_T[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.8, -0.8, 0.0, 0.0], abs=1e-6)
    assert torch.equal(credit.adv_PG_T, credit.adv_PG_T[:, :1].expand(6, 3))  # one advantage per completion token
    kl = ((0.75 * math.log(1.5) - 0.25 * LOG2) + (0.9 * math.log(1.8) + 0.1 * math.log(0.2))) / 2
    assert credit.metrics == pytest.approx({"discover_beta": LOG3, "discover_kl": kl, "discover_reward_max": 1.5,
                                            "discover_reward_mean": 0.75}, abs=1e-6)


def test_a_group_tied_within_the_tie_tolerance_is_zeroed_though_its_range_exceeds_1e_12():
    # [0, 1e−7]: range 1e−7 > 1e−12, so the algorithm alone weights it (β = 50: p ≈ [0.5 − 1.25e−6, 0.5 + 1.25e−6]);
    # but it ties within 1e−6 (rlvr/algorithm/ties.py): assign_credit zeroes it and the step trains nothing
    rewards = torch.tensor([[0.0, 1e-7]], dtype=torch.float64)
    assert algo(None).advantages(rewards).abs().max() > 0
    credit = assign_credit(rewards, signals(2, 2), algo(None), NoTransform())
    assert credit.adv_PG_T.abs().max() == 0 and credit.skipped
    assert not any(k.startswith("discover_") for k in credit.metrics)  # no group reports: no keys


# ---- properties ----

REWARDS = st.lists(st.integers(-20, 20).map(lambda k: k / 4), min_size=2, max_size=16)
BETAS = st.one_of(st.none(), st.floats(0.01, 20.0))


@settings(max_examples=200, deadline=None)
@given(rewards=REWARDS, beta=BETAS)
def test_advantages_sum_to_zero_and_follow_the_rewards(rewards, beta):
    # Σ A = n·Σ p − n = 0 (Σ p = 1 up to rounding); p is increasing in r for β > 0, so A is too
    adv = algo(beta).advantages(r64([rewards]))[0]
    assert abs(float(adv.sum())) <= 1e-12 * len(rewards)
    order = sorted(range(len(rewards)), key=lambda i: rewards[i])
    assert all(adv[i] <= adv[j] for i, j in zip(order, order[1:]))
    if max(rewards) > min(rewards):
        assert adv[order[-1]] > 0 > adv[order[0]]  # the best sample gains, the worst loses
        tied_with_best = [i for i in range(len(rewards)) if rewards[i] == max(rewards)]
        assert all(adv[i] == adv[order[-1]] for i in tied_with_best)


@settings(max_examples=100, deadline=None)
@given(rewards=REWARDS, target=st.floats(0.01, 1.0))
def test_the_solved_beta_is_the_largest_within_the_target(rewards, target):
    metrics = algo(None, target_kl=target).advantage_metrics(r64([rewards]))
    beta, kl = metrics["discover_beta"], metrics["discover_kl"]
    assert 0.0 <= beta <= 50.0 and kl <= target
    if max(rewards) > min(rewards) and beta < 50.0:
        assert kl_at(rewards, beta + WIDTH) > target  # one bracket width more would leave the target


# ---- knobs: types and ranges fail naming the key ----

@pytest.mark.parametrize(("knobs", "error", "message"), [
    ({"beta": "0.5"}, TypeError, "algorithm.beta='0.5' must be a number or null"),
    ({"beta": True}, TypeError, "algorithm.beta=True"),
    ({"target_kl": "0.2"}, TypeError, "algorithm.target_kl='0.2' must be a number"),
    ({"target_kl": 0.0}, ValueError, "algorithm.target_kl=0.0 must be > 0"),
    ({"beta_max": -1.0}, ValueError, "algorithm.beta_max=-1.0 must be > 0"),
    ({"beta_search_steps": 2.5}, TypeError, "algorithm.beta_search_steps=2.5 must be an integer"),
    ({"beta_search_steps": 0}, ValueError, "algorithm.beta_search_steps=0 must be >= 1"),
])
def test_wrong_knobs_fail_at_construction(knobs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(".", r"\.")):
        DiscoverEntropic(LOSS, **({"beta": None} | knobs))


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.beta=hot", "algorithm.beta='hot' must be float or null"),
    ("algorithm.beta_search_steps=2.5", "algorithm.beta_search_steps=2.5 must be int"),
    ("algorithm.target_kl=[0.2]", "algorithm.target_kl=[0.2] must be float"),
])
def test_wrong_knob_types_fail_at_composition(override, message):
    with pytest.raises(ConfigError, match="invalid config") as err:
        check(compose_config(["algorithm=discover_entropic", override]))
    assert message in str(err.value)


def test_the_yaml_builds_with_beta_solved():
    from hydra.utils import instantiate

    built = instantiate(compose_config(["algorithm=discover_entropic"]).algorithm, _convert_="all")
    assert isinstance(built, DiscoverEntropic)
    assert (built.beta, built.target_kl, built.beta_max, built.beta_search_steps) == (None, 0.2, 50.0, 24)
    assert isinstance(built.loss, PolicyLoss)


# ---- 4 steps on the tiny model ----

def training_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows if "loss" in r]


def test_four_steps_train_and_resume_exactly(tmp_path):
    """4 uninterrupted steps; 2 steps then 2 more resumed from the step-2 checkpoint: the same training rows."""
    overrides = FAST + MIXED + ["algorithm=discover_entropic"]
    run(compose_config(overrides + ["trainer.max_steps=4"]), tmp_path / "whole")
    steps = training_rows(tmp_path / "whole")
    trained = [r for r in steps if not r["skipped"]]
    assert [r["step"] for r in steps] == [0, 1, 2, 3] and trained
    assert all(r["condition"] == "discover_entropic+none" for r in steps)
    for r in trained:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
        assert 0.0 < r["discover_beta"] <= 50.0 and 0.0 < r["discover_kl"] <= 0.2
        assert 0.0 <= r["discover_reward_mean"] <= r["discover_reward_max"] <= 1.0
    adapter = load_file(tmp_path / "whole" / "checkpoints" / "step_4" / "adapter_model.safetensors")
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # LoRA B starts at 0: it moved
    run(compose_config(overrides + ["trainer.max_steps=2"]), tmp_path / "resumed")
    run(compose_config(overrides + ["trainer.max_steps=4"]), tmp_path / "resumed")
    assert training_rows(tmp_path / "resumed") == steps
