"""credit: what the transform reads (token signals), a teacher's scores (distill=…, transform=sdpo|sdft), then the
rewards turned into token advantages (rlvr/credit.py: the algorithm, the transform, a multi-turn run's turn credit),
truncated completions filtered out (trainer.overlong.filter) and echo's targets on observation tokens (echo=on)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

from rlvr.credit import assign_credit
from rlvr.distill.distill import Distill
from rlvr.echo.echo import Echo
from rlvr.lazy import lazy_import
from rlvr.model.prompt_encoding import token_pieces
from rlvr.protocols import Algorithm, EntropyBackend, PlanningDetector, Transform, TurnCredit
from rlvr.reward.overlong import Overlong
from rlvr.stages import Stateless, StepState
from rlvr.telemetry import CORRECT_THRESHOLD
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from rlvr.distill.self_teacher import SelfScoringBackend
    from rlvr.transform.self_distill import SelfDistill

torch = lazy_import("torch")


class Signals(Stateless):
    """What the transform may read: planning marks only when it needs them; entropies from the backend's no-grad
    pass when the engine gives none (rlvr/backend/local.py `entropies`)."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, group_size: int, planning: PlanningDetector, wants_planning: bool, wants_entropy: bool
                 ) -> None:
        self.group_size, self.planning = group_size, planning
        self.wants_planning, self.wants_entropy = wants_planning, wants_entropy

    def apply(self, s: StepState) -> None:
        rollouts, rewards_P_G = s.scored.rollouts, s.scored.rewards_P_G
        s.pieces_PG = token_pieces(s.live.tokenizer, rollouts) if self.wants_planning else None
        entropy_PG_T = rollouts.entropy_PG_T
        if self.wants_entropy and entropy_PG_T is None:
            entropy_PG_T = cast(EntropyBackend, s.live.backend).entropies(rollouts)
        s.signals = TokenSignals(
            logprobs_PG_T=rollouts.logprobs_PG_T, mask_PG_T=rollouts.action_mask_PG_T, group_size=self.group_size,
            step=s.step, correct_rate=float((rewards_P_G > CORRECT_THRESHOLD).float().mean()),
            entropy_PG_T=entropy_PG_T,
            planning_PG_T=None if s.pieces_PG is None else self.planning.mask(s.pieces_PG,
                                                                             rollouts.mask_PG_T.shape[1]),
        )


class Teach(Stateless):
    """distill=…: the teacher scores the step's completions and its credit coef·(log π_teacher − log π) joins the
    signals (rlvr/distill/distill.py), or its top-k for the loss (distill.estimator=full); its seconds are the credit
    stage's. Without a teacher it does nothing."""

    fields: ClassVar[tuple[str, ...]] = ("distill/*",)

    def __init__(self, distill: Distill | None) -> None:
        self.distill = distill

    def apply(self, s: StepState) -> None:
        if self.distill is None:
            return
        assert s.signals is not None, "signals run first"
        d_PG_T, support, fields = self.distill.score(s.scored.rollouts)
        s.signals = replace(s.signals, distill_PG_T=d_PG_T, distill_support=support)
        s.fields.update(fields)


class SelfTeach(Stateless):
    """transform=sdpo|sdft: each row's privileged context (a successful sibling, the reference answer) and the
    policy's log-probabilities of the row's tokens under it (rlvr/distill/self_teacher.py), for the transform to read;
    with transform.estimator=full, its top-k too, as the loss's support. Without a self-teacher it does nothing."""

    fields: ClassVar[tuple[str, ...]] = ("self_distill/*",)

    def __init__(self, transform: SelfDistill | None) -> None:
        self.transform = transform

    def apply(self, s: StepState) -> None:
        if self.transform is None:
            return
        assert s.signals is not None, "signals run first"
        batch, live, teacher = s.scored, s.live, self.transform.teacher
        rollouts = batch.rollouts
        texts = teacher.contexts(s.examples, batch.completions, batch.rewards_P_G.flatten().tolist(),
                                 rollouts.group_size)
        if teacher.teacher == "ema":  # each step, whether or not a row has context (SDPO: each optimizer step)
            cast("SelfScoringBackend", live.backend).ema_update(teacher.ema_rate)
        full = self.transform.estimator == "full"
        topk = (self.transform.topk or len(cast(Any, live.tokenizer))) if full else None
        teacher_PG_T, top, fields = teacher.score(live.backend, live.tokenizer, rollouts, texts, topk)
        s.signals = replace(s.signals, self_teacher_PG_T=teacher_PG_T)
        if full:  # the loss's support (a step of rows without context has none: it may skip)
            s.signals = replace(s.signals, distill_support=None if top is None else self.transform.support(
                top, rollouts.action_mask_PG_T, torch.tensor([t is not None for t in texts])))
        s.fields.update(fields)


class CreditStage:
    """Its state: the transform's controller (SEPA's λ, …) and the turn credit's."""

    fields: ClassVar[tuple[str, ...]] = ("adv_cap_*", "batch_adv_*", "turn_credit/*", "train/tl_grpo_ema_baseline",
                                         "overlong/*", "echo/*")
    """The credit's (the cap, the batch pass, turn credit; the transform's own metrics besides: docs/metrics.md),
    the overlong filter's and echo's."""

    def __init__(self, algorithm: Algorithm, transform: Transform, turn_credit: TurnCredit | None,
                 overlong: Overlong, max_tokens: int, echo: Echo | None) -> None:
        self.algorithm, self.transform, self.turn_credit = algorithm, transform, turn_credit
        self.overlong, self.max_tokens, self.echo = overlong, max_tokens, echo

    def apply(self, s: StepState) -> None:
        batch = s.scored
        assert s.signals is not None and s.rewards_P_G is not None, "signals and shape run first"
        credit = assign_credit(s.rewards_P_G, s.signals, self.algorithm, self.transform, self.turn_credit,
                               batch.turns)
        credit, filtered = self.overlong.mask(credit, batch.rollouts)
        s.fields.update({**self.overlong.fields(batch.rollouts, self.max_tokens), **filtered})
        if self.echo is not None:  # its targets, kept before the skip rule: a step of tied groups still trains them
            echo_PG_T, s.train = self.echo.plan(batch.rollouts)
            credit = replace(credit, echo_PG_T=echo_PG_T)
        s.credit = credit
        s.credit_s = s.clock.lap() + batch.credit_seconds

    def state_dict(self) -> dict[str, Any]:
        return {"transform": self.transform.state_dict(),
                "turn_credit": self.turn_credit.state_dict() if self.turn_credit is not None else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.transform.load_state_dict(state["transform"])
        if self.turn_credit is not None:
            self.turn_credit.load_state_dict(state["turn_credit"])
