"""`transform=hard_delight`: Delight's gate made hard — only each completion's k most delightful tokens keep
full credit — blended in by the SEPA controller's λ (retrain's `hard_delight`;
docs/algorithms.md#hard_delight).

For a completion with advantage A ≠ 0 and surprisals s_t = min(−logprob_t, 50) over its n real tokens:

    k    = max(1, ⌊n · k_frac⌋)
    kept = the k tokens with the largest s if A > 0, the smallest s if A < 0
           (ties: earlier positions first, a stable sort's order)
    A'_t = A · ((1 − λ) + λ·[t ∈ kept])

e.g. n = 10, k_frac = 0.2 → k = 2; s = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], λ = 1: A > 0 keeps s = 9 and 6
(positions 5, 7), A < 0 keeps the two s = 1 (positions 1, 3). n = 3 → k = max(1, ⌊0.6⌋) = 1. λ = 0 gives every
token its plain A; A = 0 gives zeros (as does an empty completion); the factor lies in [1 − λ, 1], so signs are
kept; padding is exactly 0. λ is the SEPA controller's or `schedule.fixed_lambda`, and the controller steps, as in
rlvr/transform/delight_sepa.py (every completion token counts as an execution token for the auto schedule).
There is no η and no normalisation: a per-completion positive rescaling of s does not change its ranks. The
selection is taken without sorting (rlvr.transform.order_stats).

Token advantages (multi-turn turn credit): each completion's tokens with A_t > 0 are ranked among themselves
(k = max(1, ⌊n₊·k_frac⌋) largest s kept) and its tokens with A_t < 0 among themselves (smallest s), each with its
own A_t — for one advantage per completion this is the rule above. (retrain had one advantage per completion.)

Knobs: `k_frac` ∈ [0, 1] (retrain default 0.2) and `schedule` (transform.schedule, conf/lambda_schedule.yaml: the
λ schedule sepa* and delight_sepa share, with `fixed_lambda`: null, or λ ∈ [0, 1]; retrain's `delight_lambda`).
retrain accepted any `k_frac` (above 1 kept every token, below 0 one) and clamped `delight_lambda` into [0, 1]; here
either outside [0, 1] is refused at construction.
Metrics (retrain's names; per prompt group, then the mean over the groups with a non-zero advantage):
`hard_dg_active_frac` (kept tokens / tokens with A_t ≠ 0), `hard_dg_k_frac`, `hard_dg_lambda` (the λ used),
`hard_dg_net_bias` (Σ_t A'_t − Σ_t A_t), plus `sepa_lambda` (the controller's λ) and `sepa_gate_open`, and the
uncertainty statistics (rlvr.transform.uncertainty_stats) of s, every token exec, post = pre (retrain left post_*
at 0). `hard_dg_active_frac` is not retrain's quantity of that name: retrain's was the group's tokens whose new
advantage is non-zero / all of the group's tokens, which for λ < 1 is the share of tokens on completions with
A ≠ 0 (1 when every completion has one), whatever k_frac; the two agree only for λ = 1 in a group whose
completions all have A ≠ 0.
`state_dict()`: {"transform": "hard_delight", "sepa": the controller's state}. retrain's `hard_delight` is itself the
SEPA-blended hard gate: there is no separate "hard delight without λ" (schedule.fixed_lambda = 1 is that) nor a
`hard_delight_sepa`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.transform import knobs
from rlvr.transform.delight import GroupMeans, Units, by_group, check_state, units_of
from rlvr.transform.order_stats import Work, highest, scratch
from rlvr.transform.sepa_controller import LambdaSchedule, SEPAController
from rlvr.transform.signals import as_weights, check_step, per_token
from rlvr.transform.uncertainty import token_uncertainty
from rlvr.transform.uncertainty_stats import groups_with_signal, uncertainty_stats
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


def kept_tokens(units: Units, k_frac: float, work: Work) -> Tensor:
    """0/1 [R, T] (in work[0] for episode advantages): each unit's k = max(1, ⌊n·k_frac⌋) tokens highest in
    sign(A)·s (none for an empty unit)."""
    n_U = units.count_U.to(torch.float64)
    k_U = torch.where(n_U > 0, (n_U * k_frac).floor().clamp(min=1.0), 0.0).long()
    kept_U_T = highest(units.key_U_T, units.valid_U_T, k_U, work=work)
    return kept_U_T if units.copies == 1 else kept_U_T.reshape(2, -1, kept_U_T.shape[-1]).sum(0)


class HardDelight:
    """`HardDelight(k_frac, schedule)`: see the module docstring."""

    name = "hard_delight"

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __init__(self, *, k_frac: float, schedule: LambdaSchedule) -> None:
        self.k_frac = knobs.number("k_frac", k_frac, low=0.0, high=1.0)
        self.controller = SEPAController(schedule)
        self.fixed_lambda = self.controller.schedule.fixed_lambda

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        check_step(adv_PG, signals)
        controller_lambda = self.controller.resolve_lambda(signals.step)
        lam = controller_lambda if self.fixed_lambda is None else self.fixed_lambda
        dtype = signals.logprobs_PG_T.dtype
        weights = as_weights(signals.mask_PG_T, dtype)
        s = token_uncertainty("surprisal", signals, weights)
        stats = uncertainty_stats(s, s, weights, None, adv_PG, signals.group_size)
        adv = per_token(adv_PG, dtype)
        units = units_of(adv, s, weights)
        work = scratch(units.key_U_T)
        kept = kept_tokens(units, self.k_frac, work)
        kept_R = kept.sum(-1)
        new = kept.mul_(lam).add_(1.0 - lam).mul_(weights).mul_(adv)  # A·((1 − λ) + λ·[kept]), 0 at padding
        counted_P = groups_with_signal(adv_PG, signals.group_size)
        metrics = self._metrics(new, adv, weights, kept_R, units, lam, counted_P, signals.group_size) | stats
        self.controller.observe_correct_rate(signals.correct_rate)
        self.controller.update_auto_state(signals.logprobs_PG_T, signals.mask_PG_T)
        metrics["sepa_lambda"] = controller_lambda
        metrics["sepa_gate_open"] = float(self.controller.gate_open)
        return new, metrics

    def _metrics(self, new: Tensor, adv: Tensor, weights: Tensor, kept_R: Tensor, units: Units, lam: float,
                 counted_P: Tensor, group_size: int) -> dict[str, float]:
        if not bool(counted_P.any()):
            return {}
        num_groups = counted_P.numel()
        n_R = weights.sum(-1)
        old_R = adv[:, 0] * n_R if units.copies == 1 else (adv * weights).sum(-1)
        rows_P = by_group(torch.stack([kept_R, new.sum(-1), old_R], -1), num_groups, group_size)
        gated_P = by_group(units.count_U, num_groups, group_size)
        out = GroupMeans(counted_P)
        out.add("hard_dg_active_frac", rows_P[:, 0] / gated_P.clamp(min=1), gated_P > 0)
        out.add("hard_dg_k_frac", torch.full((num_groups,), self.k_frac, dtype=torch.float64))
        out.add("hard_dg_lambda", torch.full((num_groups,), lam, dtype=torch.float64))
        out.add("hard_dg_net_bias", rows_P[:, 1] - rows_P[:, 2])
        return out.result()

    def state_dict(self) -> dict[str, Any]:
        return {"transform": self.name, "sepa": self.controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.name)
        if not isinstance(state.get("sepa"), dict):
            raise ValueError(f"state['sepa']={state.get('sepa')!r} must be the SEPA controller's state (a dict)")
        self.controller.load_state_dict(state["sepa"])
