"""algorithm.loss.form (rlvr/algorithm/loss.py, docs/algorithms.md#loss-forms): GSPO's sequence-level ratio and
CISPO's clipped, stop-gradient importance weight, each worked by hand, values and gradients."""

import math

import pytest
import torch

from rlvr.algorithm.loss import PolicyLoss


def test_gspo_clips_one_ratio_per_sequence_the_geometric_mean_of_its_token_ratios():
    # row 0: δ = [0.1, −0.2, 0.4] on 3 tokens → mean 0.1 → s₀ = e^0.1 ≈ 1.10517; A = +1
    # row 1: δ = [0.3, 0.1] on 2 tokens (its third is padding: δ 5.0 ignored) → s₁ = e^0.2 ≈ 1.22140; A = −1
    # clip [0.8, 1.2]: row 0 ℓ = −min(s₀, s₀) = −1.10517 per token; row 1 ℓ = −min(−s₁, −1.2) = s₁ (outside: clipped)
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.1, -0.2, 0.4], [0.3, 0.1, 5.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    sampled = torch.tensor([[True, True, True], [True, True, False]])
    loss = PolicyLoss(0.2, 0.2, 0.0, form="gspo")
    tok, clipped = loss.token_losses(new, old, adv, sampled=sampled)
    s0, s1 = math.exp(0.1), math.exp(0.2)
    assert tok[0].tolist() == pytest.approx([-s0] * 3, abs=1e-6)
    assert tok[1, :2].tolist() == pytest.approx([s1] * 2, abs=1e-6)
    assert clipped.tolist() == [[False, False, False], [True, True, True]]
    # ∂(Σ row 0)/∂new_t = −3·s₀·(1/3) = −s₀ each; row 1: ∂(2·s₁)/∂new_t = s₁ on its 2 tokens, 0 on padding
    (tok * sampled).sum().backward()
    assert torch.allclose(new.grad, torch.tensor([[-s0] * 3, [s1, s1, 0.0]]), atol=1e-6)


def test_cispo_weighs_log_pi_by_the_capped_ratio_without_its_gradient():
    # r = [0.5, 2.0, 7.0], A = [1, −1, 1], log π = [−1, −2, −0.5], cispo_max = 5: w = min(r, 5) = [0.5, 2, 5]
    # ℓ = −w·A·log π = [0.5, −4.0, 2.5]; ∂ℓ/∂log π = −w·A = [−0.5, 2.0, −5.0] (w is a constant); clipped: r > 5
    new = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = new.detach() - torch.log(torch.tensor([[0.5, 2.0, 7.0]]))
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    tok, clipped = PolicyLoss(0.0, 0.0, 0.0, form="cispo", cispo_max=5.0).token_losses(new, old, adv)
    assert torch.allclose(tok, torch.tensor([[0.5, -4.0, 2.5]]), atol=1e-6)
    assert clipped.tolist() == [[False, False, True]]
    tok.sum().backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.5, 2.0, -5.0]]), atol=1e-6)


def test_on_policy_every_form_has_reinforces_gradient():
    # r = 1: ppo's −r·A, gspo's −s·A and cispo's −sg(1)·A·log π all have gradient −A per token
    new = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    adv = torch.tensor([[0.7, 0.7, 0.7]])
    for form in ("ppo", "gspo", "cispo"):
        if new.grad is not None:
            new.grad = None
        clip = 0.0 if form == "cispo" else 0.2
        tok, _ = PolicyLoss(clip, clip, 0.0, form=form).token_losses(new, new.detach(), adv,
                                                                      sampled=torch.ones(1, 3, dtype=torch.bool))
        tok.sum().backward()
        assert torch.allclose(new.grad, torch.full((1, 3), -0.7), atol=1e-6), form


@pytest.mark.parametrize(("settings", "message"), [
    ({"form": "sapo"}, "algorithm.loss.form='sapo' must be one of ppo, gspo, cispo"),
    ({"form": "gspo", "mode": "kl_cov"}, "algorithm.loss.mode=kl_cov selects tokens by a per-token covariance"),
    ({"form": "cispo", "clip_eps": 0.2}, "algorithm.loss.form=cispo caps its weight at algorithm.loss.cispo_max"),
    ({"form": "cispo", "cispo_max": 0.0}, "algorithm.loss.cispo_max=0.0 must be > 0"),
])
def test_forms_refuse_what_does_not_apply_naming_the_keys(settings, message):
    knobs = {"clip_eps": 0.0, "clip_eps_high": 0.0, "adv_clip_max": 0.0, **settings}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PolicyLoss(**knobs)
