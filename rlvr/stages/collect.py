"""collect: the step's examples, sampled by the rollout (now, or ahead while earlier steps trained: the run's
sampler, rlvr/overlap.py) and scored."""

from __future__ import annotations

from typing import ClassVar

from rlvr.stages import Stateless, StepState


class Collect(Stateless):
    fields: ClassVar[tuple[str, ...]] = ("engine/sync_s", "engine/sync_bytes_written", "reward/*_frac", "env/*")

    def apply(self, s: StepState) -> None:
        live = s.live
        assert live.sampler is not None, "the trainer opens the sampler before the first step"
        job, synced = live.sampler.next(s.step)  # sampled now, or ahead
        examples, _ = job.work
        live.totals["prompts"] += len(examples)
        s.wait_s = s.clock.lap()
        s.prompts = len(examples)
        s.job, s.examples, s.batch = job, examples, live.rollout.finish(job.sampled)
        s.fields.update(synced)
