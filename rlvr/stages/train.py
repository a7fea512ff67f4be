"""train: the backend's update on the step's rows and advantages (skipped when no token has a non-zero advantage
and echo keeps none); at a step in trainer.capture_steps, written down for `rlvr replay` (rlvr/capture.py). Then
the step's phase times and what it adds to the running totals."""

from __future__ import annotations

from typing import ClassVar

from rlvr.capture import Capture
from rlvr.protocols import Algorithm
from rlvr.stages import Stateless, StepState
from rlvr.telemetry import StepCounts, StepTimes
from rlvr.types import TrainBatch


class Train(Stateless):
    fields: ClassVar[tuple[str, ...]] = ("grad_norm", "clip_fraction", "lr", "local_train_rows", "local_train_wall_s",
                                         "policy/*", "mismatch/*", "rl/optimizer_nonzero_advantage_action_tokens",
                                         "train/nonfinite_skip", "train/nonfinite_weights", "tinker/*", "prime_rl/*")
    """The backend's statistics of the update (`loss` is the record's, 0.0 on a skipped step)."""

    def __init__(self, algorithm: Algorithm, capture: Capture, lr: float, sampled_ahead: bool) -> None:
        self.algorithm, self.capture, self.lr, self.sampled_ahead = algorithm, capture, lr, sampled_ahead

    def apply(self, s: StepState) -> None:
        live, batch, credit = s.live, s.scored, s.credit
        assert credit is not None and s.job is not None, "credit and collect run first"
        if not credit.skipped:
            live.engine.sleep()  # sampling is over until the next sync: a sleeping vLLM gives the trainer its memory
            train = self.capture.train_step(live, s.step, TrainBatch(batch.rollouts, credit.adv_PG_T,
                                                                     credit.echo_PG_T, credit.distill),
                                              self.algorithm.loss, self.lr)
            s.train = {**s.train, **train}
        # The step's time getting its rollouts: syncs and sampling (k ≥ 1: syncs and waiting for the sampler), less
        # what an episode's environment and branch probes took, counted as scoring and credit (refill: plus its
        # later rounds' sampling)
        elsewhere = 0.0 if self.sampled_ahead else s.job.sampled.seconds - batch.sample_seconds
        s.times = StepTimes(s.wait_s - elsewhere, batch.score_seconds, s.credit_s, s.clock.lap())
        s.counts = StepCounts.of(batch.rollouts, batch.rewards_P_G)
