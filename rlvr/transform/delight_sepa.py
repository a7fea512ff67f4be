"""`transform=delight_sepa`: Delight's gate blended in by the SEPA controller's λ (retrain's `delight_sepa`;
docs/algorithms.md#delight_sepa).

    A'_t = A_t · ((1 − λ) + λ·σ(A_t·s̃_t / η))

with s̃, σ and η exactly as in rlvr.transform.delight (default norm here: scale). λ ∈ [0, 1] is the SEPA
controller's (rlvr.transform.sepa_controller: linear ramp after a delay, correctness gate, optional auto
schedule), or `transform.schedule.fixed_lambda` when set (retrain's `delight_lambda` override, which retrain clamped
into [0, 1]; a value outside is refused here at construction). λ = 0 gives every token its plain A_t (exactly:
1 − 0 + 0·σ = 1); λ = 1 is `delight`. e.g. A = 1, s̃ = [0.1, 2.0], η = 1, λ = 0.5: gate = [0.52498, 0.88080] →
A' = 0.5 + 0.5·gate = [0.76249, 0.94040]. The weight lies in [1 − λ, 1]: signs are kept,
A = 0 gives zeros, padding is exactly 0.

The controller steps as in SEPA (rlvr/transform/sepa.py): λ is resolved from the state left by earlier steps,
then the step's correct rate is observed and, with kind = auto, every completion's surprisals are folded in.
Delight has no planning mask (retrain: `needs_planning` no), so every completion token counts as an execution
token for the auto schedule.

Knobs: `norm`, the η knobs (rlvr.transform.delight_eta), and `schedule` (transform.schedule: the λ schedule's
`kind, steps, delay_steps, correct_rate_gate, ema_decay, var_threshold, warmup_sequences, fixed_lambda`, the node
conf/lambda_schedule.yaml that sepa* share). Metrics: Delight's (`dg_lambda` = the λ used), plus `sepa_lambda` (the
controller's λ for this step) and `sepa_gate_open`. `state_dict()`: {"transform": "delight_sepa", "eta_prev":
…, "sepa": the controller's state}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.protocols import Needs
from rlvr.transform import knobs
from rlvr.transform.delight import NORMS, check_state, delight_advantages
from rlvr.transform.delight_eta import DelightEta
from rlvr.transform.sepa_controller import LambdaSchedule, SEPAController
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor


class DelightSEPA:
    """`DelightSEPA(norm, eta…, schedule)`: see the module docstring."""

    name = "delight_sepa"

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __init__(self, *, norm: str, eta: float, eta_mode: str, eta_min: float, eta_max: float,
                 eta_target_neutral_frac: float, eta_target_ordering_gap: float, eta_ema_decay: float,
                 schedule: LambdaSchedule) -> None:
        self.norm = knobs.choice("norm", norm, NORMS)
        self.eta = DelightEta(eta=eta, eta_mode=eta_mode, eta_min=eta_min, eta_max=eta_max,
                              eta_target_neutral_frac=eta_target_neutral_frac,
                              eta_target_ordering_gap=eta_target_ordering_gap, eta_ema_decay=eta_ema_decay)
        self.controller = SEPAController(schedule)
        self.fixed_lambda = self.controller.schedule.fixed_lambda

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        controller_lambda = self.controller.resolve_lambda(signals.step)
        lam = controller_lambda if self.fixed_lambda is None else self.fixed_lambda
        adv_PG_T, metrics = delight_advantages(adv_PG, signals, norm=self.norm, eta=self.eta, lam=lam)
        self.controller.observe_correct_rate(signals.correct_rate)
        self.controller.update_auto_state(signals.logprobs_PG_T, signals.mask_PG_T)
        metrics["sepa_lambda"] = controller_lambda
        metrics["sepa_gate_open"] = float(self.controller.gate_open)
        return adv_PG_T, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"transform": self.name, **self.eta.state_dict(), "sepa": self.controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.name)
        if not isinstance(state.get("sepa"), dict):
            raise ValueError(f"state['sepa']={state.get('sepa')!r} must be the SEPA controller's state (a dict)")
        self.eta.load_state_dict(state)
        self.controller.load_state_dict(state["sepa"])
