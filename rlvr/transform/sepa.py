"""`transform=sepa` (retrain's `gtpo_sepa`) and its amplifying variants `sepa_amp`, `sepa_amp_c`: reshape
the uncertainty of execution tokens, then GTPO (docs/algorithms.md#sepa; SEPA comes from retrain itself, there is
no paper for it).

Per completion, with u its token uncertainties (rlvr.transform.uncertainty), m its planning mask,
λ = clamp(λ_t, 0, 1) from the SEPA controller (rlvr.transform.sepa_controller; `transform.schedule.fixed_lambda`
instead when set), v = min(u, 50) and
μ_exec = mean of v over this completion's execution tokens (m = 0):

    SEPA             (pooling)             exec: u' = λ·μ_exec + (1 − λ)·v
    SEPAAmp          (amplification)       exec: u' = (1 + λ)·v − λ·μ_exec
    SEPAAmpClamped   (clamped amplif.)     exec: u' = max(0, (1 + λ)·v − λ·μ_exec)
                                           planning tokens: u' = v

then A_{i,t} = GTPO(A_i, u', β) (rlvr.transform.gtpo). λ = 0 leaves u unchanged, so the output is
exactly GTPO's; a completion without execution tokens (empty, or all planning) is left unchanged.
At λ = 1 pooling gives every execution token the same u' = μ_exec, hence the same weight
1 + β(μ_exec / (mean(u') + 1e-8) − 1): GTPO's differentiation then comes only from planning tokens.
Amplification keeps Σ_exec u' = Σ_exec v (the completion's mean uncertainty is unchanged) but can push
single values below 0 (their weight shrinks, clamped at 0; `sepa_amp_c` floors u' at 0 instead) or
above 50 (GTPO clips them, as retrain does). Zero advantages (tied groups) and padding stay exactly 0.

One call is one RL step: λ is resolved from the controller's state left by earlier steps, the transform
is applied, then the controller observes this step's correct rate and (schedule = auto) folds in this
step's execution-token surprisals — see the controller's docstring for why that order.

Knobs: `beta`, `uncertainty`, and `schedule` (transform.schedule: the λ schedule's `kind, steps, delay_steps,
correct_rate_gate, ema_decay, var_threshold, warmup_sequences, fixed_lambda`, conf/lambda_schedule.yaml). Metrics:
`sepa_lambda` (the λ used: the controller's, or `fixed_lambda`), `sepa_gate_open`
(1.0/0.0, after this step's observation), the pre/post uncertainty stats split by planning mask, and
`planning_token_fraction`. `state_dict()` is the controller's.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.transform.gtpo import check_beta, gtpo_token_advantages
from rlvr.transform.sepa_controller import LambdaSchedule, SEPAController
from rlvr.transform.signals import as_weights, check_step, planning_mask
from rlvr.transform.uncertainty import MAX_UNCERTAINTY, check_uncertainty, signal_needs, token_uncertainty
from rlvr.transform.uncertainty_stats import planning_token_fraction, uncertainty_stats
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


def reshape_execution(u_PG_T: Tensor, exec_PG_T: Tensor, lam: float, variant: str) -> Tensor:
    """u' of the module docstring for `variant` in {"pool", "amp", "amp_c"}.

    `u_PG_T` must be finite and 0 at padding; `exec_PG_T` (bool, or 0/1 floats of u's dtype) marks
    execution tokens. Returns `u_PG_T` itself when λ = 0."""
    lam = min(max(lam, 0.0), 1.0)
    if lam == 0.0:
        return u_PG_T
    exec_ = as_weights(exec_PG_T, u_PG_T.dtype)
    v = u_PG_T.clamp(max=MAX_UNCERTAINTY)
    work = torch.mul(v, exec_)  # few [P·G, T] temporaries: each fresh one costs page faults on CPU
    mean_PG_1 = work.sum(-1, keepdim=True) / exec_.sum(-1, keepdim=True).clamp(min=1)
    if variant == "pool":  # (1 − λ)·v + λ·μ_exec
        torch.mul(v, 1.0 - lam, out=work).add_(lam * mean_PG_1)
    else:  # (1 + λ)·v − λ·μ_exec
        torch.mul(v, 1.0 + lam, out=work).sub_(lam * mean_PG_1)
        if variant == "amp_c":
            work.clamp_(min=0.0)
    # exec tokens: reshaped + (v − v) = reshaped;  others: 0 + (v − 0) = v  (exact for finite values)
    return work.mul_(exec_).add_(v.addcmul_(v, exec_, value=-1.0))


class SEPA:
    """`SEPA(beta, uncertainty, schedule)`: pooling; see the module docstring."""

    variant: ClassVar[str] = "pool"

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return signal_needs(settings["uncertainty"], planning=True)

    def __init__(
        self,
        *,
        beta: float,
        uncertainty: str,
        schedule: LambdaSchedule,
    ) -> None:
        self.beta = check_beta(beta)
        self.uncertainty = check_uncertainty(uncertainty)
        self.controller = SEPAController(schedule)
        self.fixed_lambda = self.controller.schedule.fixed_lambda
        if not self.controller.enabled and self.fixed_lambda is None:
            warnings.warn(
                f"{type(self).__name__} with transform.schedule.steps=0 and kind='linear' keeps λ = 0: it is GTPO",
                stacklevel=2,
            )

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        check_step(adv_PG, signals)
        lam = self.controller.resolve_lambda(signals.step) if self.fixed_lambda is None else self.fixed_lambda
        dtype = signals.logprobs_PG_T.dtype
        planning = planning_mask(signals)
        mask, plan = as_weights(signals.mask_PG_T, dtype), as_weights(planning, dtype)
        exec_ = mask - plan
        u = token_uncertainty(self.uncertainty, signals, mask)
        post_u = reshape_execution(u, exec_, lam, self.variant)
        adv_PG_T = gtpo_token_advantages(adv_PG, post_u, mask, self.beta)
        metrics = uncertainty_stats(u, post_u, exec_, plan, adv_PG, signals.group_size)
        metrics["planning_token_fraction"] = planning_token_fraction(mask, plan)
        self.controller.observe_correct_rate(signals.correct_rate)
        if self.controller.schedule.kind == "auto":
            self.controller.update_auto_state(signals.logprobs_PG_T, signals.mask_PG_T & ~planning)
        metrics["sepa_lambda"] = lam
        metrics["sepa_gate_open"] = float(self.controller.gate_open)
        return adv_PG_T, metrics

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state)


class SEPAAmp(SEPA):
    """`transform=sepa_amp` (retrain's `gtpo_sepa_amp`): execution uncertainty pushed *away* from its mean."""

    variant: ClassVar[str] = "amp"


class SEPAAmpClamped(SEPA):
    """`transform=sepa_amp_c` (retrain's `gtpo_sepa_amp_c`): amplification floored at 0."""

    variant: ClassVar[str] = "amp_c"
