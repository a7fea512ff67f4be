"""One RL step as an ordered list of stages over one `StepState`, built once per run (rlvr/build.py `stages`):

    collect   Collect          the step's examples sampled (now, or ahead: rlvr/overlap.py) and scored
    shape     OverlongShaping  DAPO's soft overlong punishment on the rewards (trainer.overlong)
    select    Select           dynamic sampling: tied groups kept, dropped, or refilled (trainer.dynamic_sampling)
    shape     RewardKL         the reference KL folded into the rewards (algorithm.loss.kl_in_reward)
    credit    Teach            a distillation teacher scores the completions (distill=…)
              SelfTeach        the policy shown privileged context scores them (transform=sdpo|sdft)
              CreditStage      token signals → advantages (algorithm, transform, turn credit), overlong filter,
                               echo's targets
    train     Train            the backend's update (trainer.capture_steps: written down for `rlvr replay`)
    observe   DataObserver     a data source that learns from the scored rows (data=discover's archive)
              NonfiniteGuard   a step whose update was not applied is counted; too many in a row stop the run
              FailureWarning   scoring failures over trainer.reward_warn_frac are said
              Samples          samples/: the first groups of the step
              SyncGuard        is the engine sampling from the trainer's weights? (trainer.sync_check)
              BackPressureStage how many prompts the next step draws (backpressure=usl)
              LearningGuard    a run that cannot learn fails (trainer.max_skipped_steps, max_failed_steps)
    record    Record           the metrics row: metrics.jsonl and the logger

Each stage owns its config node (the component or settings it is built from), one `apply`, the row fields it
writes (`fields`, declared: docs/metrics.md lists them) and its checkpoint state (`state_dict`, whose keys are
top-level keys of the checkpoint's state). A stage (rlvr/components.py `Stage`) reads what earlier stages left in
the `StepState` and adds its own; the trainer (rlvr/trainer.py) runs them in order and never asks what they are.
"""

from __future__ import annotations

from typing import Any

from rlvr.components import Stage, StepState


class Stateless:
    """A stage that keeps nothing across steps."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def run(stages: list[Stage], s: StepState) -> StepState:
    for stage in stages:
        stage.apply(s)
    return s


def declared_fields(stages: list[Stage]) -> list[str]:
    """Every row field the stages write, in the order they run."""
    return [name for stage in stages for name in stage.fields]
