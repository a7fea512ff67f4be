"""The policy-loss forms, one registered function each of the one signature `(inputs, settings) -> LossOutputs`:
each token's ℓ and, under `clipped`, the tokens counted in `clip_fraction` (formulas: rlvr/algorithm/loss.py).

`settings` is the `algorithm.loss` node built (rlvr/algorithm/loss.py `PolicyLoss`, read through
rlvr/loss/contract.py `LossSettings`); `FORMS` maps its `form` (ppo, gspo, cispo) and its covariance `mode` (kl_cov,
clip_cov, which replace ppo's clip) to the function, as verl's core_algos registers its policy losses by name. A
term neither weighs nor aggregates: the whole loss multiplies ℓ by the correction's `importance_weights` and
aggregates once (rlvr/loss/aggregation.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.loss.contract import LossInputs, LossOutputs, LossSettings

if TYPE_CHECKING:
    from torch import Tensor


torch = lazy_import("torch")

Form = Callable[[LossInputs, LossSettings], LossOutputs]


def clipped(ratio: Tensor, adv: Tensor, settings: LossSettings) -> LossOutputs:
    """−r·A, or PPO's −min(r·A, clip(r, 1−ε, 1+ε_high)·A) when clip_eps > 0 (clipped: r outside the band)."""
    eps = settings.clip_eps
    if eps == 0:
        return LossOutputs(-ratio * adv, {"clipped": torch.zeros_like(adv, dtype=torch.bool)})
    hi = settings.clip_eps_high or eps
    clipped_ratio = ratio.clamp(1 - eps, 1 + hi)
    loss = -torch.minimum(ratio * adv, clipped_ratio * adv)
    return LossOutputs(loss, {"clipped": (ratio < 1 - eps) | (ratio > 1 + hi)})


def ppo(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """The per-token ratio r = exp(log π_θ − log π_old), clipped by `clipped`."""
    return clipped(torch.exp(inputs.trainer_logprobs - inputs.old_logprobs), inputs.advantages, settings)


def gspo(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """GSPO: each row's one ratio s = exp(mean δ over its sampled tokens) on every token, clipped by `clipped`."""
    sampled = inputs.sampled
    delta = torch.where(sampled, inputs.trainer_logprobs - inputs.old_logprobs, 0.0)
    ratio = torch.exp(delta.sum(-1, keepdim=True) / sampled.sum(-1, keepdim=True).clamp(min=1))
    return clipped(ratio.expand_as(inputs.advantages), inputs.advantages, settings)


def cispo(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """CISPO: −sg(min(r, cispo_max))·A·log π_θ (clipped: the weights above the cap)."""
    new_lp = inputs.trainer_logprobs
    weight = torch.exp(new_lp - inputs.old_logprobs).detach()
    loss = -weight.clamp(max=settings.cispo_max) * inputs.advantages * new_lp
    return LossOutputs(loss, {"clipped": weight > settings.cispo_max})


def kl_cov(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """−r·A, plus kl_cov_coef·|δ| on the selected tokens (none counted as clipped)."""
    new_lp, old_lp, adv = inputs.trainer_logprobs, inputs.old_logprobs, inputs.advantages
    selected = chosen(inputs, settings)
    penalty = settings.kl_cov_coef * (new_lp - old_lp).abs()
    loss = -torch.exp(new_lp - old_lp) * adv + torch.where(selected, penalty, 0.0)
    return LossOutputs(loss, {"clipped": torch.zeros_like(adv, dtype=torch.bool)})


def clip_cov(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """max(−r·A, −clip(r, 1−ε_lo, 1+ε_hi)·A), 0 on the selected tokens (the ones counted as clipped)."""
    adv, selected = inputs.advantages, chosen(inputs, settings)
    ratio = torch.exp(inputs.trainer_logprobs - inputs.old_logprobs)
    lo, hi = settings.clip_cov_bounds()
    loss = torch.maximum(-ratio * adv, -ratio.clamp(1 - lo, 1 + hi) * adv)
    return LossOutputs(torch.where(selected, torch.zeros_like(loss), loss), {"clipped": selected})


def chosen(inputs: LossInputs, settings: LossSettings) -> Tensor:
    """The whole step's pick, which kl_cov and clip_cov cannot make from one micro-batch."""
    if inputs.selected is None:
        raise ValueError(f"algorithm.loss.mode={settings.mode}: the loss needs the whole step's selected tokens "
                         "(LossInputs.selected, rlvr/loss/selection.py)")
    return inputs.selected


FORMS: dict[str, Form] = {"ppo": ppo, "gspo": gspo, "cispo": cispo, "kl_cov": kl_cov, "clip_cov": clip_cov}
"""`algorithm.loss.form`, and the covariance `algorithm.loss.mode`s, to their function."""
