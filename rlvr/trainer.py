"""The RL loop. `fit` is the run: evaluate, step, checkpoint, until trainer.max_steps; `step` is one step, the
ordered stages built with the run (rlvr/stages/: collect → shape → select → credit → train → observe → record)
run over one `StepState`. The loop does not ask what they are.

A step in which no token has a non-zero advantage (and echo=on keeps no observation token) trains nothing (the
predecessor's skipped step); it still writes its metrics row, with `skipped: true`, so the reward curve has no
holes. A run that cannot learn fails instead of reporting success: `trainer.max_skipped_steps` consecutive skipped
steps, or `trainer.max_failed_steps` consecutive steps on which every item's scoring failed, checkpoint and raise
`RunFailed` naming the cause (status `failed`, exit 1). A stop signal while scoring drops the step (or evaluation)
in progress, on every rank, and checkpoints the steps done (rlvr/preemption.py), so a hung verifier never holds a
stop.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr import stages, trainer_rules
from rlvr.capture import Capture
from rlvr.checkpoint import Checkpoints, pending_file, pending_jobs, rng_state, set_rng_state
from rlvr.components import Components, Live, StepState
from rlvr.engine.sync_check import SyncCheck
from rlvr.errors import RunFailed
from rlvr.lazy import lazy_import
from rlvr.outputs import RunDir
from rlvr.preemption import Preempted, StepInterrupted, StopSignals
from rlvr.progress import Progress
from rlvr.protocols import Needs
from rlvr.resume import resume_command
from rlvr.reward.guarded import MAX_ABS
from rlvr.reward.overlong import Overlong
from rlvr.rollout import EVAL_ROWS
from rlvr.rollout import evaluate as held_out
from rlvr.rollout.dynamic_sampling import DynamicSampling
from rlvr.stages.collect import open_sampler
from rlvr.stages.record import run_summary
from rlvr.start import start
from rlvr.telemetry import Stopwatch, closing_line, console_line, eval_line
from rlvr.types import SamplingParams
from rlvr.warmup import Warmup

torch = lazy_import("torch")

log = logging.getLogger("rlvr")


@dataclass
class Trainer:
    """The `trainer` config node (conf/trainer/cpu.yaml documents each key, rlvr/trainer_rules.py checks them). The
    loop reads its steps, evaluation and checkpoint keys; the step's stages are built from the others
    (rlvr/build.py `stages`)."""

    max_steps: int
    batch_size: int  # prompts per step (back pressure may move it)
    group_size: int  # completions per prompt
    lr: float
    save_every: int
    eval_every: int
    log_every: int
    samples_per_step: int
    sampling: SamplingParams
    eval_max_tokens: int
    warmup: Warmup
    keep_last: int
    max_nonfinite_skips: int
    reward_warn_frac: float
    reward_max_abs: float = MAX_ABS  # read by the rollout's reward guard (rlvr/reward/guarded.py)
    evaluate: bool = True
    eval_samples: int = 0
    eval_temperature: float = 1.0
    final_eval_samples: int | None = None
    eval_rows: int = EVAL_ROWS
    max_skipped_steps: int = 50
    max_failed_steps: int = 5
    sync_check: SyncCheck = field(default_factory=SyncCheck)
    off_policy_steps: int = 0  # k ≥ 1: sampled ahead (rlvr/overlap.py)
    off_policy_mode: str = "fixed"
    partial_rollouts: bool = False  # sequences go on under new weights (rlvr/rollout/partial.py)
    dynamic_sampling: str = "off"
    max_sample_batches: int = 10
    overlong: Overlong = field(default_factory=Overlong)
    capture_steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dynamic = DynamicSampling(self.dynamic_sampling, self.max_sample_batches)
        self.capture = Capture(frozenset(int(s) for s in self.capture_steps))

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """What its options need of the other components, and its values' errors (rlvr/trainer_rules.py)."""
        return trainer_rules.needs(settings)

    def fit(self, c: Components, out: RunDir, resume_from: Path | None = None, stop: StopSignals | None = None):
        """The whole run (or its remainder, from the checkpoint `resume_from`); returns summary.json's data.
        Raises `Preempted` after checkpointing when `stop` was signalled."""
        t_start = time.perf_counter()
        if resume_from is None:
            out.truncate(0, keep_initial_eval=False)  # rows an earlier attempt wrote before its first checkpoint
        live = start(c, self.warmup, self.keep_last, out, stop)
        live.clock["t_start"] = t_start
        first = self._restore(live, resume_from) if resume_from else 0
        seed = c.seeds.root
        c.logger.start(f"{c.condition}_s{seed}", c.condition, [c.condition, f"seed{seed}"], out.path, c.config)
        freeze_startup_heap()
        try:
            return self._loop(live, first, resume_from, stop)
        finally:
            gc.unfreeze()
            c.logger.finish()

    def _loop(self, live: Live, first: int, resume_from: Path | None, stop: StopSignals | None):
        held = bool(live.evals) and live.evals[-1]["step"] == first  # the checkpoint's own evaluation
        if not held and (first == 0 or self.eval_every and first % self.eval_every == 0) and first < self.max_steps:
            self._evaluate_or_stop(live, first, stop)  # the run's first; or one a stop dropped, made now
        live.clock["t_rl"] = time.perf_counter()
        with self.stepping(live, first):
            self._steps(live, first, stop)
        if not live.evals or live.evals[-1]["step"] != self.max_steps:
            self._evaluate(live, self.max_steps)
        self._checkpoint(live, self.max_steps, final=True)
        elapsed = self._elapsed(live)
        summary = run_summary(live, self.max_steps, first if resume_from else None, elapsed["wall"], elapsed["rl"])
        live.out.write_json("summary.json", summary)
        log.info(closing_line(summary, live.evals, live.out.path))
        return summary

    @contextmanager
    def stepping(self, live: Live, first: int = 0) -> Iterator[Live]:
        """`live` ready for `step(live, first)`, `step(live, first + 1)`, …: the sampler the steps draw their rollouts
        from (rlvr/overlap.py) started at `first`, and closed on leaving. `fit` steps inside it; so do the benches
        that time `step` (bench/step.py, bench/episodes.py), which thus follow whatever the loop's set-up becomes."""
        live.sampler = open_sampler(live, self.batch_size, self.group_size, self.sampling, self.off_policy_steps,
                                    self.off_policy_mode, self.max_steps, first, self.partial_rollouts)
        live.sampler.start(first, live.restored_jobs)
        try:
            yield live
        finally:
            live.sampler.close()
            live.engine.sample_beside_training(False)

    def _steps(self, live: Live, first: int, stop: StopSignals | None) -> None:
        name = f"rl (continued from step {first})" if first else "rl"  # the bar's first line says where it resumed
        with Progress(name, total=self.max_steps, done=first, lines=False) as progress:
            for step in range(first, self.max_steps):
                before = dict(live.totals), rng_state()
                try:
                    s = self.step(live, step)
                except StepInterrupted:  # a stop while scoring: the step is dropped, the steps done are kept
                    live.totals.update(before[0])
                    set_rng_state(before[1])
                    raise self._stop_now(live, stop, step, f"while scoring step {step + 1} (dropped)") from None
                done = step + 1
                if s.failure is not None:
                    raise RunFailed(f"{s.failure}; up to step {done}, checkpoint in {self._checkpoint(live, done)}")
                progress.update()
                if done % self.log_every == 0 or done == self.max_steps:
                    log.info(console_line(s.row, progress.text()))
                self._after_step(live, done, stop)

    def _after_step(self, live: Live, done: int, stop: StopSignals | None) -> None:
        """The evaluation, stop and checkpoint due after `done` steps."""
        if self.eval_every and done % self.eval_every == 0 and done < self.max_steps:
            self._evaluate_or_stop(live, done, stop)
        if stop is not None and self._stopping(live, stop) and done < self.max_steps:
            saved = self._checkpoint(live, done)
            raise stop.stopped(f"after step {done}; checkpoint saved in {saved}; continue with: {resume_command()}")
        if self.save_every and done % self.save_every == 0 and done < self.max_steps:
            self._checkpoint(live, done)

    def step(self, live: Live, step: int) -> StepState:
        """One RL step: its stages in order; its row (written by the record stage) is `.row`."""
        return stages.run(live.c.stages, StepState(live, step, Stopwatch()))

    def _evaluate_or_stop(self, live: Live, steps_done: int, stop: StopSignals | None) -> None:
        """The evaluation after `steps_done` steps. A stop signal while it scores drops it: the checkpoint of the
        steps done does not hold it, so the continued run makes it first (`_loop`)."""
        before = rng_state()
        try:
            self._evaluate(live, steps_done)
        except StepInterrupted:
            set_rng_state(before)
            raise self._stop_now(live, stop, steps_done, f"while evaluating after step {steps_done} (dropped)"
                                 ) from None

    def _stop_now(self, live: Live, stop: StopSignals | None, steps_done: int, where: str) -> Preempted:
        """A stop signal interrupted scoring (on this rank or, told in the step's gather, another): every rank takes
        the signal, checkpoints the steps done and returns the Preempted to raise."""
        assert stop is not None, "only a stop signal interrupts scoring"
        self._stopping(live, stop)  # a rank the signal did not reach takes it from the one it did
        saved = self._checkpoint(live, steps_done)
        return stop.stopped(f"{where}; checkpoint of the {steps_done} steps done saved in {saved}; continue with: "
                            f"{resume_command()}")

    @staticmethod
    def _stopping(live: Live, stop: StopSignals) -> bool:
        """A stop was asked for; in a distributed run, of any rank (then every rank takes the first signal)."""
        first = next((s for s in live.c.world.gather(stop.requested) if s is not None), None)
        stop.requested = stop.requested or first
        return first is not None

    @staticmethod
    def _elapsed(live: Live) -> dict[str, float]:
        """Wall and RL seconds of the whole run so far: the earlier segments' (from the checkpoint) and this one's."""
        now, clock = time.perf_counter(), live.clock
        rl = clock["rl"] + (now - clock["t_rl"] if clock["t_rl"] is not None else 0.0)
        return {"wall": clock["wall"] + now - clock["t_start"], "rl": rl}

    def _evaluate(self, live: Live, steps_done: int) -> None:
        """Greedy (or, trainer.eval_samples ≥ 2, sampled) accuracy on the held-out set (unless
        trainer.evaluate=false); appends the evaluation row."""
        if not self.evaluate:
            return
        if live.sampler is not None:
            live.sampler.wait_idle()  # the engine's weights change: every step submitted is sampled first
        live.backend.prepare_sampling()  # on every process (backend=fsdp: a collective)
        k = self.eval_samples
        if steps_done == self.max_steps and self.final_eval_samples is not None:
            k = self.final_eval_samples
        row = held_out(live.rollout, live.engine, live.backend.policy, live.c.data, self.eval_max_tokens,
                       steps_done, k, self.eval_temperature, self.eval_rows)
        if live.sampler is not None:
            live.sampler.synced_elsewhere(steps_done)  # the evaluation synced the engine to these weights
        live.out.append("metrics.jsonl", row)
        live.c.logger.log(row)
        live.evals.append(row)
        log.info(eval_line(row))

    def _checkpoint(self, live: Live, steps_done: int, final: bool = False) -> Path:
        state: dict[str, Any] = {"step": steps_done, "max_steps": self.max_steps, "totals": live.totals,
                                 "evals": live.evals}
        for stage in live.c.stages:
            state.update(stage.state_dict())
        state["progress"] = {**state.get("progress", {}),
                             **{f"{k}_seconds": v for k, v in self._elapsed(live).items()}}
        state.update(seeds=live.c.seeds.as_dict(), config_sha256=live.c.config_sha256, config=live.c.config)

        def write(path: Path) -> None:
            live.backend.save(path)
            pending = live.sampler.pending(steps_done) if live.sampler is not None else []
            if pending:
                torch.save(pending, path / pending_file(live.c.world.rank))

        return live.checkpoints.save(steps_done, write, state, final=final)

    def _restore(self, live: Live, path: Path) -> int:
        """Continue from checkpoint `path`: weights, optimizer, counters, the stages' state, RNG; the run folder
        is cut back to what that checkpoint had seen, so no step is logged twice. Returns the next step."""
        state = Checkpoints.read_state(path)
        live.backend.load(path)
        for stage in live.c.stages:
            stage.load_state_dict(state)
        live.totals.update(state["totals"])
        live.evals[:] = state["evals"]
        progress = state.get("progress", {})
        live.clock.update(wall=progress.get("wall_seconds", 0.0), rl=progress.get("rl_seconds", 0.0))
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
        live.restored_jobs = pending_jobs(path, live.c.world)
        done = state["step"]
        live.out.truncate(done)
        log.info("resumed from %s: %d steps done, continuing to %d", path, done, self.max_steps)
        return done


def freeze_startup_heap() -> None:
    """Move the objects alive once the run is built (policy, warm-up, backend, engine, restored state) out of the
    cyclic garbage collector's sight (`gc.freeze()`, after one collection, as vLLM does once loaded): `fit` does it
    before its first step and unfreezes them when the run ends; the benches that step a trainer do it as a run
    would. They are hundreds of thousands (torch's, transformers', the model's modules) and none is garbage
    while the run lasts, yet every full pass of the collector walked them all: on a multi-turn run, whose rollout
    loop allocates enough to trigger one every few steps, that was 8 ms a step on average (env=guess in
    `python -m bench.episodes`), 0.5 ms frozen. Reference counting frees what is not cyclic either way."""
    gc.collect()
    gc.freeze()
