"""Greedy held-out evaluation: one function for the trainer (at start, every `trainer.eval_every` steps, at the
end) and for `rlvr eval` on a saved checkpoint, single-turn completions and episodes alike, so both give the same
numbers from the same weights.

    examples    = data.eval_examples()
    engine.sync(policy)
    batch       = rollout.evaluate(examples, max_tokens)      greedy (T=0), one row per example
    engine.sleep()                                            sampling is over (a sleeping vLLM frees its memory)
    row         = eval_row(...) + the rollout's own eval/…    rlvr/telemetry.py: eval/accuracy, eval/mean_reward, …

`eval_time_s` covers all of it (the held-out set, the sync, sampling and scoring); every other field depends
only on the weights, the data, the verifier or environment and `max_tokens`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.telemetry import eval_row

if TYPE_CHECKING:
    from rlvr.protocols import DataSource, Engine, Rollout
    from rlvr.types import Example, Rollouts, Scores


@dataclass(frozen=True)
class Evaluation:
    row: dict
    """The metrics row (`step` = optimizer steps done), as metrics.jsonl holds it."""
    examples: list[Example]
    completions: list[str]
    """One greedy completion (an episode: its transcript) per example, decoded without EOS or padding."""
    scores: Scores
    rollouts: Rollouts


def evaluate(rollout: Rollout, engine: Engine, policy, data: DataSource, max_tokens: int,
             steps_done: int) -> Evaluation:
    """Greedy accuracy of `policy` on `data.eval_examples()`, `max_tokens` per completion (per turn)."""
    t0 = time.perf_counter()
    examples = data.eval_examples()
    engine.sync(policy)
    batch = rollout.evaluate(examples, max_tokens)
    engine.sleep()
    row = {**eval_row(steps_done, batch.scores, batch.rollouts, time.perf_counter() - t0), **batch.metrics}
    return Evaluation(row, list(examples), batch.completions, batch.scores, batch.rollouts)
