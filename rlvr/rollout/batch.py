"""`StepBatch`: a collected step, the one shape every stage after the rollout reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.rollout.episodes import Played
    from rlvr.turn_credit.signals import TurnSignals
    from rlvr.types import Rollouts, Scores


@dataclass(frozen=True)
class StepBatch:
    """P prompts × G rows (row p·G + g), sampled, scored and gathered over the run's processes."""

    rollouts: Rollouts
    rewards_P_G: Tensor
    """float32 [P, G]: each row's reward (an episode's: the sum of its turns')."""
    completions: list[str]
    """Per row, the text after the prompt (an episode: its transcript after the first observation)."""
    scores: Scores
    """The rewards with the counts of those that could not really be judged (an episode: its environment
    failed or hung)."""
    metrics: dict[str, float]
    """The rollout's own fields of the metrics row: `reward/*_frac` (single turn) or `env/*` (episodes)."""
    failures: dict[str, float]
    """The fractions a step warns about when above trainer.reward_warn_frac, and what they concern."""
    what: str
    """`completions` or `episodes`: what a failure cost, for the warning."""
    check: str
    """Where to look when failures are high, for the warning."""
    sample_seconds: float
    score_seconds: float
    """Scoring time (an episode's: the environment's)."""
    credit_seconds: float = 0.0
    """Work done for the credit while collecting (branch probes)."""
    turns: TurnSignals | None = None
    """Multi-turn rows: what turn credit reads; None for single-turn completions."""
    played: Played | None = field(default=None, repr=False)
    """Multi-turn: the played episodes (transcripts for samples/)."""
