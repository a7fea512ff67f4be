"""A user's own loss, by import path: `algorithm.loss._target_=my_losses.my_loss`
(docs/algorithms.md#the-loss-contract-and-your-own-loss).

`my_loss` is a function of the forms' signature `(inputs: LossInputs, settings: PolicyLoss) -> LossOutputs` that
returns the whole micro-batch's scalar (aggregated with `agg_loss`, or its own way), marked with `@loss_function`:

    @loss_function
    def my_loss(inputs: LossInputs, settings: PolicyLoss) -> LossOutputs:
        token_loss = -torch.exp(inputs.trainer_logprobs - inputs.old_logprobs) * inputs.advantages
        return LossOutputs(agg_loss(token_loss, inputs), {})

Hydra calls the `_target_` with the node's other keys; the mark makes that call return the `PolicyLoss` of those keys
(validated as the built-in's: the advantage cap, the correction, the reference KL, the aggregation weights all
still apply) with `my_loss` as its `custom` loss, which the backend then calls on each micro-batch. Metrics named
like the built-in's (`loss`, `clipped`, …) are reported as theirs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rlvr.algorithm.loss import PolicyLoss
from rlvr.loss.forms import Form


def loss_function(fn: Form) -> Callable[..., PolicyLoss]:
    """`fn` as an `algorithm.loss._target_`: called with the node's keys, the `PolicyLoss` that calls `fn`."""

    @functools.wraps(fn)
    def build(**settings: Any) -> PolicyLoss:
        return PolicyLoss(**settings, custom=fn)

    return build
