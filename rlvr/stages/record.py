"""record: the step's metrics row (rlvr/telemetry.py `step_row`, then the stages' fields in the order they ran),
with the running totals it adds to, written to metrics.jsonl and the run's logger."""

from __future__ import annotations

from typing import ClassVar

from rlvr.stages import Stateless, StepState
from rlvr.telemetry import step_row


class Record(Stateless):
    fields: ClassVar[tuple[str, ...]] = ("step", "condition", "reward/*", "completion/*", "totals/*", "async/*")

    def __init__(self, condition: str, uncertainty_kind: str | None) -> None:
        self.condition, self.uncertainty_kind = condition, uncertainty_kind

    def apply(self, s: StepState) -> None:
        live, batch, counts = s.live, s.scored, s.counts
        assert counts is not None and s.times is not None and s.credit is not None, "train runs first"
        for key, value in (("correct", counts.correct), ("completions", counts.completions), ("tokens", counts.tokens)):
            live.totals[key] += value
        row = step_row(s.step, self.condition, self.uncertainty_kind, batch.rollouts, batch.rewards_P_G, s.credit,
                       s.train, s.times, counts, live.totals)
        s.row = {**row, **batch.metrics, **s.fields, "train/nonfinite_skips": float(live.totals["nonfinite"])}
        if live.sampler is not None:
            s.row.update(live.sampler.meter())
        live.out.append("metrics.jsonl", s.row)
        live.c.logger.log(s.row)
