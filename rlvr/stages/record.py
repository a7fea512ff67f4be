"""record: the step's metrics row (rlvr/telemetry.py `step_row`, then the stages' fields in the order they ran),
with the running totals it adds to, written to metrics.jsonl and the run's logger; and the run's summary.json."""

from __future__ import annotations

from typing import ClassVar

from rlvr.components import Live
from rlvr.stages import Stateless, StepState
from rlvr.telemetry import step_row


class Record(Stateless):
    fields: ClassVar[tuple[str, ...]] = (
        "step", "condition", "uncertainty_kind", "skipped", "loss", "mean_reward", "correct_rate",
        "running_correct_rate", "reward_tie_*", "reward_uniform_*", "reward_unique_fraction_mean", "num_datums",
        "batch_size", "group_size", "mean_completion_length", "max_token_hit_rate", "rl/completion_tokens",
        "rl/completion_surprisal_mean", "rl/nonzero_advantage_action_tokens", "tokens_per_step", "step_time_s",
        "sample_time_s", "score_time_s", "advantage_time_s", "train_time_s", "tokens_per_second", "sample_share",
        "train_share", "process_max_rss_mb", "gpu_max_allocated_mb", "async/*")
    """rlvr/telemetry.py `step_row`'s fields (the credit's and the update's besides, which their stages declare),
    and the sampler's `async/*` when it samples ahead."""

    def __init__(self, condition: str, uncertainty_kind: str | None) -> None:
        self.condition, self.uncertainty_kind = condition, uncertainty_kind

    def apply(self, s: StepState) -> None:
        live, batch, counts = s.live, s.scored, s.counts
        assert counts is not None and s.times is not None and s.credit is not None, "train runs first"
        for key, value in (("correct", counts.correct), ("completions", counts.completions), ("tokens", counts.tokens)):
            live.totals[key] += value
        row = step_row(s.step, self.condition, self.uncertainty_kind, batch.rollouts, batch.rewards_P_G, s.credit,
                       s.train, s.times, counts, live.totals)
        s.row = {**row, **batch.metrics, **s.fields}
        if live.sampler is not None:
            s.row.update(live.sampler.meter())
        live.out.append("metrics.jsonl", s.row)
        live.c.logger.log(s.row)


def run_summary(live: Live, steps: int, resumed_from: int | None, wall_seconds: float, rl_seconds: float) -> dict:
    """summary.json's data (the times cover every segment of a resumed run)."""
    import torch

    accuracy = [e["eval/accuracy"] for e in live.evals] or [None]  # trainer.evaluate=false: none
    return {
        "condition": live.c.condition,
        "steps": steps,
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
