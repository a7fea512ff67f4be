"""`backpressure=none`: every step draws `trainer.batch_size` prompts; no `bp_*` metrics, no state.

(The predecessor's disabled `noop` controller logged constant `hold`/`warmup`/p*=1 columns; this one logs
nothing, so a run without back pressure writes exactly the rows it wrote before the option existed.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlvr.protocols import Needs


class NoBackPressure:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def batch_size(self, step: int, configured: int) -> int:
        return configured

    def observe(
        self, *, step: int, batch_size: int, group_size: int, tokens: int, seconds: float, skipped: bool
    ) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
