"""The per-token distillation credit (docs/algorithms.md#distillation).

On each action token y_t the student sampled, with s_t = log π_student(y_t) (the sampler's log-probability, at the
sampling temperature) and q_t = log π_teacher(y_t) (the teacher's, untempered):

    d_t = q_t − s_t                      the negated one-sample estimate of the reverse KL, KL(π_student ‖ π_teacher),
                                         at the sampled token (on-policy distillation's per-token advantage)

The credit added to the token advantages is coef · d_t (0 off action tokens); its expectation over the student's
own samples is −coef · KL(π_student ‖ π_teacher) at that prefix, so the policy gradient on it lowers that KL.
`distill.topk` = k ≥ 1 reads q_t from the teacher's top-k alone (`within_topk`). Reported: `distill/reverse_kl`
(the mean of s_t − q_t over the step's action tokens), `distill/coef`, `distill/teacher_seconds` and, with top-k,
`distill/topk_hit_frac` (the action tokens found among the teacher's top-k).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

TAIL_FLOOR = 1e-12
"""The least probability the top-k variant gives a token outside the teacher's top-k (its tail mass, floored)."""


def log_ratio(teacher_PG_T: Tensor, student_PG_T: Tensor, mask_PG_T: Tensor) -> Tensor:
    """d_t = q_t − s_t on the tokens of `mask_PG_T`, exactly 0 elsewhere (float32)."""
    d = teacher_PG_T.float() - student_PG_T.float()
    return d.where(mask_PG_T, d.new_zeros(()))


def within_topk(tokens_N_T: Tensor, ids_N_T_K: Tensor, logprobs_N_T_K: Tensor) -> tuple[Tensor, Tensor]:
    """`distill.topk` = k: q_t read from the teacher's k most likely tokens alone (what a server that returns only its
    top-k gives): its log-probability when y_t is among them, else the log of the mass outside them,
    log(1 − Σ_k p_k) (the binary {in the top-k, the rest} split of TRL's server distillation; an upper bound of
    log π_teacher(y_t)), floored at log(1e-12). Returns (q [N, T], whether y_t was in the top-k [N, T])."""
    hit = ids_N_T_K == tokens_N_T[..., None]
    inside = logprobs_N_T_K.float().masked_fill(~hit, float("-inf")).amax(-1)
    tail = torch.log((1.0 - logprobs_N_T_K.float().exp().sum(-1)).clamp(min=TAIL_FLOOR))
    found = hit.any(-1)
    return inside.where(found, tail), found


def reverse_kl(d_PG_T: Tensor, mask_PG_T: Tensor) -> float:
    """The step's mean one-sample reverse KL, mean of −d_t over the action tokens (0 when there are none)."""
    n = int(mask_PG_T.sum())
    return -float(d_PG_T.sum()) / n if n else 0.0
