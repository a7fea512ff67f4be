"""The terms added to each token's policy loss, in the forms' signature `(inputs, settings) -> LossOutputs`: the
reference KL β·kl_t and the entropy bonus −c·H_t (rlvr/algorithm/kl.py), which the whole loss adds before
aggregating, on the same tokens and with the same weights as the policy term; and ECHO's −w·log π on observation
tokens (rlvr/echo/echo.py), whose sum the whole loss adds after."""

from __future__ import annotations

from rlvr.loss.contract import LossInputs, LossOutputs, LossSettings


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
    """distill.estimator=full: per token, the reverse KL from the student to the teacher over the teacher's top-k S,
    both distributions renormalised over S (NeMo-RL's distillation loss; exact when S is the vocabulary):

        KL_t = Σ_{v ∈ S} p̃_θ(v) · (log p̃_θ(v) − log p̃_T(v)),   log p̃(v) = log p(v) − log Σ_{u ∈ S} p(u)

    [N, T]; its gradient reaches the student's probability of every token of S."""
    if inputs.student_support_logprobs is None or inputs.teacher_support_logprobs is None:
        raise ValueError("distill.estimator=full: the loss needs the student's and the teacher's log-probabilities "
                         "of the teacher's top-k (LossInputs.student_support_logprobs, teacher_support_logprobs)")
    student = inputs.student_support_logprobs.float()
    teacher = inputs.teacher_support_logprobs.float()
    student = student - student.logsumexp(-1, keepdim=True)
    teacher = teacher - teacher.logsumexp(-1, keepdim=True)
    return LossOutputs((student.exp() * (student - teacher)).sum(-1), {})
