"""The policy loss every algorithm trains with (docs/algorithms.md#policy-loss).

Per completion token t with advantage A ≠ 0:

    δ = log π_θ(t) − log π_old(t),   r = exp(δ)
    clip_eps = 0:   ℓ = −r·A                                   (importance-sampled REINFORCE)
    clip_eps > 0:   ℓ = −min(r·A, clip(r, 1−ε, 1+ε_high)·A)    (PPO clip; ε_high = clip_eps_high or ε)

    loss = Σ ℓ / (number of tokens with A ≠ 0 in the whole step)

i.e. one token-level mean over the step (DAPO-style): long completions carry proportionally more weight,
and micro-batching changes memory, not the objective. Tokens whose advantage is exactly 0 are left out of
both the sum and the count. Both log-probabilities are of the temperature-scaled distribution the
sampler drew from (see rlvr/types.py Rollouts), so an on-policy step has r = 1 and the gradient is
REINFORCE's. There is no KL term.

`adv_clip_max` > 0 caps non-zero token advantages to [−cap, cap] before the loss (not ratio clipping;
docs/algorithms.md#advantage-cap). Metrics: adv_cap_fraction (capped / non-zero), adv_cap_magnitude
(mean |a| of the capped values before the clamp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")


@dataclass(frozen=True)
class PolicyLoss:
    clip_eps: float
    clip_eps_high: float
    adv_clip_max: float

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        if settings["clip_eps"] > 0:
            return Needs(requires={"ratio_clipping": f"algorithm.loss.clip_eps={settings['clip_eps']}"})
        return Needs()

    def __post_init__(self) -> None:
        if self.clip_eps < 0 or self.clip_eps_high < 0 or self.adv_clip_max < 0:
            raise ValueError(
                f"algorithm.loss: clip_eps={self.clip_eps}, clip_eps_high={self.clip_eps_high} and "
                f"adv_clip_max={self.adv_clip_max} must all be >= 0"
            )
        if self.clip_eps_high > 0 and self.clip_eps == 0:
            raise ValueError(f"algorithm.loss.clip_eps_high={self.clip_eps_high} needs algorithm.loss.clip_eps > 0")

    def cap(self, adv_PG_T: Tensor) -> tuple[Tensor, dict[str, float]]:
        if self.adv_clip_max <= 0:
            return adv_PG_T, {}
        nonzero = adv_PG_T != 0
        capped = nonzero & (adv_PG_T.abs() > self.adv_clip_max)
        n_nonzero, n_capped = int(nonzero.sum()), int(capped.sum())
        metrics = {
            "adv_cap_fraction": n_capped / n_nonzero if n_nonzero else 0.0,
            "adv_cap_magnitude": float(adv_PG_T[capped].abs().mean()) if n_capped else 0.0,
        }
        return adv_PG_T.clamp(-self.adv_clip_max, self.adv_clip_max), metrics

    def token_losses(self, new_lp: Tensor, old_lp: Tensor, adv: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token loss ℓ and a bool 'this token was clipped' (all False without clipping)."""
        ratio = torch.exp(new_lp - old_lp)
        if self.clip_eps == 0:
            return -ratio * adv, torch.zeros_like(adv, dtype=torch.bool)
        hi = self.clip_eps_high or self.clip_eps
        clipped_ratio = ratio.clamp(1 - self.clip_eps, 1 + hi)
        loss = -torch.minimum(ratio * adv, clipped_ratio * adv)
        return loss, (ratio < 1 - self.clip_eps) | (ratio > 1 + hi)
