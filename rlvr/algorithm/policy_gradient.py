"""What every algorithm shares: the policy loss it trains with (`algorithm.loss`, rlvr/algorithm/loss.py) and the
regularisers that loss reads by interpolation; each algorithm adds its own knobs and `advantages`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from rlvr.algorithm.kl import ReferenceKL
from rlvr.algorithm.loss import PolicyLoss
from rlvr.protocols import Needs


@dataclass(frozen=True)
class PolicyGradient:
    loss: PolicyLoss
    _: KW_ONLY
    kl: ReferenceKL | None = None
    """`algorithm.kl`: the loss's (algorithm.loss.kl interpolates it; rlvr/algorithm/kl.py)."""
    entropy_coef: float = 0.0
    """`algorithm.entropy_coef`: the loss's (algorithm.loss.entropy_coef interpolates it)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return PolicyLoss.needs(settings["loss"])
