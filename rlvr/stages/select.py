"""select: dynamic sampling's choice of groups (trainer.dynamic_sampling, rlvr/rollout/dynamic_sampling.py): off
keeps every group, filter drops the tied ones, refill samples and scores the data stream's next prompts (shaped
as the first round) until trainer.batch_size groups differ."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from rlvr.data.order import prompts_at
from rlvr.rollout.dynamic_sampling import DynamicSampling
from rlvr.stages import Stateless, StepState
from rlvr.stages.shape import OverlongShaping
from rlvr.types import Example, SamplingParams, StepBatch


class Select(Stateless):
    fields: ClassVar[tuple[str, ...]] = ("dynamic/*",)

    def __init__(self, dynamic: DynamicSampling, shaping: OverlongShaping, group_size: int,
                 sampling: SamplingParams) -> None:
        self.dynamic, self.shaping, self.group_size, self.sampling = dynamic, shaping, group_size, sampling

    def apply(self, s: StepState) -> None:
        live, step = s.live, s.step

        def more(n: int) -> tuple[StepBatch, list[Example]]:
            position = live.totals["prompts"]
            examples = prompts_at(live.c.data, step, position, n)
            live.totals["prompts"] += n
            sampled = live.rollout.sample(examples, step, position, self.group_size, self.sampling)
            return self.shaping.shape(live.rollout.finish(sampled)), examples

        pad_id = cast(Any, live.tokenizer).pad_token_id
        s.batch, s.examples, drawn = self.dynamic.collect(s.scored, s.examples, more, pad_id)
        s.fields.update(drawn)
        s.clock.lap()  # what credit measures starts here (scoring is the batch's own score_seconds)
