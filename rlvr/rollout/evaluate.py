"""Held-out evaluation: one function for the trainer (at start, every `trainer.eval_every` steps, at the end) and
for `rlvr eval` on a saved checkpoint, single-turn completions and episodes alike, so both give the same numbers
from the same weights.

    examples    = data.eval_examples()
    engine.sync(policy)
    batch       = rollout.evaluate(examples, max_tokens)      greedy (T=0), one row per example (sampled: k rows)
    engine.sleep()                                            sampling is over (a sleeping vLLM frees its memory)
    row         = eval_row(...) + the rollout's own eval/…    rlvr/telemetry.py: eval/accuracy, eval/mean_reward, …

Greedy is the default (`trainer.eval_samples` 0 or 1). With `trainer.eval_samples` = k ≥ 2 the rollout samples k
rows of each example at `trainer.eval_temperature` (top_p 1; each example's group from its own seed, a function
of the run seed and the example's place in the held-out set: rlvr/seeds.py eval_sampling_seeds, the same at every
evaluation and in `rlvr eval`), and the row adds rlvr/rollout/sampled_eval.py's `eval/avg@k`, `eval/pass@j`
(j = 1, 2, 4, … < k, and k: the unbiased estimator of Chen et al. 2021, 1 − C(n − c, j)/C(n, j) per example) and,
where the reward reads answers, `eval/maj@k`. `eval/accuracy`, `eval/mean_reward` and
`eval/mean_completion_length` are then over all k·N rows (`eval/accuracy` = `eval/avg@k`); `eval/examples` stays N.

`eval_time_s` covers all of it (the held-out set, the sync, sampling and scoring); every other field depends
only on the weights, the data, the verifier or environment, `max_tokens` and, sampled, k, the temperature and
the run seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.rollout.sampled_eval import sampled_metrics
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
    """One greedy completion (an episode: its transcript) per example, decoded without EOS or padding; sampled,
    `samples` of each (example p's at p·samples … p·samples + samples − 1)."""
    scores: Scores
    rollouts: Rollouts
    samples: int = 1
    """Rows per example: 1 (greedy) or trainer.eval_samples."""


def evaluate(rollout: Rollout, engine: Engine, policy, data: DataSource, max_tokens: int,
             steps_done: int, samples: int = 0, temperature: float = 1.0) -> Evaluation:
    """Greedy accuracy of `policy` on `data.eval_examples()`, `max_tokens` per completion (per turn); with
    `samples` ≥ 2, that many rows of each example at `temperature` and the sampled metrics (module docstring)."""
    t0 = time.perf_counter()
    examples = data.eval_examples()
    engine.sync(policy)
    if samples >= 2:
        batch = rollout.evaluate(examples, max_tokens, samples, temperature)
    else:
        batch = rollout.evaluate(examples, max_tokens)
    engine.sleep()
    sampled = sampled_metrics(batch.rewards_P_G.tolist()) if samples >= 2 else {}
    row = {**eval_row(steps_done, batch.scores, batch.rollouts, time.perf_counter() - t0, sampled), **batch.metrics}
    return Evaluation(row, list(examples), batch.completions, batch.scores, batch.rollouts, max(samples, 1))
