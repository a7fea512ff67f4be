"""collect: the step's examples, sampled by the rollout (now, or ahead while earlier steps trained: the run's
sampler, rlvr/overlap.py) and scored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, cast

from rlvr.components import Live
from rlvr.data.order import prompts_at
from rlvr.overlap import Job, SampleAhead, SampleInline
from rlvr.protocols import StagesSync
from rlvr.rollout.partial import Admission, PartialRollouts, SingleTurnParts
from rlvr.stages import Stateless, StepState
from rlvr.types import Example, Sampled, SamplingParams


class Collect(Stateless):
    fields: ClassVar[tuple[str, ...]] = ("engine/sync_s", "engine/sync_bytes_written", "reward/timeout_frac",
                                         "reward/error_frac", "reward/parse_fail_frac", "env/*")
    """The sync's, and the rollout's own (a single turn's scoring failures, an episode's `env/*`)."""

    def apply(self, s: StepState) -> None:
        live = s.live
        assert live.sampler is not None, "the trainer opens the sampler before the first step"
        job, synced = live.sampler.next(s.step)  # sampled now, or ahead
        examples, partial = job.partial.gathered(live.c.world, s.step) if job.partial is not None else (job.work[0], {})
        live.totals["prompts"] += len(examples)
        s.wait_s = s.clock.lap()
        s.prompts = len(examples)
        s.job, s.examples, s.batch = job, examples, live.rollout.finish(job.sampled)
        s.fields.update(synced | partial)


def open_sampler(live: Live, batch_size: int, group_size: int, sampling: SamplingParams, ahead: int, mode: str,
                 max_steps: int, first: int, partial: bool = False) -> SampleInline | SampleAhead:
    """A run's steps sampled in the step (`ahead` = trainer.off_policy_steps = 0) or ahead of it in a sampler
    thread, from step `first` on: each step's examples drawn from the data stream (in the main thread) at its
    position, sampled by the run's rollout, the engine synced to the trainer's weights before. `partial`
    (trainer.partial_rollouts): the groups of `ahead` steps in flight, sampled one step ahead
    (rlvr/rollout/partial.py)."""
    c, base = live.c, live.totals["prompts"]

    def work(step: int) -> tuple[list[Example], int]:
        P = c.backpressure.batch_size(step, batch_size)  # fixed under k ≥ 1 (refused otherwise at start)
        position = base + (step - first) * P if ahead else live.totals["prompts"]
        return prompts_at(c.data, step, position, P), position

    def sample(job: Job) -> Sampled:
        examples, position = job.work
        return live.rollout.sample(examples, job.step, position, group_size, sampling)

    def sync(step: int) -> dict:
        live.backend.prepare_sampling()  # on every process (backend=fsdp: a collective)
        synced = time.perf_counter()
        written = live.engine.sync(live.backend.policy)
        synced = time.perf_counter() - synced
        return {"engine/sync_s": synced, "engine/sync_bytes_written": written}

    def stage(step: int) -> tuple[Callable[[], None], dict] | None:
        """`sync` in two halves (rlvr/overlap.py): the copy now (its time is the row's `engine/sync_s`), the load
        in the sampler thread; None where the engine cannot stage these weights."""
        live.backend.prepare_sampling()
        staged = time.perf_counter()
        weights = cast(StagesSync, live.engine).stage(live.backend.policy)
        staged = time.perf_counter() - staged
        if weights is None:
            return None
        return weights.load, {"engine/sync_s": staged, "engine/sync_bytes_written": weights.bytes_written}

    if not ahead:
        return SampleInline(work, sample, sync)
    live.engine.sample_beside_training(True)
    def everywhere(holds: bool) -> bool:
        return all(c.world.gather(holds))

    staging = stage if "staged_sync" in c.needs["engine"].provides else None
    if not partial:
        return SampleAhead(ahead, mode, max_steps, work, sample, sync, everywhere=everywhere, stage=staging)
    pool = PartialRollouts(cast(SingleTurnParts, live.rollout), batch_size, group_size, sampling, ahead,
                           PartialRollouts.resumed(live.restored_jobs), first)

    def batch(i: int) -> tuple[list[Example], int]:
        position = base + (i - first) * batch_size
        return prompts_at(c.data, i, position, batch_size), position

    def admit(step: int) -> Admission:
        return pool.admissions(step, max_steps, batch)

    return SampleAhead(1, mode, max_steps, admit, pool.sample, sync, everywhere=everywhere, stage=staging)
