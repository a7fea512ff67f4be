"""Dynamic sampling (`trainer.dynamic_sampling`): what a step does with its groups whose rewards all tie.

A group whose rewards all tie (within 1e-6, rlvr/algorithm/ties.py) carries no learning signal: the credit zeroes
its advantages. The modes:

    off      every group sampled is the step's (its tied ones train nothing); the default, and today's rows
    filter   the tied groups leave the step: it trains on the others only (fewer than batch_size groups), so
             nothing computed over the step (REINFORCE++'s and batch_std's batch statistics, a reference KL, the
             row's reward statistics) counts them
    refill   DAPO's dynamic sampling (arXiv 2503.14476 §3.2; verl's `algorithm.filter_groups`): while fewer than
             batch_size groups differ, sample another round of batch_size prompts, the data stream's next ones;
             the step trains on the first batch_size groups that differ, in stream order (the rest of the last
             round is dropped, as verl drops it). At most `max_sample_batches` rounds (the first included): when
             they are spent, the step trains on the groups it holds

Each round samples with the seeds of its prompts' positions in the data stream, as a step does
(rlvr/seeds.py group_sampling_seeds), and advances the run's position (`totals.prompts`) by its prompts. So the data
order is a function of the run seed and the rewards alone, and a resumed run draws exactly what the uninterrupted one
would have. Rounds after the first sample from the step's own weights, in the step (refill needs the synchronous loop,
trainer.off_policy_steps = 0: a step sampled ahead cannot know how many prompts the steps before it drew).

The row's fields describe the groups the step trained on, as without dynamic sampling; `dynamic/*` describe what it
drew (docs/metrics.md). verl raises an error when its `max_num_gen_batches` is spent; rlvr trains on what it holds (a
step with no group left trains nothing and counts as skipped, so `trainer.max_skipped_steps` still ends a run that
cannot learn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rlvr.algorithm.ties import uniform_groups
from rlvr.types import Scores, cat_rollouts

if TYPE_CHECKING:
    from rlvr.types import Example, StepBatch

MODES = ("off", "filter", "refill")


@dataclass(frozen=True)
class DynamicSampling:
    mode: str = "off"
    max_sample_batches: int = 10
    """refill: rounds of sampling a step may take, the first included (DAPO's recipe: 10)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"trainer.dynamic_sampling={self.mode!r} must be one of {', '.join(MODES)}")
        if self.max_sample_batches < 1:
            raise ValueError(f"trainer.max_sample_batches={self.max_sample_batches} must be >= 1 (the step's first "
                             "round counts)")

    def collect(self, batch: StepBatch, examples: list[Example], more: Callable[[int], tuple[StepBatch, list[Example]]],
                pad_id: int) -> tuple[StepBatch, list[Example], dict[str, float]]:
        """The step's batch and examples after the mode, and the `dynamic/*` row fields ({} when off). `more(n)`
        samples and scores the data stream's next n prompts (advancing the run's position)."""
        if self.mode == "off":
            return batch, examples, {}
        size, rounds, kept, drawn_so_far = len(examples), [(batch, examples)], _differing(batch), len(examples)
        while self.mode == "refill" and len(kept) < size and len(rounds) < self.max_sample_batches:
            rounds.append(more(size))
            kept += [drawn_so_far + p for p in _differing(rounds[-1][0])]
            drawn_so_far += len(rounds[-1][1])
        every = _cat([b for b, _ in rounds], pad_id) if len(rounds) > 1 else batch
        drawn = [e for _, es in rounds for e in es]
        keep = kept[:size] if self.mode == "refill" else kept
        fields = {
            "dynamic/sample_batches": float(len(rounds)),
            "dynamic/prompts": float(len(drawn)),
            "dynamic/tied_groups": float(len(drawn) - len(kept)),
            "dynamic/kept_groups": float(len(keep)),
            "dynamic/sampled_completion_tokens": float(every.rollouts.lengths_PG.sum()),
        }
        if not keep:  # nothing differs: the step as drawn, which trains nothing (skipped, with its cause)
            return batch, examples, fields
        return _groups(every, keep), [drawn[p] for p in keep], fields


def _differing(batch: StepBatch) -> list[int]:
    return [p for p, tied in enumerate(uniform_groups(batch.rewards_P_G).tolist()) if not tied]


def _groups(batch: StepBatch, keep_P: list[int]) -> StepBatch:
    """The step's groups `keep_P` (single turn: the rows' scores are per completion, in the rows' order)."""
    G = batch.rollouts.group_size
    rows = [p * G + g for p in keep_P for g in range(G)]
    return replace(batch, rollouts=batch.rollouts.groups(keep_P), rewards_P_G=batch.rewards_P_G[keep_P],
                   completions=[batch.completions[r] for r in rows],
                   scores=replace(batch.scores, values=[batch.scores.values[r] for r in rows]))


def _cat(batches: list[StepBatch], pad_id: int) -> StepBatch:
    """Rounds of one step as one batch: their groups in order; failure counts, fractions and seconds summed or
    re-taken over every round."""
    import torch

    first = batches[0]
    scores = Scores(values=[v for b in batches for v in b.scores.values],
                    timeouts=sum(b.scores.timeouts for b in batches), errors=sum(b.scores.errors for b in batches),
                    parse_failures=sum(b.scores.parse_failures for b in batches))
    fractions = scores.fractions("reward/")
    return replace(first, rollouts=cat_rollouts([b.rollouts for b in batches], pad_id),
                   rewards_P_G=torch.cat([b.rewards_P_G for b in batches]),
                   completions=[c for b in batches for c in b.completions], scores=scores,
                   metrics={**first.metrics, **fractions}, failures=fractions,
                   sample_seconds=sum(b.sample_seconds for b in batches),
                   score_seconds=sum(b.score_seconds for b in batches))
