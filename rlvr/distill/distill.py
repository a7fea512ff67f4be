"""The `distill` config node: a frozen teacher whose per-token log-ratio joins the step's credit.

    python train.py algorithm=opd distill=teacher distill.teacher.path=<run folder | export | transformers model>
    python train.py transform=gtpo distill=teacher distill.teacher.path=… distill.coef=0.5     (RL credit + coef·d_t)
    python train.py algorithm=opd distill=server distill.teacher.base_url=http://host:8000/v1 distill.teacher.model=…

Each step the teacher scores the step's completions (one no-grad pass, or one request per row); the credit stage
adds coef · d_t (rlvr/distill/credit.py) to the transform's token advantages, before the algorithm's batch pass and
the cap. `distill.estimator=full` instead hands the backend the teacher's top-k at each action token (its whole
vocabulary at distill.topk=0, a local teacher's), and the loss adds coef × a divergence over them, token-averaged
over the step (rlvr/loss/regularizers.py `distill_kl`; `distill.beta`: 1 the reverse KL, 0 the forward KL, between
the generalised Jensen-Shannon; `distill.tail`: the mass outside the top-k as one more outcome): the student's
probability of every token of the support gets its exact gradient, not the sampled token's alone.
`algorithm=opd` gives no RL credit: the teacher's alone. The teacher is loaded (or its vocabulary asked for) at
start, and a tokenizer that maps a token to another id than the student's is refused there unless `token_map` names
a JSON object {student id: teacher id} that translates every token the student may sample.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.distill.credit import log_ratio, reverse_kl, within_topk
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.types import TeacherSupport

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.distill.teacher import Teacher
    from rlvr.types import Rollouts

torch = lazy_import("torch")

WHOLE_VOCABULARY_MAX = 4096
"""The largest vocabulary distill.estimator=full takes whole (distill.topk=0): 48 KiB a token."""
ESTIMATORS = ("sampled", "full")
"""distill.estimator (and transform=sdpo|sdft's): the sampled token's log-ratio as credit | a divergence over the
teacher's top-k in the loss."""


class Distill:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        from hydra.utils import get_class

        errors = []
        coef = settings.get("coef")
        if not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef <= 0:
            errors.append(f"distill.coef={coef}: expected a finite number > 0 (distill=none turns distillation off)")
        topk = settings.get("topk", 0)
        if not isinstance(topk, int) or topk < 0:
            errors.append(f"distill.topk={topk}: expected an integer >= 0 (0: the sampled token's exact "
                          "log-probability)")
        estimator = settings.get("estimator", "sampled")
        errors += estimator_problems("distill", estimator, settings.get("beta", 1.0), settings.get("tail", False))
        teacher = settings.get("teacher") or {}
        kind: Any = get_class(teacher["_target_"]) if "_target_" in teacher else None  # a teacher class
        inner = getattr(kind, "needs", None)
        machine = inner(teacher).machine if inner is not None else ()
        if estimator == "full" and topk == 0 and kind is not None and not getattr(kind, "whole_vocabulary", False):
            errors.append("distill.estimator=full with distill.topk=0 asks the teacher for its whole vocabulary at "
                          "every token, which only a local teacher (distill=teacher) gives: set distill.topk=k, at "
                          "most the server's --max-logprobs")
        why = ("distill.estimator=full adds the teacher's KL to the loss, which the trainer computes itself only on "
               "backend=local|fsdp (or use distill.estimator=sampled)")
        requires = {"local_loss": why} if estimator == "full" else {}
        excludes = {"episodes": "distillation scores single-turn completions: a multi-turn row's later turns follow "
                                "prompts the teacher is not shown (choose env=none)"}
        if estimator == "full":
            excludes["masked_token_mean"] = ("the teacher's KL term would be rescaled with the policy loss's: choose "
                                             "another correction (token_tis, seq_tis, none) or aggregation")
        provides = {"teacher", "teacher_support"} if estimator == "full" else {"teacher"}
        return Needs(provides=frozenset(provides), requires=requires, machine=machine, errors=tuple(errors),
                     excludes=excludes)

    def __init__(self, *, teacher: Teacher, coef: float = 1.0, topk: int = 0, token_map: str | None = None,
                 estimator: str = "sampled", beta: float = 1.0, tail: bool = False) -> None:
        if token_map is not None and (topk or estimator == "full"):
            raise ConfigError(f"distill.token_map with distill.topk={topk}, distill.estimator={estimator}: the top-k "
                              "reads the teacher's own token ids, which a map from the student's does not translate "
                              "back (set distill.topk=0 and distill.estimator=sampled)")
        self.teacher, self.coef, self.topk, self.estimator = teacher, float(coef), int(topk), estimator
        self.beta, self.tail = float(beta), bool(tail)
        self.token_map_file = token_map
        self.token_map: Tensor | None = None
        self.vocabulary = 0
        """The student's vocabulary size (`open`): the support of distill.estimator=full at distill.topk=0."""

    def describe(self) -> str:
        return f"{self.teacher.describe()}, coef {self.coef:g}"

    def open(self, student_tokenizer: Any, device: Any = "cpu") -> None:
        """At start: load the teacher (a local one's weights), then refuse a vocabulary that differs from the
        student's unless `token_map` translates the student's ids."""
        self.vocabulary = len(student_tokenizer)
        if self.estimator == "full":
            refuse_whole_vocabulary("distill", self.topk, self.vocabulary)
        self.teacher.load(device)
        if self.token_map_file is not None:
            self.token_map = read_token_map(Path(self.token_map_file), len(student_tokenizer))
            return
        difference = self.teacher.vocabulary_check(student_tokenizer)
        if difference is not None:
            raise ConfigError(f"distill.teacher ({self.teacher.describe()}) does not tokenize as the student does: "
                              f"{difference}. Give distill.token_map=<a JSON file {{student id: teacher id}}>, or a "
                              "teacher with the student's tokenizer")

    def score(self, rollouts: Rollouts) -> tuple[Tensor | None, TeacherSupport | None, dict[str, float]]:
        """(coef · d_t [PG, T], 0 off action tokens, or None; the teacher's support for the loss (estimator=full), or
        None; the step's `distill/*` fields)."""
        t0, G = time.perf_counter(), rollouts.group_size
        mask = rollouts.action_mask_PG_T
        prompts = [rollouts.prompt_ids_P[r // G] for r in range(mask.shape[0])]
        tokens, lengths = rollouts.tokens_PG_T, rollouts.mask_PG_T.sum(-1).tolist()
        if self.token_map is not None:
            tokens = self.token_map[tokens]
            prompts = [self.token_map[torch.tensor(p, dtype=torch.long)].tolist() for p in prompts]
        full = self.estimator == "full"
        k = (self.topk or self.vocabulary) if full else self.topk
        scores = self.teacher.score(prompts, tokens, lengths, k)
        fields: dict[str, float] = {}
        if self.topk and not full:
            assert scores.topk_ids_N_T_K is not None and scores.topk_logprobs_N_T_K is not None, "asked for top-k"
            teacher_PG_T, found = within_topk(tokens, scores.topk_ids_N_T_K, scores.topk_logprobs_N_T_K)
            fields["distill/topk_hit_frac"] = float((found & mask).sum()) / max(int(mask.sum()), 1)
        else:
            teacher_PG_T = scores.logprobs_N_T
        teacher_PG_T = teacher_PG_T.to(mask.device).where(mask, teacher_PG_T.new_zeros(()))
        d_PG_T = log_ratio(teacher_PG_T, rollouts.logprobs_PG_T, mask)
        fields |= {"distill/reverse_kl": reverse_kl(d_PG_T, mask), "distill/coef": self.coef,
                   "distill/teacher_seconds": time.perf_counter() - t0}
        if not full:
            return self.coef * d_PG_T, None, fields
        assert scores.topk_ids_N_T_K is not None and scores.topk_logprobs_N_T_K is not None, "asked for top-k"
        weight = mask.float() * (self.coef / max(int(mask.sum()), 1))
        return None, TeacherSupport(scores.topk_ids_N_T_K, scores.topk_logprobs_N_T_K.float(), weight, self.beta,
                                    self.tail), fields


def estimator_problems(node: str, estimator: Any, beta: Any, tail: Any) -> list[str]:
    """What is wrong with `<node>.estimator`, `.beta` and `.tail` (distill=…, transform=sdpo|sdft): an estimator of
    `ESTIMATORS`; β in [0, 1] and the tail bucket, which choose the divergence of estimator=full alone."""
    errors = []
    if estimator not in ESTIMATORS:
        errors.append(f"{node}.estimator={estimator!r}: expected one of {', '.join(ESTIMATORS)}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
        errors.append(f"{node}.beta={beta}: expected a number in [0, 1] (1: the reverse KL, 0: the forward KL, "
                      "between: the generalised Jensen-Shannon divergence)")
    elif beta != 1.0 and estimator != "full":
        errors.append(f"{node}.beta={beta:g} chooses the divergence of {node}.estimator=full, which the sampled "
                      f"estimator does not take (its credit is the reverse KL's one-sample estimate): set "
                      f"{node}.estimator=full")
    if not isinstance(tail, bool):
        errors.append(f"{node}.tail={tail}: expected true (the mass outside the top-k as one more outcome) or false "
                      "(renormalised over the top-k)")
    elif tail and estimator != "full":
        errors.append(f"{node}.tail=true keeps the mass outside the top-k in {node}.estimator=full's divergence, "
                      f"which the sampled estimator does not take: set {node}.estimator=full")
    return errors


def refuse_whole_vocabulary(node: str, topk: int, vocabulary: int) -> None:
    """At start: estimator=full with topk=0 keeps the whole vocabulary at every action token, for a vocabulary of at
    most `WHOLE_VOCABULARY_MAX` tokens only."""
    if not topk and vocabulary > WHOLE_VOCABULARY_MAX:
        raise ConfigError(f"{node}.estimator=full with {node}.topk=0 keeps the teacher's whole vocabulary, "
                          f"{vocabulary} ids and log-probabilities (12 bytes each), at every action token of a step: "
                          f"set {node}.topk=k (NeMo-RL's default is 64, SDPO's 100); the whole vocabulary is for "
                          f"vocabularies of at most {WHOLE_VOCABULARY_MAX} tokens")


def read_token_map(path: Path, student_vocab: int) -> Tensor:
    """`distill.token_map`: a JSON object {student id: teacher id} covering every student id, as a lookup tensor."""
    try:
        pairs = {int(k): int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(f"distill.token_map={path}: expected a JSON object {{student id: teacher id}} ({err})"
                          ) from None
    missing = [i for i in range(student_vocab) if i not in pairs]
    if missing:
        raise ConfigError(f"distill.token_map={path} maps no teacher id for {len(missing)} of the student's "
                          f"{student_vocab} token ids (first: {missing[0]}): every id the student may sample needs one")
    return torch.tensor([pairs[i] for i in range(student_vocab)], dtype=torch.long)


def teacher_memory(config: Mapping[str, Any], self_scoring: bool) -> list[str]:
    """What a teacher costs a run (lines for `rlvr plan`), from the composed config (nothing loaded): the teacher
    class's own line (`memory(settings)`: a local teacher's weights and pass, a server's requests), and the
    self-teacher's extra pass when the transform requires `self_scoring` (transform=sdpo|sdft)."""
    from hydra.utils import get_class

    distill = config.get("distill") or {}
    teacher = distill.get("teacher") or {}
    cls: Any = get_class(teacher["_target_"]) if "_target_" in teacher else None  # a teacher class: `memory`
    lines = [cls.memory(teacher)] if cls is not None else []
    if distill.get("estimator") == "full":
        lines.append(f"distill.estimator=full: the teacher's {support_memory(distill)}")
    if self_scoring:
        transform = config.get("transform") or {}
        copy = ("a copy of the trainable weights (their EMA)" if transform.get("teacher") == "ema" else "no copy")
        full = transform.get("estimator") == "full"
        lines.append(f"self-teacher (transform.teacher={transform.get('teacher')}): {copy}, one more no-grad forward "
                     "pass over the rows with context each step"
                     + (f"; transform.estimator=full: its {support_memory(transform)}" if full else ""))
    return lines


def support_memory(node: Mapping[str, Any]) -> str:
    """What estimator=full's support holds (distill=… or transform=sdpo|sdft's `topk`), for `rlvr plan`."""
    return (f"top-k (k = {node.get('topk') or 'the vocabulary'}) ids and log-probabilities at every action token of "
            "the step, 12 bytes each, and the student's whole float32 logits at every action token of a micro-batch, "
            "in its forward and backward pass (backend.micro_batch_size bounds them)")
