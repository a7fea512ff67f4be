"""`backpressure=none`: every step draws `trainer.batch_size` prompts; no `bp_*` metrics, no state.

(The predecessor's disabled `noop` controller logged constant `hold`/`warmup`/p*=1 columns; this one logs
nothing, so a run without back pressure writes exactly the rows it wrote before the option existed.)
"""

from __future__ import annotations

from typing import Any


class NoBackPressure:
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
