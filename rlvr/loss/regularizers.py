"""The terms added to each token's policy loss, in the forms' signature `(inputs, settings) -> LossOutputs`: the
reference KL β·kl_t and the entropy bonus −c·H_t (rlvr/algorithm/kl.py), which the whole loss adds before
aggregating, on the same tokens and with the same weights as the policy term; and ECHO's −w·log π on observation
tokens (rlvr/echo/echo.py), whose sum the whole loss adds after."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.loss.contract import LossInputs, LossOutputs, LossSettings

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


def reference_kl(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """β·kl_t, kl_t the k1/k2/k3 estimate of KL(π_θ ‖ π_ref) at the token (`algorithm.kl`, where=loss)."""
    kl = settings.reference_kl
    if inputs.ref_logprobs is None:
        raise ValueError(f"algorithm.kl.coef={kl.coef}: the loss needs the reference's log-probabilities")
    kl_t = kl.estimate(inputs.trainer_logprobs, inputs.ref_logprobs)
    return LossOutputs(kl.coef * kl_t, {"kl_ref": kl_t})


def entropy_bonus(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """−c·H_t (`algorithm.entropy_coef` c; a bonus for c > 0)."""
    if inputs.entropies is None:
        raise ValueError(f"algorithm.entropy_coef={settings.entropy_coef}: the loss needs the entropies")
    return LossOutputs(-(settings.entropy_coef * inputs.entropies), {"entropy": inputs.entropies})


def echo(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """ECHO's −w·log π on each observation token (`echo_weights`, already normalised over the whole step)."""
    if inputs.echo_weights is None:
        raise ValueError("echo=on: the loss needs the ECHO weights (LossInputs.echo_weights)")
    return LossOutputs(-(inputs.trainer_logprobs * inputs.echo_weights), {})


def distill_kl(inputs: LossInputs, settings: LossSettings) -> LossOutputs:
    """distill.estimator=full: per token, the divergence D_β between the student's and the teacher's distributions
    over the teacher's top-k S (docs/algorithms.md#the-full-estimator), each either renormalised over S or, with
    `distill.tail`, S and one more outcome holding the mass outside it:

        β = 1   KL(p ‖ q) = Σ p · (log p − log q)        the reverse KL (the default; NeMo-RL's loss, GKD's β = 1)
        β = 0   KL(q ‖ p)                                 the forward KL
        else    β · KL(q ‖ M) + (1 − β) · KL(p ‖ M),  M = β·q + (1 − β)·p     the generalised Jensen–Shannon

    p the student's, q the teacher's. [N, T], each token's D_β; its metric `reverse_kl`, KL(p ‖ q) on the same
    outcomes, whatever β. Its gradient reaches the student's probability of every token of S."""
    if inputs.student_support_logprobs is None or inputs.teacher_support_logprobs is None:
        raise ValueError("distill.estimator=full: the loss needs the student's and the teacher's log-probabilities "
                         "of the teacher's top-k (LossInputs.student_support_logprobs, teacher_support_logprobs)")
    outcomes = with_tail if inputs.distill_tail else renormalised
    student = outcomes(inputs.student_support_logprobs.float())
    teacher = outcomes(inputs.teacher_support_logprobs.float())
    reverse, beta = kl(student, teacher), inputs.distill_beta
    if beta == 1.0:
        divergence = reverse
    elif beta == 0.0:
        divergence = kl(teacher, student)
    else:
        mixture = torch.logaddexp(teacher + math.log(beta), student + math.log1p(-beta))
        divergence = beta * kl(teacher, mixture) + (1.0 - beta) * kl(student, mixture)
    return LossOutputs(divergence, {"reverse_kl": reverse})


def kl(a: Tensor, b: Tensor) -> Tensor:
    """KL(a ‖ b) = Σ exp(a) · (a − b) over the last dimension, from log-probabilities."""
    return (a.exp() * (a - b)).sum(-1)


def renormalised(logp: Tensor) -> Tensor:
    """log p̃(v) = log p(v) − log Σ_{u ∈ S} p(u): the distribution over S alone."""
    return logp - logp.logsumexp(-1, keepdim=True)


TAIL_LOG_MASS_MAX = -1e-7
"""The most log Σ_{u ∈ S} p(u) counts as (SDPO's clamp): the tail bucket keeps ≥ ~1e-7, so its log and gradient stay
finite when S holds (nearly) every token."""


def with_tail(logp: Tensor) -> Tensor:
    """S's log-probabilities and one more outcome, log(1 − Σ_{u ∈ S} p(u)): the whole distribution, the tokens outside
    S as one (SDPO's `distillation_add_tail`)."""
    inside = logp.logsumexp(-1, keepdim=True).clamp(max=TAIL_LOG_MASS_MAX)
    return torch.cat([logp, torch.log(-torch.expm1(inside))], dim=-1)
