"""Per-token uncertainty u_{i,t}: the signal GTPO-family transforms weight token credit by
(docs/algorithms.md#uncertainty).

    surprisal            u = min(−logp, 50)
    predictive_variance  p = clamp(exp(max(logp, −50)), 0, 1);   u = p·(1 − p)
    shannon_entropy      u = min(H, 50)

`logp` is the sampled token's log-probability under the sampling distribution (`signals.logprobs_PG_T`);
`H = −Σ_v p_v log p_v` is the full-distribution entropy of that same temperature-scaled distribution
(`signals.entropy_PG_T`): engine=pytorch's while it samples, else backend=local's no-grad pass with the policy's
weights of the step (rlvr/backend/local.py `entropies`). 50 is retrain's `MAX_SURPRISAL`.

Each transform that uses a signal takes it as a constructor knob `uncertainty: str`, checked at construction
by `check_uncertainty` (an unknown name fails there, naming the allowed ones). Its `needs` (`signal_needs`)
requires the `entropy` capability exactly when the signal is `shannon_entropy`: the run then refuses a choice
where neither the engine nor the backend gives it, and the trainer computes entropies only then.

Everything is elementwise on the padded [P·G, T] tensors, in the input dtype; positions outside
`mask_PG_T` are exactly 0 whatever the padding holds.

Deviation from retrain: retrain also accepted aliases (`nll`, `pred_var`, `entropy`, …), dotted plugin
paths and a `varentropy` name that raised when used; here exactly the three canonical names exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.transform.signals import as_weights
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

MAX_UNCERTAINTY = 50.0
"""retrain's MAX_SURPRISAL: surprisal and entropy are clipped to min(x, 50)."""

UNCERTAINTY_KINDS = ("surprisal", "predictive_variance", "shannon_entropy")


def check_uncertainty(uncertainty: str) -> str:
    """Return `uncertainty` if it names a known signal; raise ValueError naming the allowed ones."""
    if uncertainty not in UNCERTAINTY_KINDS:
        raise ValueError(f"uncertainty={uncertainty!r} is not one of {list(UNCERTAINTY_KINDS)}")
    return uncertainty


def signal_needs(uncertainty: str, planning: bool) -> Needs:
    """A token transform's needs: the engine's full-distribution entropy when its signal is
    `shannon_entropy`, and the planning-token mask when it treats planning tokens apart (`planning`)."""
    requires = {"entropy": f"transform.uncertainty={uncertainty}"} if uncertainty == "shannon_entropy" else {}
    if planning:
        requires["planning_mask"] = "it treats planning tokens apart"
    return Needs(requires=requires)


def token_uncertainty(uncertainty: str, signals: TokenSignals, weights_PG_T: Tensor | None = None) -> Tensor:
    """[P·G, T] uncertainty of each completion token, 0 on padding, in the dtype of the logprobs.

    `weights_PG_T`: the completion mask as 0/1 floats of that dtype, if the caller already has it."""
    logprobs = signals.logprobs_PG_T
    if weights_PG_T is None:
        weights_PG_T = as_weights(signals.mask_PG_T, logprobs.dtype)
    if uncertainty == "surprisal":
        u = torch.neg(logprobs).clamp_(max=MAX_UNCERTAINTY)
    elif uncertainty == "predictive_variance":
        p = logprobs.clamp(min=-MAX_UNCERTAINTY).exp_().clamp_(0.0, 1.0)
        u = p * (1.0 - p)
    elif uncertainty == "shannon_entropy":
        if signals.entropy_PG_T is None:
            raise ValueError(
                "uncertainty='shannon_entropy' needs signals.entropy_PG_T, which is absent: the engine or the "
                "backend must give entropies (the transform's needs require 'entropy', and engine=pytorch or "
                "backend=local provides it); use uncertainty='surprisal' otherwise"
            )
        u = signals.entropy_PG_T.to(logprobs.dtype, copy=True).clamp_(max=MAX_UNCERTAINTY)
    else:
        check_uncertainty(uncertainty)
        raise AssertionError("unreachable")
    if bool(torch.isfinite(u.sum())):
        return u.mul_(weights_PG_T)
    # NaN/inf somewhere (×0 does not clear them): zero the padding exactly, keep real tokens' values
    return torch.where(signals.mask_PG_T, u, 0.0)
