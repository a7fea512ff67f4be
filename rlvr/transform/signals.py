"""Reading what a token-level transform receives: shape checks and masks, shared by the GTPO family.

Contract (rlvr.protocols.Transform): `adv_PG` holds one episode advantage per completion, prompt-major
(row p·G + g), or [P·G, T] token advantages already (a multi-turn episode whose turns got advantages of
their own, rlvr/turn_credit/: A_{i,turn(t)} on action tokens, 0 elsewhere), which the transform weights token
by token as it weights the episode's; `signals` holds [P·G, T] right-padded tensors whose bool `mask_PG_T` marks real
completion tokens. Every group of the step is present, including tied groups whose advantages are 0.
A mismatch fails here, before any arithmetic, with the numbers involved.

Inside the transforms masks are applied by multiplying with 0/1 floats: exact (x·1 = x, x·0 = 0 for
finite x) and, on CPU, several times faster than `torch.where` with a bool condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor
    from torch import dtype as DType

torch = lazy_import("torch")


def check_step(adv_PG: Tensor, signals: TokenSignals) -> None:
    mask = signals.mask_PG_T
    if mask.dim() != 2:
        raise ValueError(f"mask_PG_T must be [P·G, T], got shape {tuple(mask.shape)}")
    rows, _ = mask.shape
    if tuple(adv_PG.shape) not in ((rows,), tuple(mask.shape)):
        raise ValueError(f"adv_PG has shape {tuple(adv_PG.shape)}, expected ({rows},) or {tuple(mask.shape)} to "
                         "match mask_PG_T")
    if tuple(signals.logprobs_PG_T.shape) != tuple(mask.shape):
        raise ValueError(
            f"logprobs_PG_T has shape {tuple(signals.logprobs_PG_T.shape)}, mask_PG_T {tuple(mask.shape)}"
        )
    if signals.group_size < 1 or rows % signals.group_size:
        raise ValueError(f"{rows} rows are not divisible by group_size={signals.group_size}")
    if signals.entropy_PG_T is not None and tuple(signals.entropy_PG_T.shape) != tuple(mask.shape):
        raise ValueError(
            f"entropy_PG_T has shape {tuple(signals.entropy_PG_T.shape)}, mask_PG_T {tuple(mask.shape)}"
        )


def per_token(adv_PG: Tensor, dtype: DType) -> Tensor:
    """[P·G, 1] episode advantages (broadcast over tokens) or the [P·G, T] token ones as given, in `dtype`."""
    adv = adv_PG.to(dtype)
    return adv[:, None] if adv.dim() == 1 else adv


def planning_mask(signals: TokenSignals) -> Tensor:
    """bool [P·G, T] planning tokens, restricted to real completion tokens."""
    planning = signals.planning_PG_T
    if planning is None:
        raise ValueError(
            "this transform needs signals.planning_PG_T (its needs require planning_mask), but none was given"
        )
    if tuple(planning.shape) != tuple(signals.mask_PG_T.shape):
        raise ValueError(
            f"planning_PG_T has shape {tuple(planning.shape)}, mask_PG_T {tuple(signals.mask_PG_T.shape)}"
        )
    return planning.bool() & signals.mask_PG_T


def as_weights(mask_PG_T: Tensor, dtype: DType) -> Tensor:
    """A bool (or 0/1) mask as 0/1 floats of `dtype`. Bool goes through a uint8 view: on CPU
    `bool.to(float)` is ~8× slower than `uint8.to(float)`."""
    if mask_PG_T.dtype == torch.bool:
        return mask_PG_T.view(torch.uint8).to(dtype)
    return mask_PG_T.to(dtype)
