"""Aggregation: how each token's ℓ becomes the step's loss (`algorithm.loss.aggregation`, formulas in
rlvr/algorithm/loss.py). `token_weights` turns the whole step's tokens into each token's weight, once per step,
before any micro-batch; `agg_loss` is the one place a micro-batch's per-token losses become a number."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.loss.contract import LossInputs

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "prompt_mean")


def agg_loss(token_loss: Tensor, inputs: LossInputs) -> Tensor:
    """The micro-batch's share of the step's loss: Σ ℓ over `loss_mask` / `token_count` (token_mean), or Σ w·ℓ over
    it with `loss_weights` (every other aggregation)."""
    if inputs.loss_weights is None:
        return (token_loss * inputs.loss_mask).sum() / inputs.token_count
    return (token_loss * inputs.loss_mask * inputs.loss_weights).sum()


def token_weights(aggregation: str, norm: int, signal_N_T: Tensor, prompt_N: Tensor) -> Tensor | None:
    """[N, T] float: each token's weight w in the step's loss Σ w·ℓ, from the whole step's tokens with A ≠ 0
    (`signal_N_T`; `prompt_N`: each row's prompt index; `norm`: seq_mean_token_sum_norm's divisor); None for
    token_mean, whose sum is divided by the count instead."""
    if aggregation == "token_mean":
        return None
    n_N = signal_N_T.sum(-1).double()
    rows = int((n_N > 0).sum())
    if aggregation == "prompt_mean":
        n_P = torch.zeros(int(prompt_N.max()) + 1 if len(prompt_N) else 0, dtype=torch.float64,
                          device=n_N.device).index_add_(0, prompt_N.to(n_N.device), n_N)
        w_N = 1.0 / (int((n_P > 0).sum()) * n_P[prompt_N.to(n_N.device)])
    elif aggregation == "seq_mean_token_mean":
        w_N = 1.0 / (rows * n_N)
    elif aggregation == "seq_mean_token_sum":
        w_N = torch.full_like(n_N, 1.0 / max(rows, 1))
    else:
        w_N = torch.full_like(n_N, 1.0 / (max(rows, 1) * norm))
    return torch.where(signal_N_T, w_N[:, None], 0.0).float()
