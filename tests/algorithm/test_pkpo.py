"""PKPO episode advantages (rlvr/algorithm/pkpo.py, docs/algorithms.md#pkpo): Walder & Karkhanis's unbiased pass@k
(maxg@k) gradient with the pass@(k−1) leave-one-out baseline, s^(loo−1), by hand for small groups, at its edges
(all correct, none correct, k = 1, k = G), against the exact gradient of pass@k, and k > G refused at start."""

import itertools
import math

import pytest
import torch

from composing import FAST, compose_config
from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.pkpo import PKPO
from rlvr.algorithm.rloo import RLOO
from rlvr.errors import ConfigError
from rlvr.labels import condition_label
from rlvr.run import run

LOSS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)


def pkpo(k: int, group_size: int = 4) -> PKPO:
    return PKPO(LOSS, k=k, group_size=group_size)


def adv(k: int, row: list[float]) -> list[float]:
    """The advantages of one group's rewards."""
    rewards = torch.tensor([row], dtype=torch.float64)
    return pkpo(k, rewards.shape[1]).advantages(rewards)[0].tolist()


def test_binary_rewards_by_hand():
    # G = n = 4, [1,0,0,1]: c = 2 correct. A correct sample gets k·C(n−c, k−1)/C(n−1, k−1) (the chance that the k−1
    # others of a k-subset holding it are all wrong, times k); a wrong one gets 0 (it never raises a subset's max).
    #   k = 2: 2·C(2,1)/C(3,1) = 2·2/3 = 4/3      k = 3: 3·C(2,2)/C(3,2) = 3·1/3 = 1      k = 4: 4·C(2,3)/C(3,3) = 0
    assert adv(2, [1, 0, 0, 1]) == pytest.approx([4 / 3, 0, 0, 4 / 3], abs=1e-15)
    assert adv(3, [1, 0, 0, 1]) == pytest.approx([1, 0, 0, 1], abs=1e-15)
    assert adv(4, [1, 0, 0, 1]) == [0, 0, 0, 0]
    # [1,0,0,0]: c = 1. k = 2: 2·C(3,1)/C(3,1) = 2;  k = 4 (= G): 4·C(3,3)/C(3,3) = 4: the lone success takes it all
    assert adv(2, [1, 0, 0, 0]) == pytest.approx([2, 0, 0, 0], abs=1e-15)
    assert adv(4, [0, 0, 0, 1]) == pytest.approx([0, 0, 0, 4], abs=1e-15)


def test_continuous_rewards_by_hand():
    # maxg@k, G = 3, k = 2, r = [0.2, 0.5, 0.9]: A_i = 2 · mean over the other j of (max(r_i, r_j) − r_j)
    #   0.2: (max(.2,.5) − .5 = 0, max(.2,.9) − .9 = 0) → 0
    #   0.5: (.5 − .2 = .3, 0) → 2·0.15 = 0.3
    #   0.9: (.9 − .2 = .7, .9 − .5 = .4) → 2·0.55 = 1.1       (the order of the rewards does not matter)
    assert adv(2, [0.9, 0.2, 0.5]) == pytest.approx([1.1, 0.0, 0.3], abs=1e-15)


def test_all_correct_and_none_correct_give_zeros():
    # all correct, k ≥ 2: every k-subset already passes without sample i: C(0, k−1) = 0; none correct: no gain
    for k in (2, 3, 4):
        assert adv(k, [1, 1, 1, 1]) == adv(k, [0, 0, 0, 0]) == [0] * 4


def test_k_1_is_rloo():
    # k = 1 optimises pass@1: the leave-one-out baseline of RLOO, [1,0,0,1] → [2/3, −2/3, −2/3, 2/3]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.3, 0.1, 0.0, 0.9]], dtype=torch.float64)
    assert torch.equal(pkpo(1).advantages(rewards), RLOO(LOSS).advantages(rewards))
    assert pkpo(1).advantages(rewards)[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_expected_update_is_the_exact_gradient_of_pass_at_k(k):
    # A Bernoulli(p) "policy", n = 4 samples: E[(1/n) Σ_i A_i · d/dp log P(x_i)] over all 2^4 outcomes must equal
    # d/dp pass@k = d/dp (1 − (1 − p)^k) = k·(1 − p)^(k−1); d/dp log P(x) = 1/p for a success, −1/(1 − p) else.
    p, n = 0.3, 4
    expected_update = 0.0
    for outcome in itertools.product([0.0, 1.0], repeat=n):
        chance = math.prod(p if x else 1 - p for x in outcome)
        a = adv(k, list(outcome))
        expected_update += chance * sum(ai * (1 / p if x else -1 / (1 - p)) for ai, x in zip(a, outcome)) / n
    assert expected_update == pytest.approx(k * (1 - p) ** (k - 1), rel=1e-12)


def test_k_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"algorithm.k=5 must be <= trainer.group_size=4"):
        PKPO(LOSS, k=5, group_size=4)
    with pytest.raises(ValueError, match=r"algorithm.k=0 must be >= 1"):
        PKPO(LOSS, k=0, group_size=4)


def test_k_above_the_group_size_stops_the_run_before_the_model_loads(tmp_path):
    cfg = compose_config(FAST + ["algorithm=pkpo", "trainer.group_size=4", "algorithm.k=16", "trainer.max_steps=1"])
    with pytest.raises(ConfigError, match=r"algorithm.k=16 must be <= trainer.group_size=4"):
        run(cfg, tmp_path)


def test_pkpo_composes_with_k_and_the_group_size():
    cfg = compose_config(["algorithm=pkpo", "trainer.group_size=16", "algorithm.k=16"])
    assert cfg.algorithm._target_ == "rlvr.algorithm.pkpo.PKPO"
    assert (cfg.algorithm.k, cfg.algorithm.group_size) == (16, 16)


def test_the_label_names_k():
    # two PKPO arms that differ in k optimise different objectives: their runs must not share a label
    assert condition_label(compose_config(["condition=pkpo"])) == "pkpo+none,k=4"
    assert condition_label(compose_config(["algorithm=pkpo", "algorithm.k=2"])) == "pkpo+none,k=2"
