import math

import pytest
import torch

from rlvr.algorithm.loss import PolicyLoss


def test_on_policy_loss_is_minus_advantage():
    # new == old → r = 1 → ℓ = −A
    loss = PolicyLoss(0.0, 0.0, 0.0)
    lp = torch.tensor([-0.5, -1.0])
    tok, clipped = loss.token_losses(lp, lp, torch.tensor([2.0, -1.0]))
    assert torch.equal(tok, torch.tensor([-2.0, 1.0])) and not clipped.any()


def test_importance_ratio_scales_the_advantage():
    # δ = log 1.5 → r = 1.5 → ℓ = −1.5·A = −3.0 for A = 2
    tok, _ = PolicyLoss(0.0, 0.0, 0.0).token_losses(
        torch.tensor([math.log(1.5)]), torch.tensor([0.0]), torch.tensor([2.0])
    )
    assert tok.item() == pytest.approx(-3.0)


def test_ppo_clip():
    # ε = 0.2: r = 1.5, A = +1 → min(1.5, 1.2) = 1.2 → ℓ = −1.2 (clipped)
    #          r = 1.5, A = −1 → min(−1.5, −1.2) = −1.5 → ℓ = +1.5 (the pessimistic branch is unclipped)
    #          r = 0.5, A = +1 → min(0.5, 0.8) = 0.5 → ℓ = −0.5
    new = torch.log(torch.tensor([1.5, 1.5, 0.5]))
    tok, clipped = PolicyLoss(0.2, 0.0, 0.0).token_losses(new, torch.zeros(3), torch.tensor([1.0, -1.0, 1.0]))
    assert torch.allclose(tok, torch.tensor([-1.2, 1.5, -0.5]))
    assert clipped.tolist() == [True, True, True]  # every ratio lies outside [0.8, 1.2]


def test_clip_higher():
    # ε_low 0.2, ε_high 0.28: r = 1.25, A = 1 → within [0.8, 1.28] → ℓ = −1.25, not clipped
    tok, clipped = PolicyLoss(0.2, 0.28, 0.0).token_losses(
        torch.log(torch.tensor([1.25])), torch.zeros(1), torch.ones(1)
    )
    assert tok.item() == pytest.approx(-1.25) and not clipped.any()


def test_advantage_cap():
    # cap 2: [0, 3, -5, 1] → [0, 2, -2, 1]; capped 2 of 3 non-zero; magnitude mean(|3|, |-5|) = 4
    out, metrics = PolicyLoss(0.0, 0.0, 2.0).cap(torch.tensor([0.0, 3.0, -5.0, 1.0]))
    assert out.tolist() == [0.0, 2.0, -2.0, 1.0]
    assert metrics == {"adv_cap_fraction": pytest.approx(2 / 3), "adv_cap_magnitude": 4.0}


def test_cap_off_is_identity():
    adv = torch.tensor([10.0])
    out, metrics = PolicyLoss(0.0, 0.0, 0.0).cap(adv)
    assert out is adv and metrics == {}


@pytest.mark.parametrize("kwargs", [dict(clip_eps=-0.1), dict(clip_eps_high=0.2), dict(adv_clip_max=-1.0)])
def test_bad_knobs_fail_naming_the_key(kwargs):
    args = dict(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0) | kwargs
    with pytest.raises(ValueError, match="algorithm.loss"):
        PolicyLoss(**args)
