"""The RL loop. `fit` is the run; `step` is one step:

    job         = sampler.next(step)                         rlvr/overlap.py: the step's examples (rlvr/data/order.py
                                                             prompts_at) sampled now, or ahead while earlier steps
                                                             trained (trainer.off_policy_steps); rollout.sample
    batch       = rollout.finish(job.sampled)                rlvr/rollout/: scored, gathered (StepBatch)
    batch       = _collect(batch)                            overlong punishment (rlvr/reward/overlong.py); dynamic
                                                             sampling drops tied groups or refills (rlvr/rollout/
                                                             dynamic_sampling.py)
    searched    = observe(data, batch)                       data=discover: the rows join its archive (rlvr/discover/
                                                             source.py); other sources: nothing
    credit      = assign_credit(batch.rewards, token signals) rlvr/credit.py: episode (turn) → token advantages
                                                             (trainer.overlong.filter: truncated rows' set to 0)
    stats       = backend.train_step(batch.rollouts, credit.adv_PG_T, algorithm.loss)
                                                             (trainer.capture_steps: written down for `rlvr replay`,
                                                             rlvr/capture.py)
    row         = step_row(...)                              rlvr/telemetry.py: metrics.jsonl, samples/, console

The rollout is single-turn completions (data → engine → reward) or episodes (env → turns → turn signals), chosen
once at start (`make_rollout`); the step does not ask which. Evaluation is `rlvr.rollout.evaluate` over the same
rollout.

A step in which no token has a non-zero advantage (and echo=on keeps no observation token) trains nothing (the
predecessor's skipped step); it still writes its metrics row, with `skipped: true`, so the reward curve has no
holes. A run that cannot learn fails instead of reporting success: `trainer.max_skipped_steps` consecutive skipped
steps, or
`trainer.max_failed_steps` consecutive steps on which every item's scoring failed, checkpoint and raise
`RunFailed` naming the cause (status `failed`, exit 1). A stop signal while scoring drops the step (or evaluation)
in progress, on every rank, and checkpoints the steps done (rlvr/preemption.py), so a hung verifier never holds a
stop.
"""

from __future__ import annotations

import copy
import gc
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr.algorithm.kl import kl_in_reward, uses_reference
from rlvr.backpressure import BackPressure
from rlvr.capture import Capture
from rlvr.checkpoint import Checkpoints, pending_file, rng_state, set_rng_state
from rlvr.credit import assign_credit
from rlvr.data.order import prompts_at
from rlvr.discover.source import data_state, load_data_state, observe
from rlvr.distributed import World
from rlvr.engine.sync_check import SyncCheck, SyncWatch
from rlvr.errors import ConfigError, RunFailed
from rlvr.lazy import lazy_import
from rlvr.model.base_folder import save_base
from rlvr.model.prompt_encoding import eos_ids, token_pieces
from rlvr.outputs import RunDir
from rlvr.overlap import Job, SampleAhead, SampleInline
from rlvr.preemption import Preempted, StepInterrupted, StopSignals
from rlvr.progress import Progress, duration
from rlvr.protocols import (
    Algorithm,
    Backend,
    DataSource,
    Engine,
    EntropyBackend,
    Logger,
    ModelPreset,
    Needs,
    PlanningDetector,
    Reward,
    Rollout,
    Transform,
    TurnCredit,
)
from rlvr.resume import resume_command
from rlvr.reward.guarded import MAX_ABS, RewardGuard
from rlvr.reward.overlong import Overlong
from rlvr.rollout import EVAL_ROWS, Episodes, SingleTurn
from rlvr.rollout import evaluate as held_out
from rlvr.rollout.chat_turns import check_chat_turns
from rlvr.rollout.dynamic_sampling import DynamicSampling
from rlvr.seeds import Seeds
from rlvr.telemetry import (
    CORRECT_THRESHOLD,
    StepCounts,
    StepTimes,
    Stopwatch,
    closing_line,
    console_line,
    eval_line,
    sample_groups,
    step_row,
)
from rlvr.tools.render import format_mismatch
from rlvr.types import Demonstration, Example, Rollouts, Sampled, SamplingParams, StepBatch, TokenSignals, TrainBatch
from rlvr.warmup import Warmup

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.echo.echo import Echo
    from rlvr.env.guarded import GuardedEnvironment

torch = lazy_import("torch")

log = logging.getLogger("rlvr")

MAX_GAME_DEMONSTRATIONS = 50_000
"""Games an environment plays for the warm-up at most (each drawn once when steps × batch size ≤ this)."""


@dataclass
class Components:
    """What `rlvr.run` builds from the config and hands to the loop."""

    preset: ModelPreset
    data: DataSource
    reward: Reward
    algorithm: Algorithm
    transform: Transform
    planning: PlanningDetector
    logger: Logger
    backpressure: BackPressure
    """How many prompts each step draws (backpressure=none: trainer.batch_size)."""
    make_backend: Callable[..., Backend]
    make_engine: Callable[..., Engine]
    condition: str
    """The condition label, from the composed config (rlvr/labels.py: maxrl+sepa, grpo+none,loss=kl_cov); it names
    the run everywhere: metrics rows, summary.json, logger runs, `rlvr status/compare/plot`."""
    uncertainty_kind: str | None
    """The token signal the transform reads (surprisal, …), logged with every row."""
    seeds: Seeds
    config: dict
    """The composed config, resolved (stored in checkpoints: a resume compares against it)."""
    config_sha256: str
    needs: dict[str, Needs]
    """Each group's declared needs (rlvr/protocols.py), as rlvr.run checked them."""
    env: GuardedEnvironment | None = None
    """Multi-turn: the environment episodes are played in (bounded, rlvr/env/guarded.py); None: single turn."""
    turn_credit: TurnCredit | None = None
    """Multi-turn: how an episode's reward becomes token advantages (rlvr/turn_credit/)."""
    world: World = field(default_factory=World.single)
    """This process's place in the run's processes (rlvr/distributed.py); one process is a world of size 1."""
    echo: Echo | None = None
    """echo=on: the auxiliary loss on observation tokens (rlvr/echo/echo.py); None: echo=none."""

    @property
    def remote(self) -> bool:
        """The backend keeps the policy on a service (Tinker): only the tokenizer is loaded here."""
        return "remote_policy" in self.needs["backend"].provides

    @property
    def distributed(self) -> bool:
        """The backend trains over a process group (backend=fsdp), which the run joins first."""
        return "distributed" in self.needs["backend"].provides

    @property
    def wants_entropy(self) -> bool:
        """The transform reads the full-distribution entropy at each sampled token."""
        return "entropy" in self.needs["transform"].requires

    @property
    def engine_entropy(self) -> bool:
        """The engine gives those entropies while it samples; when it cannot, the backend does (`EntropyBackend`)."""
        return self.wants_entropy and "entropy" in self.needs["engine"].provides

    @property
    def wants_planning(self) -> bool:
        """The transform reads the planning-token marks."""
        return "planning_mask" in self.needs["transform"].requires


@dataclass
class Live:
    """The loop's working set once the policy is built (what `Trainer.start` returns)."""

    c: Components
    tokenizer: object
    backend: Backend
    engine: Engine
    rollout: Rollout
    """How a step's examples become scored rows (rlvr/rollout/)."""
    out: RunDir
    warmup: dict | None
    checkpoints: Checkpoints
    totals: dict = field(
        default_factory=lambda: {"correct": 0, "completions": 0, "tokens": 0, "nonfinite": 0, "prompts": 0}
    )
    """Running counters; saved in every checkpoint. `prompts`: training examples drawn so far (the position of
    the next step's first prompt in the data stream)."""
    evals: list[dict] = field(default_factory=list)
    """Every evaluation row so far; saved in every checkpoint (summary.json's initial/best read it)."""
    stop: StopSignals | None = None
    consecutive_nonfinite: int = 0
    consecutive_skipped: int = 0
    consecutive_failed: int = 0
    """Steps in a row with nothing to train / on which every item's scoring failed (saved in checkpoints)."""
    clock: dict = field(default_factory=lambda: {"wall": 0.0, "rl": 0.0, "t_start": 0.0, "t_rl": None})
    """Seconds of the run's earlier segments (a resumed run's summary covers them all) and this one's starts."""
    sampler: SampleInline | SampleAhead | None = None
    """Where each step's rollouts come from (rlvr/overlap.py), from the first RL step on."""
    sync_watch: SyncWatch | None = None
    """The sync check's reference and run of steps over it (`Trainer._check_sync`), from the first checked step."""
    restored_jobs: list[Job] = field(default_factory=list)
    """A checkpoint's steps sampled but not yet trained (trainer.off_policy_steps ≥ 1)."""


@dataclass
class Trainer:
    max_steps: int
    batch_size: int
    """Prompts per step (with back pressure on: after its warm-up sweep, until it moves it)."""
    group_size: int
    """Completions per prompt."""
    lr: float
    save_every: int
    eval_every: int
    log_every: int
    samples_per_step: int
    """Groups per step written to samples/."""
    sampling: SamplingParams
    eval_max_tokens: int
    """Evaluation decodes greedily (T=0; or samples, `eval_samples`) up to this many tokens."""
    warmup: Warmup
    keep_last: int
    """Checkpoints kept besides the final one; 0 keeps all."""
    max_nonfinite_skips: int
    """Consecutive steps with a non-finite loss or gradient (each skipped) after which the run stops."""
    reward_warn_frac: float
    """A step whose reward/timeout_frac, error_frac or parse_fail_frac exceeds this logs a warning."""
    reward_max_abs: float = MAX_ABS
    """A reward that is not a finite number within ±this scores 0.0 and counts in reward/error_frac, the reward
    named in the warning (rlvr/reward/guarded.py; the rollout reads it from the run's config, `make_rollout`)."""
    evaluate: bool = True
    """Evaluate on the held-out set at the start, every `eval_every` steps and at the end; false: never (no
    evaluation rows; summary.json's eval_accuracy_* are null)."""
    eval_samples: int = 0
    """k ≥ 2: each evaluation samples k rows of every held-out example at `eval_temperature` and adds eval/avg@k,
    eval/pass@j and eval/maj@k (rlvr/rollout/sampled_eval.py); 0 or 1: greedy (T=0), one row each."""
    eval_temperature: float = 1.0
    """The sampling temperature of a sampled evaluation (eval_samples ≥ 2; top_p 1); unused when greedy."""
    final_eval_samples: int | None = None
    """k of the evaluation after the last step (pass@256 at the end, pass@16 along the way); null: eval_samples."""
    eval_rows: int = EVAL_ROWS
    """Rows sampled at once in an evaluation, each part reduced to its metrics before the next
    (rlvr/rollout/evaluate.py): memory holds eval_rows rows, not examples × k."""
    max_skipped_steps: int = 50
    """Consecutive steps with nothing to train (every group's rewards tied, …) after which the run fails; 0 = never."""
    max_failed_steps: int = 5
    """Consecutive steps on which every item's scoring (or episode) failed, after which the run fails; 0 = never."""
    sync_check: SyncCheck = field(default_factory=SyncCheck)
    """On every on-policy step: does the engine sample from the trainer's weights? (rlvr/engine/sync_check.py)"""
    off_policy_steps: int = 0
    """k: step n samples from the weights after n − k updates, in a sampler thread while earlier steps train
    (rlvr/overlap.py); 0 = the synchronous loop."""
    off_policy_mode: str = "fixed"
    """fixed: exactly k behind, repeatable bit for bit; bounded: the newest weights the engine has, at most k
    behind, never waiting for a sync (not repeatable)."""
    dynamic_sampling: str = "off"
    """What a step does with groups whose rewards all tie: off (train them: they add nothing), filter (drop them),
    refill (DAPO: sample more prompts until batch_size groups differ); rlvr/rollout/dynamic_sampling.py."""
    max_sample_batches: int = 10
    """refill: rounds of sampling a step may take, its first included."""
    overlong: Overlong = field(default_factory=Overlong)
    """DAPO's soft overlong punishment and overlong filtering (rlvr/reward/overlong.py); off by default."""
    capture_steps: list[int] = field(default_factory=list)
    """Steps (0-based, as metrics.jsonl's `step`) whose optimizer update is written to captures/step_<N>/ for
    `rlvr replay` (rlvr/capture.py); empty: none."""

    def __post_init__(self) -> None:
        self.dynamic = DynamicSampling(self.dynamic_sampling, self.max_sample_batches)
        self.capture = Capture(frozenset(int(s) for s in self.capture_steps))

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        """The loop's options that act only with another component, or not beside one (rlvr/config_check.py
        `unmet_needs` names what to change)."""
        requires, excludes = {}, {}
        if (steps := settings["warmup"]["steps"]) > 0:
            requires["local_policy"] = f"trainer.warmup.steps={steps}: the SFT warm-up trains it here"
        if capture := settings.get("capture_steps"):
            requires["capture"] = f"trainer.capture_steps={list(capture)} writes down the updates of those steps"
        overlong = settings.get("overlong") or {}
        single = [f"trainer.dynamic_sampling={settings.get('dynamic_sampling', 'off')}"] if settings.get(
            "dynamic_sampling", "off") != "off" else []
        single += [f"trainer.overlong.{k}={overlong[k]}" for k in ("buffer_frac", "filter") if overlong.get(k)]
        if single:
            excludes["episodes"] = (f"{', '.join(single)} read(s) single-turn completions (a group's rewards, a "
                                    "completion's length and EOS): with an env leave trainer.dynamic_sampling=off "
                                    "and trainer.overlong off")
        ahead = settings.get("off_policy_steps", 0)
        if isinstance(ahead, int) and ahead > 0:
            requires["decoupled_pi_old"] = f"trainer.off_policy_steps={ahead} trains on rollouts sampled {ahead} " \
                                           "update(s) behind"
        return Needs(provides=frozenset({"sampled_ahead"}) if isinstance(ahead, int) and ahead > 0 else frozenset(),
                     requires=requires, excludes=excludes)

    def fit(self, c: Components, out: RunDir, resume_from: Path | None = None, stop: StopSignals | None = None):
        """The whole run (or its remainder, from the checkpoint `resume_from`); returns summary.json's data.
        Raises `Preempted` after checkpointing when `stop` was signalled."""
        t_start = time.perf_counter()
        if resume_from is None:
            out.truncate(0, keep_initial_eval=False)  # rows an earlier attempt wrote before its first checkpoint
        live = self.start(c, out, stop)
        live.clock["t_start"] = t_start
        first = self._restore(live, resume_from) if resume_from else 0
        seed = c.seeds.root
        c.logger.start(f"{c.condition}_s{seed}", c.condition, [c.condition, f"seed{seed}"], out.path,
                       c.config)
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
        summary = self._summary(live, first if resume_from else None, elapsed["wall"], elapsed["rl"])
        live.out.write_json("summary.json", summary)
        log.info(closing_line(summary, live.evals, live.out.path))
        return summary

    @contextmanager
    def stepping(self, live: Live, first: int = 0) -> Iterator[Live]:
        """`live` ready for `step(live, first)`, `step(live, first + 1)`, …: the sampler the steps draw their rollouts
        from (rlvr/overlap.py) started at `first`, and closed on leaving. `fit` steps inside it; so do the benches
        that time `step` (bench/step.py, bench/episodes.py), which thus follow whatever the loop's set-up becomes."""
        live.sampler = self._sampler(live, first)
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
                    row = self.step(live, step)
                except StepInterrupted:  # a stop while scoring: the step is dropped, the steps done are kept
                    live.totals.update(before[0])
                    set_rng_state(before[1])
                    raise self._stop_now(live, stop, step, f"while scoring step {step + 1} (dropped)") from None
                self._emit(live, row)
                self._fail_if_cannot_learn(live, step, row)
                progress.update()
                done = step + 1
                if done % self.log_every == 0 or done == self.max_steps:
                    log.info(console_line(row, progress.text()))
                if self.eval_every and done % self.eval_every == 0 and done < self.max_steps:
                    self._evaluate_or_stop(live, done, stop)
                if stop is not None and self._stopping(live, stop) and done < self.max_steps:
                    saved = self._checkpoint(live, done)
                    raise stop.stopped(f"after step {done}; checkpoint saved in {saved}; continue with: "
                                       f"{resume_command()}")
                if self.save_every and done % self.save_every == 0 and done < self.max_steps:
                    self._checkpoint(live, done)

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

    def _fail_if_cannot_learn(self, live: Live, step: int, row: dict) -> None:
        """Count the steps in a row with nothing to train and those on which every item's scoring failed; past
        their limits, checkpoint and fail the run, naming the cause."""
        failed = any(row.get(f"{p}/error_frac", 0.0) + row.get(f"{p}/timeout_frac", 0.0) >= 1.0
                     for p in ("reward", "env"))  # single turn: the verifier; episodes: the environment
        live.consecutive_failed = live.consecutive_failed + 1 if failed else 0
        live.consecutive_skipped = live.consecutive_skipped + 1 if row.get("skipped") else 0
        cause = None
        if self.max_failed_steps and live.consecutive_failed >= self.max_failed_steps:
            cause = (f"every item's scoring failed (errors or timeouts) on {live.consecutive_failed} consecutive steps "
                     f"(trainer.max_failed_steps={self.max_failed_steps}): the verifier cannot score this run's "
                     "completions; check it (train.log names its first error of each step)")
        elif self.max_skipped_steps and live.consecutive_skipped >= self.max_skipped_steps:
            cause = (f"nothing to train on {live.consecutive_skipped} consecutive steps "
                     f"(trainer.max_skipped_steps={self.max_skipped_steps}): {row['skip_cause']}")
        if cause is not None:
            saved = self._checkpoint(live, step + 1)
            raise RunFailed(f"{cause}; up to step {step + 1}, checkpoint in {saved}")

    def _summary(self, live: Live, resumed_from: int | None, wall_seconds: float, rl_seconds: float) -> dict:
        """summary.json's data (the times cover every segment of a resumed run)."""
        accuracy = [e["eval/accuracy"] for e in live.evals] or [None]  # trainer.evaluate=false: none
        return {
            "condition": live.c.condition,
            "steps": self.max_steps,
            "resumed_from_step": resumed_from,
            "eval_accuracy_initial": accuracy[0],
            "eval_accuracy_final": accuracy[-1],
            "eval_accuracy_best": None if accuracy == [None] else max(accuracy),
            "wall_seconds": wall_seconds,
            "rl_seconds": rl_seconds,
            "tokens_per_second": live.totals["tokens"] / rl_seconds if rl_seconds > 0 else 0.0,
            "running_correct_rate": live.totals["correct"] / max(live.totals["completions"], 1),
            "trainable_parameters": live.backend.trainable_parameters,
            "seeds": live.c.seeds.as_dict(),
            "torch_threads": torch.get_num_threads(),
            "warmup": live.warmup,
        }

    def start(self, c: Components, out: RunDir, stop: StopSignals | None = None) -> Live:
        """Load the policy, run (or load) the warm-up, build backend and engine around it."""
        for name, value in c.seeds.as_dict().items():
            log.info("seed %-8s %d", name, value)
        if c.remote:  # the policy lives on a service: no weights here, no warm-up (refused at config time)
            log.info("loading the tokenizer of <%s>; the policy stays on the service", type(c.preset).__name__)
            tokenizer, stops = c.preset.load_tokenizer()
            self._check_chat_turns(c, tokenizer, stops)
            backend, warmup = c.make_backend(lora=c.preset.lora, lora_seed=c.seeds.lora), None
            engine = c.make_engine(policy=backend.policy, eos_ids=stops, pad_id=tokenizer.pad_token_id)
        else:
            module, tokenizer, _, warmup = self.warmed_up(c, out, stop)
            if out.writes:
                save_base(out.path / "base", module, tokenizer, c.preset, warmup["key"] if warmup else None)
            backend, engine = local_policy(c, module, tokenizer, reference=uses_reference(c.algorithm.loss))
        engine.connect()
        log.info("condition %s | %d trainable parameters", c.condition, backend.trainable_parameters)
        return Live(c, tokenizer, backend, engine, make_rollout(c, engine, tokenizer, stop), out, warmup,
                    Checkpoints(out.path / "checkpoints", self.keep_last, c.world), stop=stop)

    def warmed_up(self, c: Components, out: RunDir, stop: StopSignals | None = None
                  ) -> tuple[Any, Any, list[int], dict | None]:
        """(module, tokenizer, EOS ids, warm-up info): the local policy RL starts from, loaded and warmed up (or its
        warm-up loaded from the cache), before any backend wraps it. `start` builds the backend and engine around
        it; bench/step.py hands the same module to TRL."""
        log.info("loading policy <%s>", type(c.preset).__name__)
        module, tokenizer = c.preset.load(c.seeds.init)
        stops = eos_ids(tokenizer, module.generation_config.eos_token_id)
        self._check_chat_turns(c, tokenizer, stops)
        return module, tokenizer, stops, self._warm_up(c, module, tokenizer, out, stop)

    @staticmethod
    def _check_chat_turns(c: Components, tokenizer, stops: list[int]) -> None:
        """Multi-turn episodes append each observation as the chat template's ids for it (rlvr/rollout/chat_turns.py):
        a template that cannot is refused here, before the warm-up and any training; one that rewrites earlier turns
        is said once, its episodes' rows being split where it does (rlvr/rollout/template_rewrites.py)."""
        if c.env is not None and getattr(tokenizer, "chat_template", None):
            rewrites = check_chat_turns(tokenizer, c.preset.name, stops)
            if rewrites is not None:
                log.info("%s; an episode's row is split there, each part trained after the prompt its actions were "
                         "sampled from", rewrites)
            call_format = getattr(c.env.env, "call_format", None)  # env.tools: rlvr/tools/harness.py, in the guard
            mismatch = call_format and c.env.tool_schemas and format_mismatch(tokenizer, c.env.tool_schemas,
                                                                              call_format)
            if mismatch:
                log.warning("%s (model %s)", mismatch, c.preset.name)

    def _restore(self, live: Live, path: Path) -> int:
        """Continue from checkpoint `path`: weights, optimizer, counters, controller, RNG; the run folder
        is cut back to what that checkpoint had seen, so no step is logged twice. Returns the next step."""
        state = Checkpoints.read_state(path)
        live.backend.load(path)
        live.c.transform.load_state_dict(state["transform"])
        live.c.backpressure.load_state_dict(state.get("backpressure", {}))
        if live.c.turn_credit is not None:
            live.c.turn_credit.load_state_dict(state["turn_credit"])
        load_data_state(live.c.data, state.get("data", {}))
        live.totals.update(state["totals"])
        live.evals[:] = state["evals"]
        progress = state.get("progress", {})  # absent in checkpoints written before it was saved
        live.consecutive_skipped = progress.get("consecutive_skipped", 0)
        live.consecutive_failed = progress.get("consecutive_failed", 0)
        live.clock.update(wall=progress.get("wall_seconds", 0.0), rl=progress.get("rl_seconds", 0.0))
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
        live.restored_jobs = self._pending(live, path)
        done = state["step"]
        live.out.truncate(done)
        log.info("resumed from %s: %d steps done, continuing to %d", path, done, self.max_steps)
        return done

    @staticmethod
    def _pending(live: Live, path: Path) -> list[Job]:
        """The checkpoint's steps this rank sampled ahead and had not trained; their shares are per rank, so a
        checkpoint that holds some continues only on as many processes as wrote it."""
        world, written = live.c.world, len(list(path.glob("pending*.pt")))
        if not written:
            return []
        if written != world.size:
            raise ConfigError(f"{path} holds steps sampled ahead of training by {written} process(es), each its "
                              f"share; continue it on {written} (this run has {world.size})")
        return torch.load(path / pending_file(world.rank), weights_only=False)

    def _warm_up(self, c: Components, module, tokenizer, out: RunDir, stop: StopSignals | None) -> dict | None:
        if self.warmup.steps <= 0:
            return None
        demos = self._demonstrations(c)
        key = self.warmup.cache_key(c.preset, c.seeds.init, demos)
        log.info("SFT warm-up: %d steps on %d demonstrations (cache key %s)", self.warmup.steps, len(demos), key)
        plan = stop.plan if stop is not None else ""
        if stop is not None:
            stop.plan = ("stopping the SFT warm-up: nothing is saved before the RL steps start, and the warm-up "
                         "starts over when the run continues")
        with Progress("warm-up", total=self.warmup.steps) as progress:

            def on_step(r: dict) -> None:
                out.append("warmup.jsonl", r)
                progress.update(1 if "loss" in r else self.warmup.steps - progress.done)
                if stop is not None and stop.requested and "loss" in r and r["step"] + 1 < self.warmup.steps:
                    raise stop.stopped(f"during the SFT warm-up (step {r['step'] + 1} of {self.warmup.steps}); "
                                       "nothing was saved: the warm-up starts over when the run continues")

            try:
                info = self.warmup.run(module, tokenizer, demos, c.seeds.init, key, on_step, out.path / "base")
            finally:
                if stop is not None:
                    stop.plan = plan
        log.info("warm-up %s", f"loaded from {info['loaded_from']}" if info["loaded_from"] else
                 f"done in {duration(info['seconds'])}, final loss {info['final_loss']:.4f}")
        return info

    def _demonstrations(self, c: Components) -> list[Demonstration]:
        """The warm-up's demonstrations: the environment's games when it plays some (`env=guess`: one per
        warm-up example drawn), else the data source's."""
        games = c.env.demonstrations if c.env is not None else None
        if games is None:
            return c.data.demonstrations()
        count = min(self.warmup.steps * self.warmup.batch_size, MAX_GAME_DEMONSTRATIONS)
        return [Demonstration(g[0], g[1], tuple(g[2:])) for g in games(count, c.seeds.init)]

    def _check_sync(self, live: Live, step: int, version: int, train: Mapping[str, Any]) -> dict[str, float]:
        """The sync check on a step sampled at its own `version` (on-policy) whose backend compared the engine's
        log-probabilities of its sampled tokens with its own (`mismatch/abs_log_ratio`): the row's `engine/sync_*`,
        or StaleEngineError (rlvr/engine/sync_check.py)."""
        delta = train.get("mismatch/abs_log_ratio")
        if version != step or delta is None:
            return {}
        if live.sync_watch is None:
            live.sync_watch = SyncWatch(self.sync_check, type(live.engine).__name__)
        return live.sync_watch.observe(step, delta)

    def step(self, live: Live, step: int) -> dict:
        """One RL step; returns its metrics row (the caller writes it)."""
        c, G = live.c, self.group_size
        clock = Stopwatch()
        job, synced = cast(SampleInline | SampleAhead, live.sampler).next(step)  # sampled now, or ahead
        examples, _ = job.work
        P = len(examples)
        live.totals["prompts"] += P
        wait_s = clock.lap()
        batch, examples, drawn = self._collect(live, step, live.rollout.finish(job.sampled), examples)
        searched = observe(c.data, batch, live.out)
        clock.lap()
        self._warn_on_failures(step, batch)
        signals, pieces_PG = self._signals(live, step, batch.rollouts, batch.rewards_P_G)
        rewards_P_G, kl_ref = kl_in_reward(c.algorithm.loss, live.backend, batch.rollouts, batch.rewards_P_G)
        credit = assign_credit(rewards_P_G, signals, c.algorithm, c.transform, c.turn_credit, batch.turns)
        credit, filtered = self.overlong.mask(credit, batch.rollouts)
        echo: dict[str, Any] = {}
        if c.echo is not None:  # its targets, kept before the skip rule: a step of tied groups still trains them
            echo_PG_T, echo = c.echo.plan(batch.rollouts)
            credit = replace(credit, echo_PG_T=echo_PG_T)
        credit_s = clock.lap() + batch.credit_seconds
        train: dict[str, Any] = {}
        if not credit.skipped:
            live.engine.sleep()  # sampling is over until the next sync: a sleeping vLLM gives the trainer its memory
            train = self.capture.train_step(  # the backend's train_step, written down at a captured step
                live, step, TrainBatch(batch.rollouts, credit.adv_PG_T, credit.echo_PG_T), c.algorithm.loss, self.lr)
        train = {**echo, **train}
        # The step's time getting its rollouts: syncs and sampling (k ≥ 1: syncs and waiting for the sampler), less
        # what an episode's environment and branch probes took, counted as scoring and credit (refill: plus its
        # later rounds' sampling)
        elsewhere = 0.0 if self.off_policy_steps else job.sampled.seconds - batch.sample_seconds
        times = StepTimes(wait_s - elsewhere, batch.score_seconds, credit_s, clock.lap())
        self._guard_nonfinite(live, step, train)
        live.out.write_samples(step, sample_groups(examples[: self.samples_per_step], batch.completions,
                                                   batch.rewards_P_G, credit, signals, pieces_PG, batch.played))
        counts = StepCounts.of(batch.rollouts, batch.rewards_P_G)
        for key, value in (("correct", counts.correct), ("completions", counts.completions), ("tokens", counts.tokens)):
            live.totals[key] += value
        row = step_row(step, c.condition, c.uncertainty_kind, batch.rollouts, batch.rewards_P_G, credit, train, times,
                       counts, live.totals) | synced | self._check_sync(live, step, job.version, train)
        pressure = c.backpressure.observe(  # its decision applies from the next step
            step=step, batch_size=P, group_size=G, tokens=counts.tokens, seconds=times.total, skipped=credit.skipped,
        )
        skip = {"skip_cause": skip_cause(batch.rewards_P_G)} if credit.skipped else {}
        return {**row, **batch.metrics, **drawn, **searched, **filtered, **skip, **kl_ref, "train/nonfinite_skips":
                float(live.totals["nonfinite"]), **pressure, **cast(SampleInline | SampleAhead, live.sampler).meter()}

    def _collect(self, live: Live, step: int, batch: StepBatch, examples: list[Example]
                 ) -> tuple[StepBatch, list[Example], dict[str, float]]:
        """The step's batch as it trains: the overlong punishment on its rewards, then dynamic sampling's choice of
        groups (refill: further rounds of the data stream's next prompts, sampled and scored here); its examples;
        the `overlong/*` and `dynamic/*` row fields."""

        def more(n: int) -> tuple[StepBatch, list[Example]]:
            position = live.totals["prompts"]
            more_examples = prompts_at(live.c.data, step, position, n)
            live.totals["prompts"] += n
            sampled = live.rollout.sample(more_examples, step, position, self.group_size, self.sampling)
            return self.overlong.punish(live.rollout.finish(sampled), self.sampling.max_tokens), more_examples

        batch = self.overlong.punish(batch, self.sampling.max_tokens)
        pad_id = cast(Any, live.tokenizer).pad_token_id
        batch, examples, drawn = self.dynamic.collect(batch, examples, more, pad_id)
        return batch, examples, {**self.overlong.fields(batch.rollouts, self.sampling.max_tokens), **drawn}

    def _signals(self, live: Live, step: int, rollouts: Rollouts, rewards_P_G: Tensor):
        """What the transform may read (planning marks only when it needs them; entropies from the backend's no-grad
        pass when the engine gives none, rlvr/backend/local.py `entropies`), and the token pieces they were read from
        (None without them)."""
        c = live.c
        pieces_PG = token_pieces(live.tokenizer, rollouts) if c.wants_planning else None
        entropy_PG_T = rollouts.entropy_PG_T
        if c.wants_entropy and entropy_PG_T is None:
            entropy_PG_T = cast(EntropyBackend, live.backend).entropies(rollouts)
        signals = TokenSignals(
            logprobs_PG_T=rollouts.logprobs_PG_T, mask_PG_T=rollouts.action_mask_PG_T, group_size=self.group_size,
            step=step, correct_rate=float((rewards_P_G > CORRECT_THRESHOLD).float().mean()),
            entropy_PG_T=entropy_PG_T,
            planning_PG_T=None if pieces_PG is None else c.planning.mask(pieces_PG, rollouts.mask_PG_T.shape[1]),
        )
        return signals, pieces_PG

    def _warn_on_failures(self, step: int, batch: StepBatch) -> None:
        """A warning when a failure fraction (reward/timeout_frac, env/error_frac, …) exceeds reward_warn_frac:
        those completions or episodes scored 0.0; the batch says where to look."""
        over = {k: v for k, v in batch.failures.items() if v > self.reward_warn_frac}
        if over:
            log.warning(
                "step %d: %s above trainer.reward_warn_frac=%g: those %s scored 0.0, so the rewards (and the "
                "advantages) are wrong; check %s",
                step, ", ".join(f"{k}={v:.2f}" for k, v in over.items()), self.reward_warn_frac, batch.what,
                batch.check,
            )

    def _guard_nonfinite(self, live: Live, step: int, train: dict) -> None:
        """A step the backend did not apply is counted (`train/nonfinite_skips`): its loss or gradient norm was not
        finite (skipped), or its update made a trainable weight non-finite (rolled back, rlvr/backend/local.py
        `Undo`); `max_nonfinite_skips` in a row stop the run, on the last good step's weights."""
        if not train.get("train/nonfinite_skip"):
            live.consecutive_nonfinite = 0
            return
        live.totals["nonfinite"] += 1
        live.consecutive_nonfinite += 1
        if train.get("train/nonfinite_weights"):
            log.warning("step %d: the update made a trainable weight non-finite (loss %s, grad norm %s): rolled back "
                        "to the step's starting weights and optimizer state", step, train["loss"], train["grad_norm"])
        else:
            log.warning("step %d: loss %s, grad norm %s: optimizer step skipped", step, train["loss"],
                        train["grad_norm"])
        if live.consecutive_nonfinite >= self.max_nonfinite_skips:
            raise FloatingPointError(
                f"{live.consecutive_nonfinite} consecutive steps (up to step {step}) had a non-finite loss, "
                f"gradient or updated weights (trainer.max_nonfinite_skips={self.max_nonfinite_skips}); the weights "
                "are those of the last good step. Lower trainer.lr, set backend.grad_clip_norm, or check the model's "
                "dtype (AdamW in float16 divides by its eps, 0 in float16)."
            )

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
        self._emit(live, row)
        live.evals.append(row)
        log.info(eval_line(row))

    @staticmethod
    def _emit(live: Live, row: dict) -> None:
        live.out.append("metrics.jsonl", row)
        live.c.logger.log(row)

    def _checkpoint(self, live: Live, steps_done: int, final: bool = False) -> Path:
        state = {
            "step": steps_done,
            "max_steps": self.max_steps,
            "totals": live.totals,
            "evals": live.evals,
            "transform": live.c.transform.state_dict(),
            "backpressure": live.c.backpressure.state_dict(),
            "turn_credit": live.c.turn_credit.state_dict() if live.c.turn_credit is not None else {},
            "data": data_state(live.c.data),
            "progress": {"consecutive_skipped": live.consecutive_skipped, "consecutive_failed": live.consecutive_failed,
                         **{f"{k}_seconds": v for k, v in self._elapsed(live).items()}},
            "seeds": live.c.seeds.as_dict(),
            "config_sha256": live.c.config_sha256,
            "config": live.c.config,
        }

        def write(path: Path) -> None:
            live.backend.save(path)
            pending = live.sampler.pending(steps_done) if live.sampler is not None else []
            if pending:
                torch.save(pending, path / pending_file(live.c.world.rank))

        return live.checkpoints.save(steps_done, write, state, final=final)

    def _sampler(self, live: Live, first: int) -> SampleInline | SampleAhead:
        """Steps sampled in the step (k = 0) or ahead of it in a sampler thread (rlvr/overlap.py)."""
        c, base = live.c, live.totals["prompts"]

        def work(step: int) -> tuple[list[Example], int]:  # the step's examples, drawn in the main thread
            P = c.backpressure.batch_size(step, self.batch_size)  # fixed under k ≥ 1 (refused otherwise at start)
            position = base + (step - first) * P if self.off_policy_steps else live.totals["prompts"]
            return prompts_at(c.data, step, position, P), position

        def sample(job: Job) -> Sampled:
            examples, position = job.work
            return live.rollout.sample(examples, job.step, position, self.group_size, self.sampling)

        def sync(step: int) -> dict:
            live.backend.prepare_sampling()  # on every process (backend=fsdp: a collective)
            synced = time.perf_counter()
            written = live.engine.sync(live.backend.policy)
            synced = time.perf_counter() - synced
            return {"engine/sync_s": synced, "engine/sync_bytes_written": written}

        if not self.off_policy_steps:
            return SampleInline(work, sample, sync)
        live.engine.sample_beside_training(True)
        return SampleAhead(self.off_policy_steps, self.off_policy_mode, self.max_steps, work, sample, sync,
                           everywhere=lambda holds: all(c.world.gather(holds)))


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


def local_policy(c: Components, module, tokenizer, reference: bool = False) -> tuple[Backend, Engine]:
    """The backend around `module` (LoRA attached, or all weights trained) and the engine that samples from it, not
    yet connected: the trainer's, and the checkpoint commands' (rlvr/cli/from_checkpoint.py), built alike. With
    `reference` (algorithm.kl.coef > 0, the trainer's only) a full fine-tuning backend keeps a frozen copy of `module`,
    the base, as the reference (rlvr/algorithm/kl.py)."""
    own = sampling_copy(c, module)
    backend = c.make_backend(model=module, lora=c.preset.lora, lora_seed=c.seeds.lora, pad_id=tokenizer.pad_token_id,
                             **({"reference": True} if reference else {}))
    backend.prepare_sampling()  # on every process (backend=fsdp: a collective)
    stops = eos_ids(tokenizer, module.generation_config.eos_token_id)
    if own is not None:
        own.to(next(backend.policy.parameters()).device)
    return backend, c.make_engine(module=own if own is not None else backend.policy, eos_ids=stops,
                                  pad_id=tokenizer.pad_token_id)


def sampling_copy(c: Components, module) -> Any:
    """engine=pytorch sampling ahead of training (trainer.off_policy_steps ≥ 1) samples while the trainer changes
    its module: it gets a copy of its own, made here before the backend wraps the module (FSDP's cannot be copied)
    and adapted alike (the same LoRA draw; the global RNG ends as after one); its `sync` copies the trained weights
    in. None otherwise."""
    from rlvr.backend.local import prepare
    from rlvr.engine.pytorch import PyTorchEngine

    engine = (c.config.get("engine") or {}).get("_target_")
    if not c.config["trainer"].get("off_policy_steps") or engine != f"{PyTorchEngine.__module__}.PyTorchEngine":
        return None
    return prepare(copy.deepcopy(module), c.preset.lora, c.seeds.lora, gradient_checkpointing=False)


def make_rollout(c: Components, engine: Engine, tokenizer, stop: StopSignals | None = None) -> Rollout:
    """How a run's steps (and evaluations) are collected: single-turn completions, or episodes of its environment
    (the trainer's, and `rlvr eval`'s on a checkpoint)."""
    if c.env is None:
        return SingleTurn(engine, tokenizer, c.reward, RewardGuard.of(c.config), c.seeds, c.world, c.engine_entropy,
                          stop.interruptible if stop is not None else nullcontext)
    branching = c.turn_credit.branching if c.turn_credit is not None else None
    return Episodes(engine, tokenizer, c.env, c.seeds, c.world, c.engine_entropy, branching)


def skip_cause(rewards_P_G: Tensor) -> str:
    """Why a step had nothing to train, in words: its groups' rewards tied (at which values), or the credit
    gave no token a non-zero advantage."""
    tied = bool((rewards_P_G == rewards_P_G[:, :1]).all())
    if not tied:
        return "the rewards differed within some group, but the credit gave no token a non-zero advantage"
    values = sorted({round(float(v), 6) for v in rewards_P_G[:, 0]})
    if values == [0.0]:
        return ("every completion scored 0.0: the policy solves none of the prompts it draws (an easier task, a "
                "warm-up with trainer.warmup.steps, a larger trainer.group_size, or a check of the reward)")
    if len(values) == 1:
        return f"every completion scored {values[0]:g}: nothing left to tell apart (a harder task?)"
    return (f"every group's completions scored alike (rewards {', '.join(f'{v:g}' for v in values[:5])} by group): "
            "sampling gives no variety (trainer.sampling.temperature, top_p) or the reward is too coarse")
