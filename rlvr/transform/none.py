"""`transform=none`: every completion token gets its completion's episode advantage.

    A_{i,t} = A_i · m_{i,t}

where m is the completion mask, so padding stays exactly 0. Given [P·G, T] token advantages (a multi-turn
episode's turns, rlvr/turn_credit/), A_{i,t} · m_{i,t}: the turn credit's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.protocols import Needs
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor


class NoTransform:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()


    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        return (adv_PG[:, None] if adv_PG.dim() == 1 else adv_PG) * signals.mask_PG_T, {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
