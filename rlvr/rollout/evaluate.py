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

Large k streams: the held-out set is sampled `rows` rows at a time (`trainer.eval_rows`, 4,096: a whole number
of examples, at least one, per part), and each part is reduced to its metrics before the next is sampled, so
memory holds one part, never N·k rows (pass@256 of 256 mazes is 65,536 rows). Each example's group keeps its own
seed (its place in the held-out set, `first`), so a part draws what one unsplit evaluation would (prompts of one
length, as the maze's, give the same logits in any batch; other padding may move the last float bits). Every
field is a mean over examples or over rows (k rows each), so the parts' means weighted by their examples give
the whole's (`combine`), up to float rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.rollout.sampled_eval import sampled_metrics
from rlvr.telemetry import eval_row

if TYPE_CHECKING:
    from rlvr.protocols import DataSource, Engine, Rollout
    from rlvr.types import Example, StepBatch


EVAL_ROWS = 4096
"""`trainer.eval_rows`' default: rows sampled at once in an evaluation (module docstring)."""

SUMMED = ("eval/examples",)
"""Row fields that add up over the parts of an evaluation; `step` is shared, `eval_time_s` is the whole's (set by
`evaluate`); every other field is a mean."""


@dataclass(frozen=True)
class Part:
    """One part of an evaluation: a run of consecutive held-out examples, sampled."""
    examples: list[Example]
    batch: StepBatch


def evaluate(rollout: Rollout, engine: Engine, policy, data: DataSource, max_tokens: int, steps_done: int,
             samples: int = 0, temperature: float = 1.0, rows: int = EVAL_ROWS,
             each: Callable[[Part], None] | None = None) -> dict:
    """The metrics row of `policy` on `data.eval_examples()`: greedy, `max_tokens` per completion (per turn); with
    `samples` ≥ 2, that many rows of each example at `temperature` and the sampled metrics. Sampled `rows` rows
    at a time, each part reduced at once (`each` sees it first: `rlvr eval` writes its completions)."""
    t0 = time.perf_counter()
    examples = data.eval_examples()
    k = max(samples, 1)
    size = max(1, rows // k)
    engine.sync(policy)
    parts = []
    for first in range(0, len(examples), size):
        chunk = examples[first:first + size]
        if samples >= 2:
            batch = rollout.evaluate(chunk, max_tokens, samples, temperature, first=first)
        else:
            batch = rollout.evaluate(chunk, max_tokens, first=first)
        sampled = sampled_metrics(batch.rewards_P_G.tolist()) if samples >= 2 else {}
        parts.append({**eval_row(steps_done, batch.scores, batch.rollouts, 0.0, sampled), **batch.metrics})
        if each is not None:
            each(Part(chunk, batch))
    engine.sleep()
    return {**combine(parts), "eval_time_s": time.perf_counter() - t0}


def combine(parts: list[dict]) -> dict:
    """One evaluation's row from its parts' rows: counts summed, means weighted by each part's examples (one part:
    its row as it is, not w·x/w)."""
    if len(parts) == 1:
        return parts[0]
    weights = [part["eval/examples"] for part in parts]
    total = sum(weights)
    row = {}
    for key, value in parts[0].items():
        if key == "step":
            row[key] = value
        elif key in SUMMED:
            row[key] = sum(part[key] for part in parts)
        else:
            row[key] = sum(w * part[key] for w, part in zip(weights, parts, strict=True)) / total
    return row
