"""`transform=sdpo` and `transform=sdft`: self-distillation as token credit (docs/algorithms.md#self-distillation).

The self-teacher (rlvr/distill/self_teacher.py) is the policy shown privileged context: a successful sibling of the
same group (SDPO, Hübotter et al. 2026) or the data's reference answer (SDFT, Shenfeld et al. 2026). With
q_t its log-probability of the sampled token y_t and s_t the student's (the sampler's), on each action token

    S_t     = q_t − s_t                                    (0 on rows without context)
    A_{i,t} = (1 − w) · A_i + w · S_t                      w = `weight`

S_t is the sampled-token form of SDPO's reverse KL, the per-token advantage whose policy gradient is that of TRL's
`SDPOTrainer` in its default `sampled_token` mode; w = 1 (the default) is SDPO's own choice, its loss replacing
GRPO's; 0 < w < 1 mixes the credits as TRL's `distillation_weight` mixes the losses. Metrics:
`self_distill/reverse_kl` (the mean of s_t − q_t over the action tokens of rows with context),
`self_distill/context_frac` (rows with context) and `self_distill/teacher_seconds`.

`estimator: full` is SDPO's full-logit distillation instead: the self-teacher returns its top-k at each action token
(`topk`; 0 the whole vocabulary), A_{i,t} = (1 − w) · A_i, and the loss adds w × the divergence `beta` and `tail`
choose over them (rlvr/loss/regularizers.py `distill_kl`, as distill.estimator=full), token-averaged over the action
tokens of the rows with context; SDPO's code defaults are topk=100, beta=0.5, tail=true (`condition=sdpo_full`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlvr.distill.credit import log_ratio, reverse_kl
from rlvr.distill.distill import estimator_problems
from rlvr.distill.self_teacher import EMA_RATE, SelfTeacher
from rlvr.protocols import Needs
from rlvr.transform.signals import per_token
from rlvr.types import TeacherSupport

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.types import TokenSignals


class SelfDistill:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        keys = ("context", "teacher", "success_threshold", "template", "context_template")
        teacher = SelfTeacher(**{k: settings[k] for k in keys}, ema_rate=settings.get("ema_rate", EMA_RATE))
        errors = teacher.problems()
        weight = settings["weight"]
        if not isinstance(weight, (int, float)) or not 0.0 < weight <= 1.0:
            errors.append(f"transform.weight={weight}: expected 0 < weight <= 1 (1: the self-teacher's credit alone)")
        estimator, topk = settings.get("estimator", "sampled"), settings.get("topk", 0)
        errors += estimator_problems("transform", estimator, settings.get("beta", 1.0), settings.get("tail", False))
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
            errors.append(f"transform.topk={topk}: expected an integer >= 0 (0: the whole vocabulary)")
        elif topk and estimator != "full":
            errors.append(f"transform.topk={topk} is the support of transform.estimator=full, which the sampled "
                          "estimator does not take: set transform.estimator=full")
        if settings.get("ema_rate", EMA_RATE) != EMA_RATE and settings["teacher"] != "ema":
            errors.append(f"transform.ema_rate={settings['ema_rate']} moves the EMA teacher, which "
                          f"transform.teacher={settings['teacher']} is not: set transform.teacher=ema")
        requires = {"self_scoring": f"transform.teacher={settings['teacher']}"}
        if settings["teacher"] == "base":
            requires["reference_model"] = "transform.teacher=base"
        excludes = {"episodes": "self-distillation re-prompts single-turn completions (choose env=none)"}
        if estimator == "full":
            requires["local_loss"] = ("transform.estimator=full adds the self-teacher's divergence to the loss, which "
                                      "the trainer computes itself")
            excludes["masked_token_mean"] = ("the self-teacher's divergence would be rescaled with the policy loss's: "
                                             "choose another correction (token_tis, seq_tis, none) or aggregation")
            excludes["teacher_support"] = ("distill.estimator=full hands the loss a teacher's top-k too, and a step "
                                           "carries one: set distill.estimator=sampled or transform.estimator=sampled")
        return Needs(requires=requires, errors=tuple(errors), excludes=excludes)

    def __init__(self, *, context: str, teacher: str, weight: float, success_threshold: float, template: str,
                 context_template: str, estimator: str = "sampled", topk: int = 0, beta: float = 1.0,
                 tail: bool = False, ema_rate: float = EMA_RATE) -> None:
        self.teacher = SelfTeacher(context, teacher, float(success_threshold), template, context_template,
                                   float(ema_rate))
        self.weight, self.estimator, self.topk = float(weight), estimator, int(topk)
        self.beta, self.tail = float(beta), bool(tail)

    def support(self, top: tuple[Tensor, Tensor], mask_PG_T: Tensor, context_PG: Tensor) -> TeacherSupport:
        """estimator=full: the self-teacher's top-k as the loss's support, each action token of a row with context
        weighing w / (those tokens), SDPO's token mean over the rows it distils; 0 elsewhere."""
        ids, logprobs = top
        scored = mask_PG_T & context_PG[:, None]
        weight = scored.float() * (self.weight / max(int(scored.sum()), 1))
        return TeacherSupport(ids, logprobs, weight, self.beta, self.tail)

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        if signals.self_teacher_PG_T is None:
            raise ValueError("transform=sdpo|sdft reads self_teacher_PG_T, the self-teacher's log-probabilities "
                             "(rlvr/stages/credit.py SelfTeach), which these signals lack")
        mask = signals.mask_PG_T
        S = log_ratio(signals.self_teacher_PG_T, signals.logprobs_PG_T, mask)
        rl = per_token(adv_PG, S.dtype) * mask
        if self.estimator == "full":  # the self-teacher's term is in the loss (`support`): the RL credit's share
            adv = rl * (1.0 - self.weight)
        else:
            adv = S * self.weight if self.weight == 1.0 else rl * (1.0 - self.weight) + S * self.weight
        scored = mask & (S != 0).any(-1, keepdim=True)
        return adv, {"self_distill/reverse_kl": reverse_kl(S, scored)}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SDPO(SelfDistill):
    """`transform=sdpo`: the defaults of conf/transform/sdpo.yaml (a successful sibling, the live policy)."""


class SDFT(SelfDistill):
    """`transform=sdft`: the defaults of conf/transform/sdft.yaml (the reference answer, the policy RL started from)."""
