"""The loss as one pure contract (contract.py): `loss(LossInputs) -> LossOutputs` per micro-batch; the forms
(forms.py), the aggregation (aggregation.py), the regularisers (regularizers.py), kl_cov's and clip_cov's whole-step
pick (selection.py), a user's own loss (custom.py), what a service backend computes (support.py)."""

from rlvr.loss.aggregation import agg_loss
from rlvr.loss.contract import Loss, LossInputs, LossOutputs

__all__ = ["Loss", "LossInputs", "LossOutputs", "agg_loss"]
