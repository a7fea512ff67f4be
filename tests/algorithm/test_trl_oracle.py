"""An outside oracle for the loss (issue 25 req. 8): TRL's GRPOTrainer._compute_loss, run on given log-probabilities,
advantages and masks, against rlvr's PolicyLoss as the backends apply it (rlvr/backend/local.py: Σ ℓ / n under
token_mean, Σ w·ℓ otherwise). TRL's method is called on a stand-in trainer that hands it the log-probabilities (its
model forward is the only part replaced); everything it computes is TRL's own code. Values and gradients agree to
1e-6 for every loss both have; where the definitions differ on purpose (a completion whose advantage is 0), the last
test shows the difference (docs/algorithms.md#loss-aggregation says why)."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rlvr.algorithm.loss import PolicyLoss

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")  # the dev extra installs TRL

B, T, MAX_LEN = 4, 5, 6
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
ADV = torch.tensor([0.8, -0.4, 1.1, -0.9])


def logprobs(seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    new = (old + torch.randn(B, T, generator=g) * 0.3).requires_grad_(True)  # ratios around 1, some clipped
    return new, old


def trl(loss_type: str, level: str, new, old, adv, eps_low: float, eps_high: float):
    """TRL's loss and its gradient with respect to the new log-probabilities."""
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=0.0, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        use_vllm=False, vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=MAX_LEN, _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                    reduce=lambda x, reduction="sum": x),
    )
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": MASK.long(),
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": MASK.sum().float()}
    new.grad = None
    loss = grpo_trainer.GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return float(loss.detach()), new.grad.clone()


def rlvr(loss: PolicyLoss, new, old, adv):
    """rlvr's loss as the backend sums it (one micro-batch: the whole step), and its gradient."""
    adv_N_T = adv[:, None] * MASK
    signal = (adv_N_T != 0) & MASK
    tok, _ = loss.token_losses(new, old, adv_N_T, sampled=MASK)
    weight = loss.token_weights(signal, torch.arange(B) // 2)
    value = (tok * signal).sum() / signal.sum() if weight is None else (tok * signal * weight).sum()
    new.grad = None
    value.backward()
    return float(value.detach()), new.grad.clone()


@pytest.mark.parametrize(("trl_type", "level", "settings"), [
    ("bnpo", "token", {"aggregation": "token_mean"}),
    ("dapo", "token", {"aggregation": "token_mean"}),
    ("grpo", "token", {"aggregation": "seq_mean_token_mean"}),
    ("dr_grpo", "token", {"aggregation": "seq_mean_token_sum_norm", "aggregation_norm": MAX_LEN}),
    ("grpo", "sequence", {"aggregation": "seq_mean_token_mean", "form": "gspo"}),  # GSPO as TRL runs it
])
@pytest.mark.parametrize("clip", [(0.2, 0.28), (0.05, 0.05)])
def test_the_ppo_family_equals_trls(trl_type, level, settings, clip):
    new, old = logprobs(0)
    expected, expected_grad = trl(trl_type, level, new, old, ADV, *clip)
    value, grad = rlvr(PolicyLoss(clip[0], clip[1], 0.0, **settings), new, old, ADV)
    assert value == pytest.approx(expected, abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6, rtol=0)


def test_cispo_equals_trls():
    # TRL's epsilon_high is CISPO's cap on the weight (ScaleRL's ε_max); aggregated as dapo: a token mean
    new, old = logprobs(1)
    new_big = (old + torch.log(torch.tensor(6.0)) * (torch.arange(T) == 0)).requires_grad_(True)  # r = 6 > 5: capped
    for logps in (new, new_big):
        expected, expected_grad = trl("cispo", "token", logps, old, ADV, 0.2, 5.0)
        value, grad = rlvr(PolicyLoss(0.0, 0.0, 0.0, form="cispo", cispo_max=5.0), logps, old, ADV)
        assert value == pytest.approx(expected, abs=1e-6)
        assert torch.allclose(grad, expected_grad, atol=1e-6, rtol=0)


def test_a_completion_without_advantage_counts_in_trls_denominators_not_in_rlvrs():
    # row 1's advantage is 0 (its group tied). TRL counts it: grpo divides by B = 4 completions where rlvr's
    # seq_mean_token_mean divides by the 3 that carry signal (3/4 of rlvr's loss and gradient), and bnpo by all 14
    # completion tokens where rlvr's token_mean divides by the 11 with A ≠ 0 (11/14)
    new, old = logprobs(2)
    adv = ADV.clone()
    adv[1] = 0.0
    for trl_type, aggregation, share in (("grpo", "seq_mean_token_mean", 3 / 4), ("bnpo", "token_mean", 11 / 14)):
        expected, expected_grad = trl(trl_type, "token", new, old, adv, 0.2, 0.2)
        value, grad = rlvr(PolicyLoss(0.2, 0.2, 0.0, aggregation=aggregation), new, old, adv)
        assert expected == pytest.approx(value * share, abs=1e-6)
        assert torch.allclose(expected_grad, grad * share, atol=1e-6, rtol=0)
