"""RLOO episode advantages (rlvr/algorithm/rloo.py, docs/algorithms.md#rloo): each completion's reward minus the mean
of the other G − 1 of its group, the arithmetic by hand; the same as G/(G−1)·(r − mean), verl's form."""

import pytest
import torch

from composing import compose_config
from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.algorithm.rloo import RLOO, leave_one_out

LOSS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)


def test_rloo_subtracts_the_mean_of_the_others():
    # group 0: [1,0,0,1]: 1 − mean(0,0,1) = 1 − 1/3 = 2/3;  0 − mean(1,0,1) = −2/3
    # group 1: [1,0,0,0]: 1 − mean(0,0,0) = 1;              0 − mean(1,0,0) = −1/3
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = RLOO(LOSS).advantages(rewards)
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64)
    assert torch.allclose(adv, expected, rtol=0, atol=1e-15)


def test_rloo_is_grpo_scaled_by_g_over_g_minus_1():
    # r_i − Σ_{j≠i} r_j/(G−1) = (G·r_i − Σ_j r_j)/(G−1) = G/(G−1)·(r_i − mean): GRPO's advantage × 8/7 at G = 8
    rewards = torch.rand(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(RLOO(LOSS).advantages(rewards), GRPO(LOSS).advantages(rewards) * 8 / 7, atol=1e-14)


def test_rloo_ties_and_a_single_completion_give_zeros():
    # all equal: r − r = 0 for every completion; G = 1: no other completion to be a baseline → 0 (rlvr refuses
    # trainer.group_size=1 before a run; verl returns the raw reward there)
    assert RLOO(LOSS).advantages(torch.full((2, 4), 0.7)).abs().max() == 0
    assert leave_one_out(torch.tensor([[1.0]])).tolist() == [[0.0]]


def test_rloo_composes_from_its_option():
    cfg = compose_config(["algorithm=rloo"])
    assert cfg.algorithm._target_ == "rlvr.algorithm.rloo.RLOO" and cfg.algorithm.loss.clip_eps == pytest.approx(
        compose_config(["algorithm=grpo"]).algorithm.loss.clip_eps)
