"""The loss contract: what a backend hands the loss for one micro-batch, and what it gets back.

A backend computes the log-probabilities (and the entropies and the reference's when the loss asks), builds one
`LossInputs` per micro-batch and calls the configured loss, `algorithm.loss`, once: `loss(inputs) -> LossOutputs`,
then `backward()` on `LossOutputs.loss`. Everything the loss needs arrives as tensors: the correction of the
engine/trainer mismatch as `importance_weights` and `loss_mask` (rlvr/algorithm/correction.py), the aggregation as
`loss_weights` or `token_count` (rlvr/loss/aggregation.py), kl_cov's and clip_cov's whole-step pick as `selected`
(rlvr/loss/selection.py). The loss reads nothing else and changes nothing: the same inputs give the same outputs.

The built-in terms (rlvr/loss/forms.py, rlvr/loss/regularizers.py) have one signature, `(inputs, settings) ->
LossOutputs`, and return per-token values, [N, T], which the whole loss adds and aggregates once; the whole loss
(rlvr/algorithm/loss.py `PolicyLoss`, or a user's own, rlvr/algorithm/custom_loss.py) returns the micro-batch's scalar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, [N, T] per token (N rows, T completion positions; padding anywhere a mask is False)."""

    trainer_logprobs: Tensor
    """log π_θ of the sampled tokens, at the sampler's temperature, with their gradient."""
    old_logprobs: Tensor
    """log π_old (no gradient): the engine's (`correction.pi_old=bypass`) or the trainer's own (`decoupled`)."""
    advantages: Tensor
    loss_mask: Tensor
    """bool: the tokens the loss sums over (action tokens with A ≠ 0 that the correction kept)."""
    token_count: int
    """token_mean's divisor: the whole step's tokens with A ≠ 0 (at least 1)."""
    sampled: Tensor
    """bool: every action token of the rows with any A ≠ 0 (gspo's ratio is the geometric mean over them)."""
    loss_weights: Tensor | None = None
    """Each token's weight in the step's loss Σ w·ℓ (an aggregation other than token_mean); None: Σ ℓ / token_count."""
    importance_weights: Tensor | None = None
    """What the correction multiplies each token's policy loss by (no gradient); None: no correction."""
    ref_logprobs: Tensor | None = None
    """log π_ref (no gradient), when the loss has the reference KL."""
    entropies: Tensor | None = None
    """H_t of the policy's temperature-scaled distribution (with gradient), when the loss has the entropy bonus."""
    selected: Tensor | None = None
    """bool: kl_cov's and clip_cov's tokens, chosen over the whole step (rlvr/loss/selection.py)."""
    echo_weights: Tensor | None = None
    """echo=on: each observation token's ECHO weight, normalised over the whole step (rlvr/echo/echo.py)."""
    distill_weights: Tensor | None = None
    """distill.estimator=full: each action token's weight in the teacher's KL term, coef / the step's action tokens
    (rlvr/distill/distill.py)."""
    student_support_logprobs: Tensor | None = None
    """[N, T, K] log π_θ of the teacher's top-k tokens at each position, at the sampler's temperature, with gradient."""
    teacher_support_logprobs: Tensor | None = None
    """[N, T, K] the teacher's log-probabilities of the same tokens (no gradient)."""
    distill_beta: float = 1.0
    """distill.beta: the divergence over the support, 1 the reverse KL, 0 the forward KL, between the generalised
    Jensen–Shannon (rlvr/loss/regularizers.py `distill_kl`)."""
    distill_tail: bool = False
    """distill.tail: the mass outside the support as one more outcome, instead of renormalising over it."""


@dataclass(frozen=True)
class LossOutputs:
    loss: Tensor
    """The whole loss's: the micro-batch's share of the step's loss, a scalar to call backward on. A term's: each
    token's ℓ, [N, T]."""
    metrics: dict[str, Tensor]
    """The whole loss's: sums over the micro-batch (no gradient), which the backend adds over micro-batches and
    processes (`loss`, `clipped`, `kl_ref`, `entropy`, `echo_loss`). A term's: per-token values, [N, T]."""


class Loss(Protocol):
    """`algorithm.loss` as a backend calls it (rlvr/algorithm/loss.py `PolicyLoss`, or a user's own)."""

    def __call__(self, inputs: LossInputs) -> LossOutputs:
        ...


class LossSettings(Protocol):
    """What the built-in terms read of `algorithm.loss` (rlvr/algorithm/loss.py `PolicyLoss` gives it): this
    package depends on no algorithm."""

    @property
    def mode(self) -> str: ...

    @property
    def clip_eps(self) -> float: ...

    @property
    def clip_eps_high(self) -> float: ...

    @property
    def cispo_max(self) -> float: ...

    @property
    def kl_cov_percent(self) -> float: ...

    @property
    def kl_cov_coef(self) -> float: ...

    @property
    def clip_cov_ratio(self) -> float: ...

    @property
    def clip_cov_min(self) -> float: ...

    @property
    def clip_cov_max(self) -> float: ...

    @property
    def entropy_coef(self) -> float: ...

    @property
    def reference_kl(self) -> Any: ...

    @property
    def selects_tokens(self) -> bool: ...

    def clip_cov_bounds(self) -> tuple[float, float]: ...
