"""A user's own losses, loaded by import path in tests/algorithm/test_custom_loss.py (`algorithm.loss._target_=
my_losses.my_loss`), as docs/algorithms.md#your-own-loss shows."""

import torch

from rlvr.algorithm.custom_loss import loss_function
from rlvr.algorithm.loss import PolicyLoss
from rlvr.loss import LossInputs, LossOutputs, agg_loss
from rlvr.loss.forms import ppo


@loss_function
def my_loss(inputs: LossInputs, settings: PolicyLoss) -> LossOutputs:
    """Importance-sampled REINFORCE, −r·A per token, aggregated as configured: the built-in ppo at clip_eps = 0."""
    token_loss = -torch.exp(inputs.trainer_logprobs - inputs.old_logprobs) * inputs.advantages
    loss = agg_loss(token_loss, inputs)
    return LossOutputs(loss, {"loss": loss.detach()})


@loss_function
def doubled(inputs: LossInputs, settings: PolicyLoss) -> LossOutputs:
    """Twice `my_loss`: twice its loss and its gradient."""
    out = my_loss.__wrapped__(inputs, settings)  # the function `loss_function` marked
    return LossOutputs(2 * out.loss, {"loss": 2 * out.metrics["loss"]})


def doubled_ppo(inputs: LossInputs, settings: PolicyLoss) -> LossOutputs:
    """A form of one's own (`algorithm.loss.form=my_losses.doubled_ppo`): twice ppo's per-token ℓ; the whole loss
    weighs, regularises and aggregates it as it does a built-in form."""
    out = ppo(inputs, settings)
    return LossOutputs(2 * out.loss, out.metrics)
