"""The RL loop. `fit` is the run; `step` is one step, in the order of DESIGN.md:

    prompts_P   = data.batch(step)
    rollouts_PG = engine.sample(prompts_P, n=G)
    rewards_P_G = reward.score(rollouts_PG, references)
    adv_P_G     = algorithm.advantages(rewards_P_G)     (uniform groups → 0: they leave the loss)
    adv_PG_T    = transform(adv_P_G, token signals)   → algorithm.normalize → loss.cap
    stats       = backend.train_step(rollouts_PG, adv_PG_T, algorithm.loss)

A step in which no token has a non-zero advantage trains nothing (the predecessor's skipped step); it
still writes its metrics row, with `skipped: true`, so the reward curve has no holes.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from rlvr.algorithm.ties import tie_metrics, uniform_groups
from rlvr.backpressure import BackPressure
from rlvr.checkpoint import Checkpoints, set_rng_state
from rlvr.errors import ConfigError
from rlvr.model.prompt_encoding import encode_prompts, eos_ids
from rlvr.outputs import RunDir
from rlvr.preemption import Preempted, StopSignals
from rlvr.protocols import (
    Algorithm,
    Backend,
    DataSource,
    Engine,
    Logger,
    ModelPreset,
    PlanningDetector,
    Reward,
    Transform,
)
from rlvr.seeds import Seeds, sub_seed
from rlvr.types import Example, Rollouts, SamplingParams, Scores, TokenSignals, TrainBatch
from rlvr.warmup import Warmup

log = logging.getLogger("rlvr")

CORRECT_THRESHOLD = 0.5


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
    """`<algorithm>+<transform>`, from the modules their `_target_`s name."""
    condition_name: str
    """The `condition=` choice when one was made (maxrl_gtpo_sepa), else `condition`; names logger runs."""
    uncertainty_kind: str | None
    """The token signal the transform reads (surprisal, …), logged with every row."""
    seeds: Seeds
    config: dict
    """The composed config, resolved (stored in checkpoints: a resume compares against it)."""
    config_sha256: str
    remote: bool = False
    """The backend keeps the policy on a service (Tinker): only the tokenizer is loaded here."""


@dataclass
class Live:
    """The loop's working set once the policy is built (what `Trainer.start` returns)."""

    c: Components
    tokenizer: object
    backend: Backend
    engine: Engine
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
    consecutive_nonfinite: int = 0


@dataclass(frozen=True)
class Credit:
    """One step's credit assignment, kept together for training, logging and samples."""

    adv_P_G: Tensor
    batch: TrainBatch
    signals: TokenSignals
    pieces_PG: list[list[str]] | None
    metrics: dict

    @property
    def skipped(self) -> bool:
        """No token has a non-zero advantage: nothing to train on."""
        return not bool((self.batch.adv_PG_T != 0).any())


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
    """Evaluation decodes greedily (T=0) up to this many tokens."""
    warmup: Warmup
    keep_last: int
    """Checkpoints kept besides the final one; 0 keeps all."""
    max_nonfinite_skips: int
    """Consecutive steps with a non-finite loss or gradient (each skipped) after which the run stops."""
    reward_warn_frac: float
    """A step whose reward/timeout_frac, error_frac or parse_fail_frac exceeds this logs a warning."""

    def fit(self, c: Components, out: RunDir, resume_from: Path | None = None, stop: StopSignals | None = None):
        """The whole run (or its remainder, from the checkpoint `resume_from`); returns summary.json's data.
        Raises `Preempted` after checkpointing when `stop` was signalled."""
        t_start = time.perf_counter()
        if resume_from is None:
            out.truncate(0, keep_initial_eval=False)  # rows an earlier attempt wrote before its first checkpoint
        live = self.start(c, out)
        first = self._restore(live, resume_from) if resume_from else 0
        seed = c.seeds.root
        c.logger.start(f"{c.condition_name}_s{seed}", c.condition_name, [c.condition_name, f"seed{seed}"], out.path,
                       c.config)
        try:
            return self._loop(live, first, resume_from, stop, t_start)
        finally:
            c.logger.finish()

    def _loop(self, live: Live, first: int, resume_from: Path | None, stop: StopSignals | None, t_start: float):
        c, out = live.c, live.out
        if not resume_from:
            self.evaluate(live, 0)
        t_rl = time.perf_counter()
        bar = tqdm(range(first, self.max_steps), desc="rl", unit="step", leave=False, disable=None)  # no bar off a TTY
        with logging_redirect_tqdm(), bar:
            for step in bar:
                row = self.step(live, step)
                self._emit(live, row)
                done = step + 1
                if self.eval_every and done % self.eval_every == 0 and done < self.max_steps:
                    self.evaluate(live, done)
                if done % self.log_every == 0 or done == self.max_steps:
                    log.info(_console_line(row, live.evals[-1] if live.evals[-1]["step"] == done else None))
                if stop is not None and stop.requested and done < self.max_steps:
                    self._checkpoint(live, done)
                    raise Preempted(f"stopped by signal {stop.requested} after step {done}; checkpoint saved")
                if self.save_every and done % self.save_every == 0 and done < self.max_steps:
                    self._checkpoint(live, done)
        rl_seconds = time.perf_counter() - t_rl
        if live.evals[-1]["step"] != self.max_steps:
            self.evaluate(live, self.max_steps)
            log.info("eval after step %d: accuracy %.3f", self.max_steps, live.evals[-1]["eval/accuracy"])
        self._checkpoint(live, self.max_steps, final=True)
        accuracy = [e["eval/accuracy"] for e in live.evals]
        summary = {
            "condition": c.condition,
            "steps": self.max_steps,
            "resumed_from_step": first if resume_from else None,
            "eval_accuracy_initial": accuracy[0],
            "eval_accuracy_final": accuracy[-1],
            "eval_accuracy_best": max(accuracy),
            "wall_seconds": time.perf_counter() - t_start,
            "rl_seconds": rl_seconds,
            "tokens_per_second": live.totals["tokens"] / rl_seconds if rl_seconds > 0 else 0.0,
            "running_correct_rate": live.totals["correct"] / max(live.totals["completions"], 1),
            "trainable_parameters": live.backend.trainable_parameters,
            "seeds": c.seeds.as_dict(),
            "warmup": live.warmup,
        }
        out.write_json("summary.json", summary)
        return summary

    def start(self, c: Components, out: RunDir) -> Live:
        """Load the policy, run (or load) the warm-up, build backend and engine around it."""
        for name, value in c.seeds.as_dict().items():
            log.info("seed %-8s %d", name, value)
        if c.remote:  # the policy lives on a service: no weights here, no warm-up (refused at config time)
            log.info("loading the tokenizer of <%s>; the policy stays on the service", type(c.preset).__name__)
            tokenizer, eos = c.preset.load_tokenizer()
            backend, warmup = c.make_backend(lora=c.preset.lora, lora_seed=c.seeds.lora), None
            engine = c.make_engine(policy=backend.policy, eos_ids=eos, pad_id=tokenizer.pad_token_id)
        else:
            log.info("loading policy <%s>", type(c.preset).__name__)
            module, tokenizer = c.preset.load(c.seeds.init)
            warmup = self._warm_up(c, module, tokenizer, out)
            backend = c.make_backend(
                model=module, lora=c.preset.lora, lora_seed=c.seeds.lora, pad_id=tokenizer.pad_token_id
            )
            engine = c.make_engine(
                module=backend.policy,
                eos_ids=eos_ids(tokenizer, backend.policy.generation_config.eos_token_id),
                pad_id=tokenizer.pad_token_id,
            )
        engine.connect()
        log.info("condition %s | %d trainable parameters", c.condition, backend.trainable_parameters)
        return Live(c, tokenizer, backend, engine, out, warmup, Checkpoints(out.path / "checkpoints", self.keep_last))

    def _restore(self, live: Live, path: Path) -> int:
        """Continue from checkpoint `path`: weights, optimizer, counters, controller, RNG; the run folder
        is cut back to what that checkpoint had seen, so no step is logged twice. Returns the next step."""
        state = Checkpoints.read_state(path)
        live.backend.load(path)
        live.c.transform.load_state_dict(state["transform"])
        live.c.backpressure.load_state_dict(state.get("backpressure", {}))
        live.totals.update(state["totals"])
        live.evals[:] = state["evals"]
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
        done = state["step"]
        live.out.truncate(done)
        log.info("resumed from %s: %d steps done, continuing to %d", path, done, self.max_steps)
        return done

    def _warm_up(self, c: Components, module, tokenizer, out: RunDir) -> dict | None:
        if self.warmup.steps <= 0:
            return None
        demos = c.data.demonstrations()
        key = self.warmup.cache_key(c.preset, c.seeds.init, demos)
        log.info("SFT warm-up: %d steps on %d demonstrations (cache key %s)", self.warmup.steps, len(demos), key)
        bar = tqdm(total=self.warmup.steps, desc="warm-up", unit="step", leave=False, disable=None)
        with logging_redirect_tqdm(), bar:

            def row(r: dict) -> None:
                out.append("warmup.jsonl", r)
                bar.update(1 if "loss" in r else self.warmup.steps)
                if "loss" in r and (r["step"] + 1) % 100 == 0:
                    log.info("warm-up step %d | loss %.4f", r["step"] + 1, r["loss"])

            info = self.warmup.run(module, tokenizer, demos, c.seeds.init, key, row)
        done = f"loaded from {info['cache_entry']}" if info["cached"] else f"took {info['seconds']:.1f} s"
        log.info("warm-up %s", done)
        return info

    def step(self, live: Live, step: int) -> dict:
        """One RL step; returns its metrics row (the caller writes it)."""
        c, G = live.c, self.group_size
        P = c.backpressure.batch_size(step, self.batch_size)
        clock = [time.perf_counter()]
        examples = prompts_at(c.data, step, live.totals["prompts"], P)
        live.totals["prompts"] += P
        prompt_ids_P = encode_prompts(live.tokenizer, [e.prompt for e in examples])
        live.engine.sync(live.backend.policy)
        rollouts = live.engine.sample(
            prompt_ids_P, G, self.sampling, seed=sub_seed(c.seeds.sampler, f"step/{step}"),
            with_entropy=c.transform.needs_entropy,
        )
        clock.append(time.perf_counter())
        completions = decode_completions(live.tokenizer, rollouts)
        references = [e.reference for e in examples for _ in range(G)]
        scores = guarded_score(c.reward, completions, references)
        self._warn_on_failures(step, scores)
        rewards_P_G = torch.tensor(scores.values, dtype=torch.float32).view(P, G)
        clock.append(time.perf_counter())
        credit = self._credit(live, step, rollouts, rewards_P_G)
        clock.append(time.perf_counter())
        train = {} if credit.skipped else live.backend.train_step(credit.batch, c.algorithm.loss, self.lr)
        clock.append(time.perf_counter())
        self._guard_nonfinite(live, step, train)
        live.out.write_samples(step, self._samples(examples, completions, rewards_P_G, credit))
        row = self._row(live, step, rollouts, rewards_P_G, credit, train, clock)
        pressure = c.backpressure.observe(  # its decision applies from the next step
            step=step, batch_size=P, group_size=G, tokens=row["tokens_per_step"], seconds=row["step_time_s"],
            skipped=credit.skipped,
        )
        return {**row, **scores.fractions("reward/"), "train/nonfinite_skips": float(live.totals["nonfinite"]),
                **pressure}

    def _warn_on_failures(self, step: int, scores: Scores) -> None:
        over = {k: v for k, v in scores.fractions("reward/").items() if v > self.reward_warn_frac}
        if over:
            log.warning(
                "step %d: %s above trainer.reward_warn_frac=%g: those completions scored 0.0, so the rewards "
                "(and the advantages) are wrong; check the verifier, its timeouts and the answer format",
                step, ", ".join(f"{k}={v:.2f}" for k, v in over.items()), self.reward_warn_frac,
            )

    def _guard_nonfinite(self, live: Live, step: int, train: dict) -> None:
        if not train.get("train/nonfinite_skip"):
            live.consecutive_nonfinite = 0
            return
        live.totals["nonfinite"] += 1
        live.consecutive_nonfinite += 1
        log.warning("step %d: loss %s, grad norm %s: optimizer step skipped", step, train["loss"], train["grad_norm"])
        if live.consecutive_nonfinite >= self.max_nonfinite_skips:
            raise FloatingPointError(
                f"{live.consecutive_nonfinite} consecutive steps (up to step {step}) had a non-finite loss or "
                f"gradient (trainer.max_nonfinite_skips={self.max_nonfinite_skips}); the weights are those of the "
                "last good step. Lower trainer.lr, set backend.grad_clip_norm, or check the model's dtype."
            )

    def _credit(self, live: Live, step: int, rollouts: Rollouts, rewards_P_G: Tensor) -> Credit:
        """Rewards → episode advantages (uniform groups zeroed) → token advantages → batch pass → cap."""
        c = live.c
        adv_P_G = c.algorithm.advantages(rewards_P_G).masked_fill(uniform_groups(rewards_P_G)[:, None], 0.0)
        pieces_PG = token_pieces(live.tokenizer, rollouts) if c.transform.needs_planning else None
        signals = TokenSignals(
            logprobs_PG_T=rollouts.logprobs_PG_T, mask_PG_T=rollouts.mask_PG_T, group_size=self.group_size,
            step=step, correct_rate=float((rewards_P_G > CORRECT_THRESHOLD).float().mean()),
            entropy_PG_T=rollouts.entropy_PG_T,
            planning_PG_T=None if pieces_PG is None else c.planning.mask(pieces_PG, rollouts.mask_PG_T.shape[1]),
        )
        adv_PG_T, transform_metrics = c.transform(adv_P_G.flatten(), signals)
        adv_PG_T, norm_metrics = c.algorithm.normalize(adv_PG_T, rollouts.mask_PG_T)
        adv_PG_T, cap_metrics = c.algorithm.loss.cap(adv_PG_T)
        metrics = {**transform_metrics, **norm_metrics, **cap_metrics}
        return Credit(adv_P_G, TrainBatch(rollouts, adv_PG_T), signals, pieces_PG, metrics)

    def _row(self, live: Live, step: int, rollouts: Rollouts, rewards_P_G: Tensor, credit: Credit, train: dict,
             clock: list[float]) -> dict:
        c, (P, G) = live.c, rewards_P_G.shape
        lengths = rollouts.lengths_PG
        tokens = sum(len(p) for p in rollouts.prompt_ids_P) * G + int(lengths.sum())
        correct = int((rewards_P_G > CORRECT_THRESHOLD).sum())
        live.totals["correct"] += correct
        live.totals["completions"] += P * G
        live.totals["tokens"] += tokens
        t0, t_sample, t_score, t_credit, t_train = clock
        step_time = t_train - t0
        return {
            "step": step,
            "condition": c.condition,
            "uncertainty_kind": c.uncertainty_kind,
            "skipped": credit.skipped,
            "loss": train.get("loss", 0.0),
            "mean_reward": float(rewards_P_G.mean()),
            "correct_rate": correct / (P * G),
            "running_correct_rate": live.totals["correct"] / live.totals["completions"],
            **tie_metrics(rewards_P_G),
            "num_datums": P * G,
            "batch_size": P,
            "group_size": G,
            "mean_completion_length": float(lengths.float().mean()),
            "max_token_hit_rate": float((~rollouts.finished_PG).float().mean()),
            "rl/completion_tokens": float(lengths.sum()),
            "rl/completion_surprisal_mean": float(-rollouts.logprobs_PG_T[rollouts.mask_PG_T].mean()),
            "rl/nonzero_advantage_action_tokens": float(((credit.batch.adv_PG_T != 0) & rollouts.mask_PG_T).sum()),
            **credit.metrics,
            **train,
            "tokens_per_step": tokens,
            "step_time_s": step_time,
            "sample_time_s": t_sample - t0,
            "score_time_s": t_score - t_sample,
            "advantage_time_s": t_credit - t_score,
            "train_time_s": t_train - t_credit,
            "tokens_per_second": tokens / step_time,
            "sample_share": (t_sample - t0) / step_time,
            "train_share": (t_train - t_credit) / step_time,
            "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

    def _samples(self, examples: list[Example], completions: list[str], rewards_P_G: Tensor, credit: Credit):
        """The first `samples_per_step` groups, each completion with its per-token advantages and, when
        the transform used one, which of its tokens the planning detector marked."""
        G, out = self.group_size, []
        mask, adv_PG_T = credit.signals.mask_PG_T, credit.batch.adv_PG_T
        for p in range(min(self.samples_per_step, len(examples))):
            rows = range(p * G, (p + 1) * G)
            lengths = [int(mask[r].sum()) for r in rows]
            group = {
                "prompt": examples[p].prompt,
                "reference": examples[p].reference,
                "completions": completions[p * G : (p + 1) * G],
                "rewards": rewards_P_G[p].tolist(),
                "advantages": credit.adv_P_G[p].tolist(),
                "token_advantages": [adv_PG_T[r, :n].tolist() for r, n in zip(rows, lengths)],
            }
            if credit.pieces_PG is not None:
                planning = credit.signals.planning_PG_T
                group["tokens"] = [credit.pieces_PG[r] for r in rows]
                group["planning"] = [planning[r, :n].int().tolist() for r, n in zip(rows, lengths)]
            out.append(group)
        return out

    def evaluate(self, live: Live, steps_done: int) -> dict:
        """Greedy accuracy on the held-out set; appends and returns the evaluation row."""
        t0 = time.perf_counter()
        examples = live.c.data.eval_examples()
        prompt_ids = encode_prompts(live.tokenizer, [e.prompt for e in examples])
        live.engine.sync(live.backend.policy)
        greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=self.eval_max_tokens)
        rollouts = live.engine.sample(prompt_ids, 1, greedy, seed=0)
        completions = decode_completions(live.tokenizer, rollouts)
        scores = guarded_score(live.c.reward, completions, [e.reference for e in examples])
        rewards = scores.values
        row = {
            "step": steps_done,
            "eval/accuracy": sum(r > CORRECT_THRESHOLD for r in rewards) / len(rewards),
            "eval/mean_reward": sum(rewards) / len(rewards),
            "eval/mean_completion_length": float(rollouts.lengths_PG.float().mean()),
            "eval/examples": len(examples),
            **scores.fractions("eval/reward_"),
            "eval_time_s": time.perf_counter() - t0,
        }
        self._emit(live, row)
        live.evals.append(row)
        return row

    @staticmethod
    def _emit(live: Live, row: dict) -> None:
        live.out.append("metrics.jsonl", row)
        live.c.logger.log(row)

    def _checkpoint(self, live: Live, steps_done: int, final: bool = False) -> None:
        state = {
            "step": steps_done,
            "max_steps": self.max_steps,
            "totals": live.totals,
            "evals": live.evals,
            "transform": live.c.transform.state_dict(),
            "backpressure": live.c.backpressure.state_dict(),
            "seeds": live.c.seeds.as_dict(),
            "config_sha256": live.c.config_sha256,
            "config": live.c.config,
        }
        live.checkpoints.save(steps_done, live.backend.save, state, final=final)


def guarded_score(reward: Reward, completions: Sequence[str], references: Sequence[str]) -> Scores:
    """The verifier's `Scores`, with one bad completion never stopping the run: a verifier that raises on
    the batch, or returns the wrong number of rewards or a non-finite one, is asked again one completion
    at a time; a completion it still fails on scores 0.0 and counts as an error. A ConfigError stops the run."""
    try:
        scores = reward.score(completions, references)
        if len(scores.values) == len(completions) and all(math.isfinite(v) for v in scores.values):
            return scores
        raise ValueError(f"{len(scores.values)} rewards for {len(completions)} completions, or one not finite")
    except ConfigError:  # not a bad completion: the verifier cannot work at all (no API key)
        raise
    except Exception as err:  # noqa: BLE001 - any verifier failure is contained here and counted
        log.warning("reward %s failed on the batch (%r): scoring one completion at a time", type(reward).__name__, err)
    parts = []
    for completion, reference in zip(completions, references):
        try:
            part = reward.score([completion], [reference])
            if len(part.values) != 1 or not math.isfinite(part.values[0]):
                raise ValueError(part.values)
            parts.append(part)
        except Exception:  # noqa: BLE001
            parts.append(Scores([0.0], errors=1))
    return Scores(
        [p.values[0] for p in parts],
        timeouts=sum(p.timeouts for p in parts),
        errors=sum(p.errors for p in parts),
        parse_failures=sum(p.parse_failures for p in parts),
    )


def prompts_at(data: DataSource, step: int, position: int, size: int) -> list[Example]:
    """The `size` training examples at positions position, position+1, … of the data stream, so a run whose
    batch size changes (back pressure) still sees every example once per epoch, in order. While every step
    had `size` prompts (position = step·size) this is `data.batch(step, size)`, the source's own call;
    otherwise position k is `data.batch(k, 1)`, which is position k for every source that orders by
    `rlvr.data.order.batch_indices` (all built-in ones): k = step·size + i with size 1."""
    if position == step * size:
        return data.batch(step, size)
    return [data.batch(k, 1)[0] for k in range(position, position + size)]


def token_pieces(tokenizer, rollouts: Rollouts) -> list[list[str]]:
    """Each completion's tokens as the tokenizer's raw pieces (what the planning detector reads)."""
    lengths = rollouts.lengths_PG.tolist()
    return [tokenizer.convert_ids_to_tokens(row[:n]) for row, n in zip(rollouts.tokens_PG_T.tolist(), lengths)]


def decode_completions(tokenizer, rollouts: Rollouts) -> list[str]:
    """Completion text without the EOS and padding (special tokens are dropped)."""
    rows = [
        [t for t, m in zip(tokens, mask, strict=True) if m]
        for tokens, mask in zip(rollouts.tokens_PG_T.tolist(), rollouts.mask_PG_T.tolist(), strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def _console_line(row: dict, evaluation: dict | None) -> str:
    parts = [
        f"step {row['step'] + 1}",
        f"reward {row['mean_reward']:.3f}",
        f"correct {row['correct_rate']:.3f}",
        f"loss {row['loss']:+.4f}",
        f"{row['step_time_s']:.3f} s/step",
    ]
    if evaluation is not None:
        parts.insert(3, f"eval {evaluation['eval/accuracy']:.3f}")
    return " | ".join(parts)
