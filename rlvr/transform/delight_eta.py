"""Delight's temperature η: fixed, or adapted each step to the group's advantage·surprisal magnitudes
(retrain's `delight_eta*` knobs; docs/algorithms.md#delight-eta).

The gate σ(A·s/η) (rlvr.transform.delight) is neutral (in [0.4, 0.6]) exactly where |A·s|/η ≤ ln 1.5, since
σ(ln 1.5) = 1.5/2.5 = 0.6. Per prompt group g, one step:

    fixed      η_g = max(eta, 1e-8)
    adaptive   m    = |A_t·s̃_t| over the tokens of the group's completions with A_t ≠ 0
               raw  = quantile(m, target_neutral_frac) / ln 1.5        (so that fraction of tokens is neutral)
               η₁   = clamp(raw, eta_min, eta_max)
               gap  = the group's mean sign-corrected ordering gap at η₁ (rlvr.transform.delight)
               η₂   = clamp(η₁ · max(gap / target_ordering_gap, 0.25), eta_min, eta_max)
                          if target_ordering_gap > 0 and gap < target_ordering_gap, else η₁
               η_g  = clamp(d·η_prev + (1 − d)·η₂, eta_min, eta_max)   if 0 < d < 1 and η_prev exists, else η₂
                      (d = ema_decay; η_prev = the previous step's η, see below)

The quantile is linear interpolation between order statistics (numpy's default): with the n magnitudes
sorted, x = q·(n − 1), quantile = m₍⌊x⌋₎ + (x − ⌊x⌋)·(m₍⌊x⌋+1₎ − m₍⌊x⌋₎); e.g. m = [0.2, 0.4, 1.0, 3.0],
q = 0.5: x = 1.5 → 0.4 + 0.5·0.6 = 0.7, raw = 0.7 / 0.405465 = 1.72642. It is taken without sorting
(rlvr.transform.order_stats). A group with no magnitude (its non-zero advantages are on empty
completions) takes clamp(η_prev), or clamp(eta) before there is an η_prev, and reports no raw value. A gap
is only known for a group with a completion of ≥ 2 gated tokens; without one the gap step is left out.

η_prev, the state: after each step, the mean of η_g over the groups with a non-zero advantage (the step's
`dg_eta` metric, which retrain's trainer carried to the next step as `delight_eta_ema`); a step without such a
group leaves it unchanged. It is kept in fixed mode too (equal to η), as retrain's trainer did, and
`state_dict()` stores it: a resumed run continues the EMA exactly.

Departure from retrain (deliberate): retrain did not clamp after the EMA, so an η_prev outside [eta_min,
eta_max] — from fixed-mode steps, or bounds changed on a resume — carried the adaptive η out of its bounds; here
the final η is clamped again, so an adaptive η always lies in [eta_min, eta_max]. retrain's aliases
(`delight_eta_adaptive = true` for the mode) are not accepted; its knobs are named without the `delight_` prefix.
Out-of-range knobs are refused at construction (the ranges below), where retrain floored any `eta` below 1e-8 (0 and
negatives included) to 1e-8, floored `eta_min` at 1e-8, raised `eta_max` to `eta_min`, clamped
`eta_target_neutral_frac` into [0, 1] and took a negative `eta_target_ordering_gap` as 0; a positive `eta` below
1e-8 is still floored.

Knobs (retrain defaults): `eta` 1.0 (> 0), `eta_mode` fixed | adaptive, `eta_min` 0.05 (> 0), `eta_max` 5.0
(≥ eta_min), `eta_target_neutral_frac` 0.5 ([0, 1]), `eta_target_ordering_gap` 0.0 ([0, 1]; 0 = off),
`eta_ema_decay` 0.0 ([0, 1); 0 = off). Metrics: `dg_eta, dg_eta_adaptive, dg_eta_target_neutral_frac,
dg_eta_target_ordering_gap, dg_eta_min, dg_eta_max, dg_eta_raw, dg_eta_prev, dg_eta_ema_decay` (dg_eta and
dg_eta_raw are means over the groups that have one; dg_eta_prev only once there is an η_prev).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.transform import knobs
from rlvr.transform.order_stats import kth

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

ETA_MODES = ("fixed", "adaptive")
ETA_FLOOR = 1e-8
"""retrain floors a fixed η here."""
NEUTRAL_LOGIT = math.log(1.5)
"""σ(ln 1.5) = 0.6: the edge of the neutral band [0.4, 0.6]."""
GAP_FACTOR_MIN = 0.25


def group_quantile(values_P_N: Tensor, valid_P_N: Tensor, q: float) -> tuple[Tensor, Tensor]:
    """([P] float64 q-quantile of each row's valid entries (linear interpolation), bool [P] row has entries).
    `values_P_N` is overwritten."""
    n_P = valid_P_N.sum(-1).to(torch.float64)
    position_P = q * (n_P - 1.0).clamp(min=0.0)
    lower_P = position_P.floor()
    rank_P = torch.where(n_P > 0, lower_P + 1.0, 0.0).long()
    a_P, b_P = kth(values_P_N, valid_P_N, rank_P, work=(values_P_N, torch.empty_like(values_P_N)), with_next=True)
    a_P, b_P = a_P.to(torch.float64), b_P.to(torch.float64)
    fraction_P = position_P - lower_P
    return torch.where(fraction_P > 0, a_P + fraction_P * (b_P - a_P), a_P), n_P > 0


class DelightEta:
    """η per group and step, and η_prev across steps; see the module docstring."""

    def __init__(self, *, eta: Any, eta_mode: Any, eta_min: Any, eta_max: Any, eta_target_neutral_frac: Any,
                 eta_target_ordering_gap: Any, eta_ema_decay: Any) -> None:
        self.eta = max(knobs.number("eta", eta, low=0.0, low_open=True), ETA_FLOOR)
        self.mode = knobs.choice("eta_mode", eta_mode, ETA_MODES)
        self.eta_min = knobs.number("eta_min", eta_min, low=0.0, low_open=True)
        self.eta_max = knobs.number("eta_max", eta_max, low=self.eta_min)
        self.target_neutral_frac = knobs.number("eta_target_neutral_frac", eta_target_neutral_frac, low=0.0, high=1.0)
        self.target_ordering_gap = knobs.number("eta_target_ordering_gap", eta_target_ordering_gap, low=0.0, high=1.0)
        self.ema_decay = knobs.number("eta_ema_decay", eta_ema_decay, low=0.0, high=1.0, high_open=True)
        self.prev: float | None = None

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"

    def resolve(self, num_groups: int, magnitudes: Callable[[], tuple[Tensor, Tensor]],
                gap_at: Callable[[Tensor], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
        """(η [P] float64, raw η [P] float64, bool [P] raw known) for this step's `num_groups` groups.

        `magnitudes()` → (|A_t·s_t| of each group's tokens [P, N = G·T], overwritten here; 0/1 [P, N] the gated
        tokens: real, A_t ≠ 0); `gap_at(η_P)` → (mean sign-corrected ordering gap [P], bool [P] known) at that
        η. Neither is called in fixed mode."""
        if not self.adaptive:
            eta_P = torch.full((num_groups,), self.eta, dtype=torch.float64)
            return eta_P, eta_P, torch.ones(num_groups, dtype=torch.bool)
        quantile_P, known_P = group_quantile(*magnitudes(), self.target_neutral_frac)
        raw_P = quantile_P / NEUTRAL_LOGIT
        eta_P = self.clamp(raw_P)
        if self.target_ordering_gap > 0.0:
            gap_P, gap_known_P = gap_at(eta_P)
            factor_P = (gap_P / self.target_ordering_gap).clamp(min=GAP_FACTOR_MIN)
            below_P = gap_known_P & (gap_P < self.target_ordering_gap)
            eta_P = torch.where(below_P, self.clamp(eta_P * factor_P), eta_P)
        if 0.0 < self.ema_decay < 1.0 and self.prev is not None:
            eta_P = self.clamp(self.ema_decay * self.prev + (1.0 - self.ema_decay) * eta_P)
        fallback = self.clamp(torch.tensor(self.prev if self.prev is not None else self.eta, dtype=torch.float64))
        return torch.where(known_P, eta_P, fallback), raw_P, known_P

    def clamp(self, eta_P: Tensor) -> Tensor:
        return eta_P.clamp(self.eta_min, self.eta_max)

    def metrics(self, eta: float, raw: float | None) -> dict[str, float]:
        """The dg_eta* metrics of one step, given its mean η and mean raw η (before `observe`)."""
        out = {
            "dg_eta": eta,
            "dg_eta_adaptive": float(self.adaptive),
            "dg_eta_target_neutral_frac": self.target_neutral_frac,
            "dg_eta_target_ordering_gap": self.target_ordering_gap,
            "dg_eta_min": self.eta_min,
            "dg_eta_max": self.eta_max,
            "dg_eta_ema_decay": self.ema_decay,
        }
        if raw is not None:
            out["dg_eta_raw"] = raw
        if self.prev is not None:
            out["dg_eta_prev"] = self.prev
        return out

    def observe(self, eta: float) -> None:
        """Carry the step's mean η to the next step."""
        self.prev = eta

    def state_dict(self) -> dict[str, Any]:
        return {"eta_prev": self.prev}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prev = state.get("eta_prev")
        if prev is not None and (isinstance(prev, bool) or not isinstance(prev, int | float)
                                 or not math.isfinite(prev) or prev <= 0):
            raise ValueError(f"state['eta_prev']={prev!r} must be a finite number > 0 or None")
        self.prev = None if prev is None else float(prev)
