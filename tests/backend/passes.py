"""What the loss-term tests of the local backend share (tests/backend/test_echo_loss.py, test_distill_loss.py): one
step's forward and backward passes, as `train_step` runs them, with the gradients they leave."""

from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.types import TrainBatch


def gradients(b: LocalBackend, batch: TrainBatch, loss: PolicyLoss):
    """(the step's rows, its micro-batches, the summed loss statistics, each parameter's gradient), the gradients
    zeroed after."""
    t = b.trainee
    rows = t.step_rows(batch, loss)
    batches = t.micro_batches(rows, range(len(rows.prompts)))
    sums = t.accumulate(loss, rows, batches, None, scale=1.0)
    grads = {n: p.grad.clone() for n, p in b.policy.named_parameters() if p.grad is not None}
    b.policy.zero_grad(set_to_none=True)
    return rows, batches, sums, grads
