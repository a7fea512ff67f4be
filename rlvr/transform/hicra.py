"""`transform=hicra` (retrain's `gtpo_hicra`): GTPO, then planning-token credit raised (HICRA,
arXiv 2509.03646; docs/algorithms.md#hicra).

    A_{i,t}  = GTPO token advantage (rlvr.transform.gtpo)
    A'_{i,t} = A_{i,t} + α·|A_{i,t}|·m_{i,t}

where m is the planning-token mask (rlvr.planning). On planning tokens positive credit grows by a factor
(1 + α) and negative credit shrinks in magnitude by (1 − α): planning is rewarded more and penalised
less (retrain's own description, "pushed further in the direction of A", holds for A > 0 only). Execution tokens are
exactly GTPO's; α = 0 is GTPO. α is restricted to [0, 1] so the sign of A is never flipped (α > 1
would turn negative planning credit positive; retrain did not check). Zero advantages stay zero, so
tied groups and padding stay exactly 0; a completion without planning tokens is plain GTPO.

Knobs: `beta` (GTPO β ≥ 0, retrain default 0.1), `alpha` (α ∈ [0, 1], retrain default 0.2),
`uncertainty`. Metrics: the uncertainty stats split by the planning mask (post = pre: HICRA does not
reshape the signal) and `planning_token_fraction`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.protocols import Needs
from rlvr.transform.gtpo import check_beta, gtpo_token_advantages
from rlvr.transform.signals import as_weights, check_step, planning_mask
from rlvr.transform.uncertainty import check_uncertainty, signal_needs, token_uncertainty
from rlvr.transform.uncertainty_stats import planning_token_fraction, uncertainty_stats
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor


def hicra_token_advantages(adv_PG_T: Tensor, planning_PG_T: Tensor, alpha: float) -> Tensor:
    """A + α·|A|·m on [P·G, T] token advantages (the input itself when α = 0); m bool or 0/1 floats."""
    if alpha == 0.0:
        return adv_PG_T
    return adv_PG_T + (alpha * adv_PG_T.abs()).mul_(as_weights(planning_PG_T, adv_PG_T.dtype))


class HICRA:
    """`HICRA(beta, alpha, uncertainty)`: see the module docstring."""


    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return signal_needs(settings["uncertainty"], planning=True)

    def __init__(self, *, beta: float, alpha: float, uncertainty: str) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in [0, 1]")
        self.beta = check_beta(beta)
        self.alpha = float(alpha)
        self.uncertainty = check_uncertainty(uncertainty)

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        check_step(adv_PG, signals)
        dtype = signals.logprobs_PG_T.dtype
        mask, plan = as_weights(signals.mask_PG_T, dtype), as_weights(planning_mask(signals), dtype)
        u = token_uncertainty(self.uncertainty, signals, mask)
        adv_PG_T = hicra_token_advantages(gtpo_token_advantages(adv_PG, u, mask, self.beta), plan, self.alpha)
        metrics = uncertainty_stats(u, u, mask - plan, plan, adv_PG, signals.group_size)
        metrics["planning_token_fraction"] = planning_token_fraction(mask, plan)
        return adv_PG_T, metrics

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
