"""`echo=on`: ECHO, the predecessor's auxiliary cross-entropy on the observations' own tokens (docs/algorithms.md#echo).

Candidates: in multi-turn rows, the tokens of each environment or tool observation's body
(`Rollouts.observation_body_PG_T`, rlvr/rollout/observation_body.py); the chat template's tokens around a body
(the user-turn header, the end of turn, the next generation prompt) are never targets. Per step, with
reference = the step's sampled (action) tokens and s̄ = their mean surprisal −log π_engine:

    retention = all:      keep every candidate (entropy_floor must be 0)
    retention = bounded:  allowed = max(0, min(max_tokens_per_step, int(reference · max_token_ratio)))
                          s̄ < entropy_floor  →  keep none (ECHO is off for the step: echo/skipped_entropy_floor = 1)
                          else keep the first `allowed` candidates in row order (row-major over [P·G, T])

Each kept token t of row i gets the weight

    w_t = weight / (max(c_i, 1e-3) · max(E, 1))

c_i the row's candidate tokens (before retention: the predecessor's full observation count), E the step's ECHO
episodes (rows with any candidate), and the loss adds Σ_t −w_t · log π_θ(t) (the temperature-scaled log-probability,
as the policy term's) in the same forward and backward pass as the policy loss; `echo/loss` is that sum. Both
normalisations are over the whole step, so micro-batches, packing and ranks leave the term unchanged. Rows with kept
tokens train even when no action of theirs has an advantage, and a step with kept tokens is not skipped.

Where the predecessor is open: the floor reads the mean surprisal of the sampled action tokens under the engine's
log-probabilities (the predecessor's "mean sampled-completion surprisal", no extra pass), not a full-distribution
entropy.
Departures: `echo/*` metrics of the predecessor's observation bridge (bridge_failures, renderer_parity_failures,
skipped_first_turns, skipped_no_suffix, skipped_low_overlap, split_non_prefix, executed/bridged_transition_datums,
terminal_*) are not written: rows here are token in, token out, so there is nothing to bridge, and an episode's
final observation is never appended to its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.types import Rollouts

torch = lazy_import("torch")

RETENTIONS = ("bounded", "all")
MIN_COUNT = 1e-3
"""A row's candidate count is clamped to at least this (the predecessor's clamp)."""


@dataclass(frozen=True)
class Echo:
    weight: float
    """The ECHO weight of each kept token, before the normalisation (the predecessor's 0.05)."""
    target_retention: str
    """bounded (the caps below, first in row order) | all (every candidate; entropy_floor must be 0)."""
    max_tokens_per_step: int
    """bounded: at most this many kept tokens per step."""
    max_token_ratio: float
    """bounded: at most this fraction of the step's sampled (action) tokens."""
    entropy_floor: float
    """bounded: the step's mean sampled surprisal under which ECHO is off for the step."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(requires={"local_loss": "echo=on (its cross-entropy on observation tokens is added to the local "
                                            "loss in the same forward pass)",
                               "episodes": "echo=on trains on observation tokens, which single-turn completions have "
                                           "none of"},
                     excludes={"masked_token_mean": "ECHO's term would be rescaled with the policy loss's: choose "
                                                    "another correction (token_tis, seq_tis, none) or aggregation"})

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1:
            raise ValueError(f"echo.weight={self.weight} must be in (0, 1] (echo=none turns ECHO off)")
        if self.target_retention not in RETENTIONS:
            raise ValueError(f"echo.target_retention={self.target_retention!r} must be one of {', '.join(RETENTIONS)}")
        if self.max_tokens_per_step < 0:
            raise ValueError(f"echo.max_tokens_per_step={self.max_tokens_per_step} must be >= 0")
        if not 0 <= self.max_token_ratio <= 1:
            raise ValueError(f"echo.max_token_ratio={self.max_token_ratio} must be in [0, 1]")
        if self.entropy_floor < 0:
            raise ValueError(f"echo.entropy_floor={self.entropy_floor} must be >= 0")
        if self.target_retention == "all" and self.entropy_floor != 0:
            raise ValueError(f"echo.target_retention=all keeps every candidate, with no entropy floor: set "
                             f"echo.entropy_floor=0 (now {self.entropy_floor})")

    def plan(self, rollouts: Rollouts) -> tuple[Tensor | None, dict[str, Any]]:
        """The step's [P·G, T] ECHO weights (module docstring; None when no token is kept) and its `echo/*` metrics."""
        body = rollouts.observation_body_PG_T
        candidates = body & rollouts.mask_PG_T if body is not None else torch.zeros_like(rollouts.mask_PG_T)
        sampled = rollouts.action_mask_PG_T
        reference = int(sampled.sum())
        surprisal = float(-rollouts.logprobs_PG_T[sampled].float().mean()) if reference else 0.0
        count_PG = candidates.sum(-1)
        n_candidates, episodes = int(count_PG.sum()), int((count_PG > 0).sum())
        floored = False
        if self.target_retention == "all":
            allowed = n_candidates
        else:
            allowed = max(0, min(self.max_tokens_per_step, int(reference * self.max_token_ratio)))
            floored = surprisal < self.entropy_floor
            if floored:
                allowed = 0
        flat = candidates.flatten()
        kept = (flat & (flat.long().cumsum(0) <= allowed)).view_as(candidates)
        n_kept = int(kept.sum())
        w_PG = self.weight / (count_PG.double().clamp(min=MIN_COUNT) * max(episodes, 1))
        weights = torch.where(kept, w_PG[:, None], 0.0).float() if n_kept else None
        metrics: dict[str, Any] = {
            "echo/enabled": 1.0, "echo/loss": 0.0, "echo/weight": self.weight,
            "echo/target_retention": self.target_retention, "echo/entropy_floor": self.entropy_floor,
            "echo/allowed_tokens": float(allowed), "echo/reference_completion_tokens": float(reference),
            "echo/completion_surprisal_mean": surprisal, "echo/candidate_datums": float(episodes),
            "echo/candidate_tokens": float(n_candidates), "echo/eligible_rollouts": float(episodes),
            "echo/kept_datums": float(int(kept.any(-1).sum())), "echo/kept_tokens": float(n_kept),
            "echo/truncated_tokens": float(n_candidates - n_kept),
            "echo/retention_ratio": n_kept / n_candidates if n_candidates else 0.0,
            "echo/token_ratio": n_kept / reference if reference else 0.0,
            "echo/skipped_entropy_floor": float(floored), "echo/joint_optimizer_step": 0.0,
        }
        return weights, metrics
