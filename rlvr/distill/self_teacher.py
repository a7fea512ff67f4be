"""The self-teacher of transform=sdpo and transform=sdft: the policy itself, shown privileged context, scoring the
tokens it sampled without it (docs/algorithms.md#self-distillation).

Each row's context is one of (`context`):

    sibling     the first other completion of its group whose reward ≥ `success_threshold` (SDPO's "successful
                previous attempt": the row itself never counts); a row whose group has no other success gets none
    reference   the data's reference answer (SDFT's expert demonstration; what a verifier that knows the answer
                could tell): every row gets one

A row with context is scored under the prompt `template.format(prompt=…, context=context_template.format(prompt=…,
solution=…))`, encoded as the student's prompts are (the chat template's user turn, or the plain text), with the
row's own completion tokens after it, at the sampling temperature (as SDPO's code divides both passes' logits by it),
by the policy as it is now (`teacher: live`, PRIME-RL's opsd), with an EMA of its trainable weights (`teacher: ema`,
SDPO's: θ_ema ← (1 − ema_rate)·θ_ema + ema_rate·θ each step, before the pass; the backend keeps θ_ema and
checkpoints it) or as RL started (`teacher: base`: the LoRA adapter disabled, or the frozen copy under full
fine-tuning; SDFT's frozen teacher). A row without context keeps its own
sampled log-probabilities: its log-ratio is 0 and, with `weight` 1, it trains nothing (SDPO masks it out).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.model.prompt_encoding import encode_prompts

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.types import Example, Rollouts, TeacherScores

torch = lazy_import("torch")

CONTEXTS = ("sibling", "reference")
TEACHERS = ("live", "base", "ema")
EMA_RATE = 0.05
"""teacher=ema's default rate (SDPO's `teacher_update_rate`)."""


class SelfScoringBackend(Protocol):
    def policy_logprobs(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] log π of every completion token under the policy now (no grad; 0 on padding)."""
        ...

    def reference_logprobs(self, rollouts: Rollouts) -> Tensor:
        """[PG, T] the same under the policy RL started from."""
        ...

    def ema_update(self, rate: float) -> None:
        """θ_ema ← (1 − rate)·θ_ema + rate·θ over the trainable weights (θ_ema = θ the first time): checkpoint state."""
        ...

    def ema_weights(self) -> AbstractContextManager[None]:
        """The trainable weights are θ_ema while the body runs, then θ again, bit for bit."""
        ...

    def self_teacher_scores(self, rollouts: Rollouts, topk: int, reference: bool) -> TeacherScores:
        """The policy's (`reference`: as RL started) scores of the rollouts at their temperature, with its top-k at
        every completion position (rlvr/backend/logprobs.py `score_rows`): estimator=full's support."""
        ...


@dataclass(frozen=True)
class SelfTeacher:
    context: str
    teacher: str
    success_threshold: float
    template: str
    context_template: str
    ema_rate: float = EMA_RATE
    """teacher=ema: the weights' EMA rate, each step."""

    def problems(self) -> list[str]:
        """What is wrong with the settings (`transform.<key>=…` and what is expected)."""
        out = []
        if self.context not in CONTEXTS:
            out.append(f"transform.context={self.context!r}: expected one of {', '.join(CONTEXTS)}")
        if self.teacher not in TEACHERS:
            out.append(f"transform.teacher={self.teacher!r}: expected one of {', '.join(TEACHERS)}")
        rate = self.ema_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
            out.append(f"transform.ema_rate={rate}: expected 0 < rate <= 1 (the EMA teacher's step toward the policy; "
                       "1: the live policy)")
        for key, text, fields in (("template", self.template, ("prompt", "context")),
                                  ("context_template", self.context_template, ("prompt", "solution"))):
            try:
                text.format(**dict.fromkeys(fields, ""))
            except (KeyError, IndexError, ValueError) as err:
                out.append(f"transform.{key}={text!r}: expected a format string of {{{'}, {'.join(fields)}}} ({err})")
        if "{context}" not in self.template:
            out.append(f"transform.template={self.template!r} never shows {{context}}: the teacher would see nothing "
                       "the student does not")
        return out

    def contexts(self, examples: Sequence[Example], completions: Sequence[str], rewards: Sequence[float],
                 group_size: int) -> list[str | None]:
        """Per row (prompt-major), its teacher prompt text, or None where it has no context."""
        out: list[str | None] = []
        for r, _ in enumerate(completions):
            p = r // group_size
            example = examples[p]
            if self.context == "reference":
                solution: str | None = example.reference
            else:
                group = range(p * group_size, (p + 1) * group_size)
                solution = next((completions[j] for j in group if j != r and rewards[j] >= self.success_threshold),
                                None)
            out.append(None if solution is None else self.template.format(
                prompt=example.prompt,
                context=self.context_template.format(prompt=example.prompt, solution=solution)))
        return out

    def score(self, backend: Any, tokenizer: Any, rollouts: Rollouts, texts: Sequence[str | None],
              topk: int | None = None) -> tuple[Tensor, tuple[Tensor, Tensor] | None, dict[str, float]]:
        """([PG, T] the self-teacher's log-probabilities of the sampled tokens (the sampled ones where a row has no
        context); with `topk` (estimator=full: k, or the vocabulary's size), ([PG, T, K] its top-k ids, their
        log-probabilities), zeros on rows without context; None without `topk` or when no row has context; the step's
        `self_distill/*` fields)."""
        from dataclasses import replace

        t0 = time.perf_counter()
        rows = [r for r, text in enumerate(texts) if text is not None]
        teacher_PG_T = rollouts.logprobs_PG_T.clone()
        top: tuple[Tensor, Tensor] | None = None
        if rows:
            prompts = encode_prompts(tokenizer, [cast(str, texts[r]) for r in rows])
            check_encodable(tokenizer, prompts, self.template)
            sub = replace(rollouts, prompt_ids_P=prompts, group_size=1, **{
                k: getattr(rollouts, k)[rows] for k in ("tokens_PG_T", "logprobs_PG_T", "mask_PG_T", "finished_PG")},
                entropy_PG_T=None, actions_PG_T=None, turn_PG_T=None, observation_body_PG_T=None, segments_PG=None)
            scorer: SelfScoringBackend = backend
            with scorer.ema_weights() if self.teacher == "ema" else nullcontext():
                if topk is None:
                    lp = scorer.reference_logprobs(sub) if self.teacher == "base" else scorer.policy_logprobs(sub)
                else:
                    scores = scorer.self_teacher_scores(sub, topk, reference=self.teacher == "base")
            if topk is not None:
                assert scores.topk_ids_N_T_K is not None and scores.topk_logprobs_N_T_K is not None, "asked for top-k"
                lp, K = scores.logprobs_N_T, scores.topk_ids_N_T_K.shape[-1]
                ids = torch.zeros(*teacher_PG_T.shape, K, dtype=torch.long)
                top_lp = torch.zeros(*teacher_PG_T.shape, K)
                ids[rows], top_lp[rows] = scores.topk_ids_N_T_K, scores.topk_logprobs_N_T_K.float()
                top = (ids, top_lp)
            teacher_PG_T[rows] = lp.to(teacher_PG_T.dtype).where(sub.mask_PG_T, teacher_PG_T.new_zeros(()))
        return teacher_PG_T, top, {"self_distill/context_frac": len(rows) / max(len(texts), 1),
                                   "self_distill/teacher_seconds": time.perf_counter() - t0}


def check_template(teacher: SelfTeacher, tokenizer: Any) -> None:
    """At start: the templates' own text, rendered with empty fields, is text the tokenizer can spell."""
    text = teacher.template.format(prompt="", context=teacher.context_template.format(prompt="", solution=""))
    check_encodable(tokenizer, encode_prompts(tokenizer, [text]), teacher.template)


def check_encodable(tokenizer: Any, prompts: list[list[int]], template: str) -> None:
    """A teacher prompt the tokenizer cannot spell (the tiny model's characters are digits, `+` and `=`) is refused:
    its unknown tokens would teach nothing."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and any(unk in p for p in prompts):
        raise ConfigError(f"transform.template={template!r} (with transform.context_template) renders text this "
                          f"tokenizer cannot spell (it becomes {tokenizer.unk_token!r}): use only characters it has, "
                          "for the tiny model, e.g. \"transform.template='{context}{prompt}'\" "
                          "\"transform.context_template='{prompt}{solution}'\" (Hydra reads braces only when quoted)")
