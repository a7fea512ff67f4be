"""Where a step's rollouts come from: sampled in the step (synchronous) or ahead of it, in a sampler thread, while
the trainer trains (`trainer.off_policy_steps: k` ≥ 1).

Versions. The policy's version is the number of optimizer updates it has had. A synchronous step n samples from
version n. With k ≥ 1, step n samples from version n − k (0 for the first k steps): its staleness is k, and
sampling for steps n + 1 … n + k runs while step n trains. The trainer drives the sampler from its main thread at
the start of each step n, holding version n:

    job = take(n)                            wait for step n's sampled share (the trainer idles while it waits)
    fixed:    stage(n)                       version n's weights copied now, loaded by the sampler thread after the
                                             jobs submitted before it (an engine that cannot stage: wait_idle();
                                             sync(n), the engine's weights become version n at once)
              submit(n + k, version n)       exactly k behind, whatever the timing: repeatable bit for bit
    bounded:  if the sampler is idle (on every rank): sync(n)
              submit every step up to n + k that the engine's version keeps within k

The engine's weights change between jobs only: in the main thread while the sampler thread is idle (`sync`), or,
staged, in the sampler thread itself, in the queue's order (`stage`: the main thread copies version n's weights,
and the sampler thread loads the copy once the jobs submitted before it are sampled). Either way a job is sampled
from exactly the version it was submitted with, and the sampler thread touches nothing but the engine
(`Rollout.sample`, a staged load). Staging is what lets k ≥ 2 overlap more than k = 1: with `sync`, the trainer
would wait at step n for jobs n + 1 … n + k − 1 before the engine could take version n, and only job n + k would
sample while step n trains; staged, every submitted job samples while the trainer trains (engines that provide
`staged_sync`: engine=pytorch, engine=vllm, engine=tinker, and engine=openai under LoRA).

Scoring and gathering stay in the main thread (`Rollout.finish`): verifiers may need it (math-verify's signal
timeouts, a stop signal interrupting a hung verifier) and a gather is a collective.

`bounded` (prime-rl's and SkyRL's bound on staleness) differs in one thing: it never waits for the sampler to
sync. A step is sampled from the newest version the engine had when it was submitted, never more than k behind;
the versions then depend on timing, so a bounded run is not repeatable bit for bit. A step is never submitted
beyond the bound, so no sampled group is ever too stale to train: none is dropped (`async/dropped_groups` stays
0; trainers that sample ahead without that check drop or resample at training time instead).

Checkpoints. The jobs sampled but not yet trained (steps n … n + k − 1 after n steps, and step n + k once
submitted) are checkpoint state (`pending`): a continued run trains them as the uninterrupted run would have.

Nothing here imports torch: tests/test_overlap.py drives it with a simulated trainer that sleeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODES = ("fixed", "bounded")


@dataclass
class Job:
    """One step's rollouts as this process samples them."""

    step: int
    version: int
    """The policy version the engine held while sampling it (optimizer updates done)."""
    work: Any
    """What sampling needs (the trainer's: the step's examples and data position)."""
    sampled: Any = None
    """`sample(job)`'s result once done (a `Sampled`)."""
    error: BaseException | None = None
    done: bool = False
    partial: Any = None
    """Partial rollouts (rlvr/rollout/partial.py `Partial`): the groups the step trains, its row fields and the pool
    left in flight; None otherwise (the work's examples are the step's)."""


class SampleInline:
    """The synchronous loop (k = 0): step n syncs version n and samples, in the step."""

    def __init__(self, work: Callable[[int], Any], sample: Callable[[Job], Any], sync: Callable[[int], dict]) -> None:
        self.work, self.sample, self.sync = work, sample, sync

    def start(self, first: int, restored: list[Job]) -> None:
        pass

    def next(self, step: int) -> tuple[Job, dict]:
        fields = self.sync(step)
        job = Job(step, step, self.work(step))
        job.sampled, job.done = self.sample(job), True
        return job, fields

    def wait_idle(self) -> None:
        pass

    def synced_elsewhere(self, version: int) -> None:
        pass

    def meter(self) -> dict[str, float]:
        return {}  # the synchronous loop's rows are as before: no async/* fields

    def pending(self, steps_done: int) -> list[Job]:
        return []

    def close(self) -> None:
        pass


class SampleAhead:
    """k ≥ 1: one sampler thread works through submitted steps in order (module docstring)."""

    def __init__(self, k: int, mode: str, max_steps: int, work: Callable[[int], Any], sample: Callable[[Job], Any],
                 sync: Callable[[int], dict], clock: Callable[[], float] = time.perf_counter,
                 everywhere: Callable[[bool], bool] = lambda holds: holds,
                 stage: Callable[[int], tuple[Callable[[], None], dict] | None] | None = None) -> None:
        """`everywhere(holds)`: whether `holds` is true on every process of the run (a collective under
        backend=fsdp, where a sync is one too: `bounded` syncs only when every rank's sampler is idle).
        `stage(version)`: `sync(version)` in two halves (None: the engine cannot stage), the first now, in the main
        thread, returning the second (`load()`, called in the sampler thread) and the row fields; or None, when it
        cannot stage these weights: then `sync`."""
        if k < 1 or mode not in MODES:
            raise ValueError(f"SampleAhead needs k >= 1 and a mode in {MODES}, not k={k}, mode={mode!r}")
        self.k, self.mode, self.max_steps = k, mode, max_steps
        self.work, self.sample, self.sync, self.clock, self.everywhere = work, sample, sync, clock, everywhere
        self.stage = stage
        self.jobs: dict[int, Job] = {}
        """Submitted jobs by step, kept until their step is trained (an interrupted step stays pending)."""
        self.queue: list[Job | Callable[[], None]] = []
        """What the sampler thread does next, in order: jobs, and staged loads."""
        self.load_error: BaseException | None = None
        """A staged load that failed (raised in the main thread with the jobs' errors)."""
        self.last = -1
        """The last step submitted."""
        self.engine_version = -1
        """The version the engine holds (the last `sync`)."""
        self.busy = False
        self.closed = False
        self.cv = threading.Condition()
        self.idle_s = 0.0
        self.idle_since: float | None = clock()
        self.waited_s = 0.0
        self.metered_at = clock()
        self.fields: dict = {}
        """Row fields of syncs made outside `next` (`start`'s), for the next step's row."""
        self.thread = threading.Thread(target=self._run, name="rlvr-sampler", daemon=True)
        self.thread.start()

    # The main thread's side.

    def start(self, first: int, restored: list[Job]) -> None:
        """Before step `first`, holding version `first`: the checkpoint's pending jobs, and steps first … first +
        k − 1 that it lacks (a fresh run: all of them, from version 0 = max(0, step − k)) sampled from now."""
        with self.cv:
            for job in restored:
                self.jobs[job.step] = job
                self.last = max(self.last, job.step)
        self.last = max(self.last, first - 1)
        missing = [s for s in range(first, min(first + self.k, self.max_steps)) if s not in self.jobs]
        if missing:
            self.fields = self._sync(first)
            for step in missing:
                self._submit(step, first)

    def next(self, step: int) -> tuple[Job, dict]:
        """Step `step`'s job, once sampled, and the row fields of what was done meanwhile (syncs, async/*)."""
        fields, self.fields = self.fields, {}
        with self.cv:
            for done in [s for s in self.jobs if s < step]:
                del self.jobs[done]
        if step not in self.jobs:  # bounded: the bound kept it back until now
            self.wait_idle()
            fields |= self._sync(step)
            self._submit(step, step)
        job = self._take(step)
        if self.mode == "fixed":
            if step + self.k < self.max_steps:  # also when a checkpoint held step + k: its rows are the same then
                fields |= self._stage(step)
        elif self.everywhere(self.idle()):
            fields |= self._sync(step)
        while self.last + 1 < self.max_steps and self.last + 1 - self.engine_version <= self.k:
            self._submit(self.last + 1, self.engine_version)
        staleness = step - job.version
        return job, fields | {"async/staleness_mean": float(staleness), "async/staleness_max": float(staleness),
                              "async/dropped_groups": 0.0, "async/policy_version": float(job.version)}

    def meter(self) -> dict[str, float]:
        """The shares of the wall time since the last call that the trainer spent waiting for the sampler, and
        that the sampler spent with nothing to sample."""
        with self.cv:
            now = self.clock()
            idle = self.idle_s + (now - self.idle_since if self.idle_since is not None else 0.0)
            if self.idle_since is not None:
                self.idle_since = now
            wall = max(now - self.metered_at, 1e-9)
            waited, self.idle_s, self.waited_s, self.metered_at = self.waited_s, 0.0, 0.0, now
        return {"async/trainer_idle_frac": min(waited / wall, 1.0), "async/sampler_idle_frac": min(idle / wall, 1.0)}

    def idle(self) -> bool:
        with self.cv:
            return not self.queue and not self.busy

    def wait_idle(self) -> None:
        """Wait until every submitted job is sampled and every staged load done (before the engine's weights change
        in the main thread, an evaluation, a checkpoint)."""
        start = self.clock()
        with self.cv:
            self.cv.wait_for(lambda: not self.queue and not self.busy)
            self.waited_s += self.clock() - start
            self._raise(list(self.jobs.values()))

    def synced_elsewhere(self, version: int) -> None:
        """The engine was synced to `version` outside the sampler, while it was idle (an evaluation): later jobs
        are sampled from that version."""
        self.engine_version = version

    def pending(self, steps_done: int) -> list[Job]:
        """The jobs of steps not yet trained, all sampled (a checkpoint's state)."""
        self.wait_idle()
        with self.cv:
            return [self.jobs[s] for s in sorted(self.jobs) if s >= steps_done]

    def close(self) -> None:
        """Stop the sampler thread once its job in progress is done."""
        with self.cv:
            self.closed = True
            self.queue.clear()
            self.cv.notify_all()
        self.thread.join()

    def _sync(self, version: int) -> dict:
        fields = self.sync(version)
        self.engine_version = version
        return fields

    def _stage(self, version: int) -> dict:
        """`stage(version)`, or, where the engine cannot, `sync(version)` once the sampler is idle."""
        staged = self.stage(version) if self.stage is not None else None
        if staged is None:
            self.wait_idle()
            return self._sync(version)
        load, fields = staged
        with self.cv:
            self.queue.append(load)
            self.cv.notify_all()
        self.engine_version = version
        return fields

    def _submit(self, step: int, version: int) -> None:
        job = Job(step, version, self.work(step))
        with self.cv:
            self.jobs[step] = job
            self.queue.append(job)
            self.last = step
            self.cv.notify_all()

    def _take(self, step: int) -> Job:
        start = self.clock()
        with self.cv:
            job = self.jobs[step]
            self.cv.wait_for(lambda: job.done)
            self.waited_s += self.clock() - start
            self._raise([job])
        return job

    def _raise(self, jobs: list[Job]) -> None:
        if self.load_error is not None:
            raise RuntimeError(f"loading staged weights into the engine failed: {self.load_error!r}"
                               ) from self.load_error
        failed = next((j for j in jobs if j.error is not None), None)
        if failed is not None:
            raise RuntimeError(f"sampling step {failed.step} ahead of training failed: {failed.error!r}"
                               ) from failed.error

    # The sampler thread.

    def _run(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.queue or self.closed)
                if self.closed:
                    return
                item = self.queue.pop(0)
                self.busy = True
                now = self.clock()
                self.idle_s += now - (self.idle_since if self.idle_since is not None else now)
                self.idle_since = None
            sampled, error = None, None
            try:
                if isinstance(item, Job):
                    sampled = self.sample(item)
                else:
                    item()  # a staged load
            except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
                error = err
            with self.cv:
                if isinstance(item, Job):
                    item.sampled, item.error, item.done = sampled, error, True
                elif error is not None:
                    self.load_error = error
                    for job in self.queue:  # sampled from the wrong weights otherwise: never sampled
                        if isinstance(job, Job):
                            job.error, job.done = error, True
                    self.queue.clear()
                self.busy = False
                if not self.queue:
                    self.idle_since = self.clock()
                self.cv.notify_all()
