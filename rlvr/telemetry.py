"""What a step and an evaluation leave for readers, as pure functions: the metrics row (`metrics.jsonl`; every
name's meaning is in docs/metrics.md), the `samples/step_N.jsonl` records, and the console line. Nothing here
updates the run's counters; the trainer does, and passes them in.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.algorithm.ties import tie_metrics
from rlvr.progress import duration

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.credit import Credit
    from rlvr.types import EnvFailures, Example, Played, Rollouts, Scores, TokenSignals

CORRECT_THRESHOLD = 0.5
"""A completion is correct when its reward exceeds this."""


class Stopwatch:
    """Seconds since the previous `lap` (or since it was made)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        return seconds


@dataclass(frozen=True)
class StepTimes:
    """Wall seconds of each phase of one step (`*_time_s` in the row)."""

    sample: float
    score: float
    credit: float
    train: float

    @property
    def total(self) -> float:
        return self.sample + self.score + self.credit + self.train


@dataclass(frozen=True)
class StepCounts:
    """What one step adds to the run's running totals."""

    correct: int
    completions: int
    tokens: int
    """Prompt tokens (once per completion) plus completion tokens."""

    @classmethod
    def of(cls, rollouts: Rollouts, rewards_P_G: Tensor) -> StepCounts:
        G = rewards_P_G.shape[1]
        tokens = sum(len(p) for p in rollouts.prompt_ids_P) * G + int(rollouts.lengths_PG.sum())
        return cls(int((rewards_P_G > CORRECT_THRESHOLD).sum()), rewards_P_G.numel(), tokens)


def step_row(step: int, condition: str, uncertainty_kind: str | None, rollouts: Rollouts, rewards_P_G: Tensor,
             credit: Credit, train: dict[str, float], times: StepTimes, counts: StepCounts,
             totals: dict[str, int]) -> dict:
    """One training step's row; `totals` are the running counters with this step already added."""
    (P, G), lengths = rewards_P_G.shape, rollouts.lengths_PG
    return {
        "step": step,
        "condition": condition,
        "uncertainty_kind": uncertainty_kind,
        "skipped": credit.skipped,
        "loss": train.get("loss", 0.0),
        "mean_reward": float(rewards_P_G.mean()),
        "correct_rate": counts.correct / counts.completions,
        "running_correct_rate": totals["correct"] / totals["completions"],
        **tie_metrics(rewards_P_G),
        "num_datums": P * G,
        "batch_size": P,
        "group_size": G,
        "mean_completion_length": float(lengths.float().mean()),
        "max_token_hit_rate": float((~rollouts.finished_PG).float().mean()),
        "rl/completion_tokens": float(lengths.sum()),
        "rl/completion_surprisal_mean": float(-rollouts.logprobs_PG_T[rollouts.action_mask_PG_T].mean()),
        "rl/nonzero_advantage_action_tokens": float(((credit.adv_PG_T != 0) & rollouts.action_mask_PG_T).sum()),
        **credit.metrics,
        **train,
        "tokens_per_step": counts.tokens,
        "step_time_s": times.total,
        "sample_time_s": times.sample,
        "score_time_s": times.score,
        "advantage_time_s": times.credit,
        "train_time_s": times.train,
        "tokens_per_second": counts.tokens / times.total,
        "sample_share": times.sample / times.total,
        "train_share": times.train / times.total,
        "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **gpu_memory(),
    }


def gpu_memory() -> dict[str, float]:
    """`gpu_max_allocated_mb`: the peak of torch's allocations on this process's GPU so far (the in-process
    engine's weights and KV cache included); nothing when the process has not used CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    return {"gpu_max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20}


def eval_row(steps_done: int, scores: Scores, rollouts: Rollouts, seconds: float,
             sampled: dict[str, float] | None = None) -> dict:
    """One evaluation's row (`step` = optimizer steps done); `sampled`: a sampled evaluation's avg@k and pass@j
    (rlvr/rollout/sampled_eval.py), the first fields being then over all k rows of each example."""
    rewards = scores.values
    return {
        "step": steps_done,
        "eval/accuracy": sum(r > CORRECT_THRESHOLD for r in rewards) / len(rewards),
        "eval/mean_reward": sum(rewards) / len(rewards),
        "eval/mean_completion_length": float(rollouts.lengths_PG.float().mean()),
        "eval/examples": len(rewards) // rollouts.group_size,
        **(sampled or {}),
        **scores.fractions("eval/reward_"),
        "eval_time_s": seconds,
    }


def sample_groups(examples: list[Example], completions: list[str], rewards_P_G: Tensor, credit: Credit,
                  signals: TokenSignals, pieces_PG: list[list[str]] | None,
                  played: Played | None = None) -> list[dict]:
    """One `samples/` record per example given (the first groups of the step): its completions with rewards,
    episode advantages and the advantages of the action tokens (`signals.mask_PG_T`: every completion token of
    a single turn), plus each token's piece and planning mark when the transform used them; for multi-turn
    episodes also each episode's role-tagged transcript (`[{"role": "env" | "policy", "text"}, …]`), each policy
    turn with its own tokens' advantages (`"advantages"`)."""
    G, out = rewards_P_G.shape[1], []
    for p, example in enumerate(examples):
        rows = range(p * G, (p + 1) * G)
        actions = [signals.mask_PG_T[r] for r in rows]
        group = {
            "prompt": example.prompt,
            "reference": example.reference,
            "completions": completions[p * G : (p + 1) * G],
            "rewards": rewards_P_G[p].tolist(),
            "advantages": credit.adv_P_G[p].tolist(),
            "token_advantages": [credit.adv_PG_T[r][a].tolist() for r, a in zip(rows, actions)],
        }
        if played is not None:  # an episode's prompt is its environment's first observation
            turn_PG_T = played.rollouts.turn_PG_T
            assert turn_PG_T is not None  # episodes' rollouts always mark their turns (rlvr/rollout/episodes.py)
            group["prompt"] = played.transcripts[p * G][0]["text"]
            group["transcripts"] = [_with_advantages(played.transcripts[r], credit.adv_PG_T[r], turn_PG_T[r])
                                    for r in rows]
        if pieces_PG is not None and signals.planning_PG_T is not None:
            group["tokens"] = [pieces_PG[r] for r in rows]
            group["planning"] = [signals.planning_PG_T[r][a].int().tolist() for r, a in zip(rows, actions)]
        out.append(group)
    return out


def episode_metrics(played: Played, failures: EnvFailures) -> dict[str, float]:
    """A multi-turn step's `env/*` metrics (docs/metrics.md): turns, action and observation tokens, truncated
    and failed episodes, the mean reward of each turn index, environment time (and branch probes' time)."""
    ro = played.rollouts
    actions, real = ro.action_mask_PG_T, ro.mask_PG_T
    per_turn = played.turn_rewards_PG_K
    return {
        "env/turns_mean": float(played.turns_PG.float().mean()),
        "env/action_tokens": float(actions.sum()),
        "env/observation_tokens": float((real & ~actions).sum()),
        "env/truncated_frac": float(played.truncated_PG.float().mean()),
        **failures.fractions("env/"),
        **{f"env/turn_{k}_reward_mean": float(per_turn[:, k].nanmean()) for k in range(per_turn.shape[1])},
        "env/step_time_s": played.env_seconds,
        **({"env/probe_time_s": played.probe_seconds} if played.branch_rewards_PG_K_B is not None else {}),
        **({"env/template_rewrite_frac": sum(map(bool, played.rewritten_turns)) / len(played.rewritten_turns),
            "env/sequences_mean": 1 + sum(map(len, ro.segments_PG or [])) / len(played.rewritten_turns)}
           if played.rewritten_turns else {}),
    }


def _with_advantages(transcript: list[dict], adv_T: Tensor, turn_T: Tensor) -> list[dict]:
    """The transcript with the k-th policy turn's token advantages beside its text."""
    out, k = [], 0
    for entry in transcript:
        if entry["role"] == "policy":
            entry, k = {**entry, "advantages": adv_T[turn_T == k].tolist()}, k + 1
        out.append(entry)
    return out


def console_line(row: dict, progress: str) -> str:
    """`rl 10/300 steps | 21.7 step/s | ETA 13s | reward 0.470 | correct 0.470 | loss -0.0124`; `progress` is
    rlvr/progress.py's `Progress.text()`. With distill.estimator=full, `| teacher KL 0.0451` too (its term is not in
    `loss`)."""
    line = (f"rl {progress} | reward {row['mean_reward']:.3f} | correct {row['correct_rate']:.3f} | "
            f"loss {row['loss']:+.4f}")
    return line + (f" | teacher KL {row['distill/support_kl']:.4f}" if "distill/support_kl" in row else "")


def eval_line(row: dict) -> str:
    """`eval after step 25: accuracy 0.612 | mean reward 0.612 | 1000 prompts in 2.1s`; a sampled evaluation
    (trainer.eval_samples = k ≥ 2): `eval after step 25: avg@4 0.612 | pass@4 0.810 | maj@4 0.700 | mean reward
    0.612 | 1000 prompts × 4 samples in 7.9s`."""
    when = "before training" if row["step"] == 0 else f"after step {row['step']}"
    k = next((key.removeprefix("eval/avg@") for key in row if key.startswith("eval/avg@")), None)
    if k is None:
        return (f"eval {when}: accuracy {row['eval/accuracy']:.3f} | mean reward {row['eval/mean_reward']:.3f} | "
                f"{row['eval/examples']} prompts in {row['eval_time_s']:.1f}s")
    sampled = " | ".join(f"{name}@{k} {row[f'eval/{name}@{k}']:.3f}" for name in ("avg", "pass", "maj")
                         if f"eval/{name}@{k}" in row)
    return (f"eval {when}: {sampled} | mean reward {row['eval/mean_reward']:.3f} | "
            f"{row['eval/examples']} prompts × {k} samples in {row['eval_time_s']:.1f}s")


def closing_line(summary: dict, evals: list[dict], folder: Path) -> str:
    """`done: held-out accuracy 0.385 -> 0.891 (best 0.944 at step 275) | 300 steps, wall 1m32s | <folder>`; the
    wall time is the whole run's (every segment of a resumed one), the warm-up included."""
    tail = f"{summary['steps']} steps, wall {duration(summary['wall_seconds'])} | {folder}"
    if not evals:
        return f"done: no held-out evaluation (trainer.evaluate=false) | {tail}"
    best = max(evals, key=lambda e: e["eval/accuracy"])
    return (f"done: held-out accuracy {summary['eval_accuracy_initial']:.3f} -> {summary['eval_accuracy_final']:.3f} "
            f"(best {best['eval/accuracy']:.3f} at step {best['step']}) | {tail}")
