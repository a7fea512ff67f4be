"""Back pressure: how many prompts each RL step draws (the `backpressure` config group).

`backpressure=none` (the default) keeps `trainer.batch_size` for every step and logs nothing;
`backpressure=usl` sweeps batch sizes, fits the Universal Scalability Law to the measured throughput and
moves the batch size toward the fitted knee (rlvr/backpressure/usl.py).

The trainer asks `batch_size(step, configured)` before a step and reports the finished step to
`observe(...)`; a decision made there applies from the next step. The state survives a resume
(`state_dict` goes into each checkpoint's trainer_state.json, next to the transform's).
"""

from __future__ import annotations

from typing import Any, Protocol


class BackPressure(Protocol):
    def batch_size(self, step: int, configured: int) -> int:
        """Prompts for step `step`; `configured` is `trainer.batch_size`."""
        ...

    def observe(
        self, *, step: int, batch_size: int, group_size: int, tokens: int, seconds: float, skipped: bool
    ) -> dict[str, Any]:
        """Take the measurement of finished step `step` (`tokens` prompt + completion tokens in `seconds`;
        `skipped`: it trained nothing) and return its `bp_*` metrics ({} when off)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to decide as the uninterrupted one would (JSON-serialisable)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
