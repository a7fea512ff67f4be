"""Credit assignment for one step: rewards [P, G] and the token signals → one advantage per completion token.

    adv_P_G   = algorithm.advantages(rewards_P_G)          episode level (GRPO, MaxRL, REINFORCE++, discover_entropic)
    adv_P_G[uniform groups] = 0                            every reward of the group ties: no signal
              (+ algorithm.advantage_metrics(untied groups): discover_entropic's β, {} for the others)
    base      = adv_P_G.flatten()                          one per completion; multi-turn episodes: per turn,
              | turn_credit(adv_P_G, rewards_P_G, turns)     [P·G, T] on the action tokens (rlvr/turn_credit/), `turns`
                                                             read from the episodes as played
    adv_PG_T  = transform(base, signals)                   token level (none, GTPO, HICRA, SEPA, …)
    adv_PG_T += signals.distill_PG_T                       a teacher's coef·(log π_teacher − log π) (distill=…;
                                                             distill.estimator=full: its top-k goes to the loss)
    adv_PG_T  = algorithm.normalize(adv_PG_T, mask)        batch pass (REINFORCE++'s token z-score)
    adv_PG_T  = algorithm.loss.cap(adv_PG_T)               |advantage| ≤ adv_clip_max when set

Rows are prompt-major (row p·G + g is completion g of prompt p). The step trains nothing when no token
has a non-zero advantage and no loss term of its own (ECHO's, a teacher's KL) has tokens (`Credit.skipped`).
The function is pure apart from a stateful transform's controller (SEPA's λ schedule advances once per
call), so a researcher can run it on one group from a notebook, and a new transform is tested without a trainer:

    >>> signals = TokenSignals(logprobs_PG_T=lp, mask_PG_T=mask, group_size=4, step=0, correct_rate=0.5)
    >>> credit = assign_credit(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), signals, GRPO(loss), GTPO(...))
    >>> credit.adv_P_G        # tensor([[ 0.5, -0.5, -0.5,  0.5]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.algorithm.ties import uniform_groups
from rlvr.turn_credit.played import turn_signals
from rlvr.types import TurnSignals

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.protocols import Algorithm, Transform, TurnCredit
    from rlvr.types import Played, TeacherSupport, TokenSignals


@dataclass(frozen=True)
class Credit:
    """One step's advantages and what computing them measured."""

    adv_P_G: Tensor
    """Episode advantages, uniform groups zeroed."""
    adv_PG_T: Tensor
    """Token advantages after the transform, the batch pass and the cap; 0 at padding."""
    metrics: dict[str, float]
    """The episode advantages', the transform's, the batch pass's and the cap's metrics (names in docs/metrics.md)."""
    echo_PG_T: Tensor | None = None
    """echo=on: the step's ECHO weights on the observation tokens it keeps (rlvr/echo/echo.py); None: none kept."""
    distill: TeacherSupport | None = None
    """estimator=full (distill=…, transform=sdpo|sdft): the teacher's top-k at each action token, whose divergence the
    loss adds."""

    @property
    def skipped(self) -> bool:
        """No token has a non-zero advantage, ECHO keeps none and no teacher's KL is to be lowered: nothing to train."""
        return not bool((self.adv_PG_T != 0).any()) and self.echo_PG_T is None and self.distill is None


def assign_credit(rewards_P_G: Tensor, signals: TokenSignals, algorithm: Algorithm, transform: Transform,
                  turn_credit: TurnCredit | None = None, turns: Played | TurnSignals | None = None) -> Credit:
    """The chain in the module docstring. `signals` must carry entropies/planning marks when the transform's
    `needs` require them. Multi-turn episodes pass their `turn_credit` (rlvr/turn_credit/) and the episodes as
    played (`StepBatch.turns`), whose per-turn signals are read here (rlvr/turn_credit/played.py), or those signals
    themselves (rows built by hand): it turns the episode advantages into per-turn ones on the action tokens,
    [P·G, T], and the transform weights those token by token instead of one episode advantage per row."""
    tied_P = uniform_groups(rewards_P_G)
    adv_P_G = algorithm.advantages(rewards_P_G).masked_fill(tied_P[:, None], 0.0)
    episode_metrics = algorithm.advantage_metrics(rewards_P_G[~tied_P])
    turn_metrics: dict[str, float] = {}
    if turn_credit is None:
        base = adv_P_G.flatten()
    elif turns is None:
        raise ValueError("assign_credit: turn_credit was given without the episodes' turns (TurnSignals)")
    else:
        signals_of_turns = turns if isinstance(turns, TurnSignals) else turn_signals(turns)
        base, turn_metrics = turn_credit(adv_P_G, rewards_P_G, signals_of_turns)
    adv_PG_T, transform_metrics = transform(base, signals)
    if signals.distill_PG_T is not None:
        adv_PG_T = adv_PG_T + signals.distill_PG_T.to(adv_PG_T.device, adv_PG_T.dtype)
    adv_PG_T, norm_metrics = algorithm.normalize(adv_PG_T, signals.mask_PG_T)
    adv_PG_T, cap_metrics = algorithm.loss.cap(adv_PG_T)
    return Credit(adv_P_G, adv_PG_T,
                  {**episode_metrics, **turn_metrics, **transform_metrics, **norm_metrics, **cap_metrics},
                  distill=signals.distill_support)
