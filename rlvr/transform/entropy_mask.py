"""`transform=entropy_mask`: GTPO, then only each group's most uncertain tokens keep credit
(docs/algorithms.md#entropy_mask).

retrain's "Yue et al. replication" of the high-entropy-minority rule (train on the top ρ fraction of
tokens by uncertainty; "Beyond the 80/20 Rule", arXiv 2506.01939, keeps the top 20 %):

    A_{i,t}  = GTPO token advantage (rlvr.transform.gtpo)
    per prompt group g, over the uncertainties u of all real tokens of its G completions (n of them,
    taken before any reshaping; u is already clipped at 50 where the signal is):
        threshold_g = −inf                                   if ρ ≥ 1
                    = 0.0                                    if n = 0
                    = sorted_descending(u)[max(1, ⌊n·ρ⌋) − 1]  otherwise
    A'_{i,t} = A_{i,t} if u_{i,t} ≥ threshold_g else 0

Ties at the threshold are all kept, so slightly more than ⌊n·ρ⌋ tokens may keep credit. ρ = 0 disables
the mask (plain GTPO, no mask metrics), as in retrain. The threshold is per prompt group, not per batch.

Knobs: `beta` (GTPO β ≥ 0), `rho` (ρ ∈ [0, 1]; retrain's global default 0.0 made this mode equal to
gtpo, the YAML states 0.2), `uncertainty`. Metrics: the uncertainty stats (every token exec) plus
`entropy_mask_threshold` and `entropy_mask_fraction` (masked tokens / tokens of the group), each the
mean over the groups that carry signal (a non-zero episode advantage; see
rlvr.transform.uncertainty_stats for why that set). ρ ≥ 1 reports a threshold of −inf, as retrain did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.transform.gtpo import check_beta, gtpo_token_advantages
from rlvr.transform.signals import as_weights, check_step
from rlvr.transform.uncertainty import check_uncertainty, signal_needs, token_uncertainty
from rlvr.transform.uncertainty_stats import groups_with_signal, uncertainty_stats
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


def group_thresholds(u_PG_T: Tensor, mask_PG_T: Tensor, group_size: int, rho: float) -> Tensor:
    """[P] keep-thresholds of the module docstring (ρ > 0)."""
    num_groups = u_PG_T.shape[0] // group_size
    if rho >= 1.0:
        return torch.full((num_groups,), -math.inf, dtype=u_PG_T.dtype, device=u_PG_T.device)
    sel = mask_PG_T.reshape(num_groups, -1)
    ranked = torch.where(sel, u_PG_T.reshape(num_groups, -1), -math.inf).sort(-1, descending=True).values
    n_P = sel.sum(-1)
    k_P = (n_P.to(torch.float64) * rho).floor().long().clamp(min=1)
    threshold_P = ranked.gather(-1, (k_P - 1).clamp(max=ranked.shape[-1] - 1)[:, None])[:, 0]
    return torch.where(n_P > 0, threshold_P, 0.0)


class EntropyMask:
    """`EntropyMask(beta, rho, uncertainty)`: see the module docstring."""


    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return signal_needs(settings["uncertainty"], planning=False)

    def __init__(self, *, beta: float, rho: float, uncertainty: str) -> None:
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"rho={rho} must be in [0, 1]")
        self.beta = check_beta(beta)
        self.rho = float(rho)
        self.uncertainty = check_uncertainty(uncertainty)

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        check_step(adv_PG, signals)
        mask, group_size = signals.mask_PG_T, signals.group_size
        weights = as_weights(mask, signals.logprobs_PG_T.dtype)
        u = token_uncertainty(self.uncertainty, signals, weights)
        adv_PG_T = gtpo_token_advantages(adv_PG, u, weights, self.beta)
        metrics = uncertainty_stats(u, u, weights, None, adv_PG, group_size)
        if self.rho <= 0.0:
            return adv_PG_T, metrics
        threshold_P = group_thresholds(u, mask, group_size, self.rho)
        keep_PG_T = u >= threshold_P.repeat_interleave(group_size)[:, None]
        adv_PG_T = torch.where(keep_PG_T, adv_PG_T, 0.0)
        num_groups = threshold_P.numel()
        masked_P = (mask & ~keep_PG_T).reshape(num_groups, -1).sum(-1).to(torch.float64)
        fraction_P = masked_P / mask.reshape(num_groups, -1).sum(-1).clamp(min=1)
        counted_P = groups_with_signal(adv_PG, group_size)
        if bool(counted_P.any()):
            metrics["entropy_mask_threshold"] = float(threshold_P[counted_P].mean())
            metrics["entropy_mask_fraction"] = float(fraction_P[counted_P].mean())
        return adv_PG_T, metrics

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
