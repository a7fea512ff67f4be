"""The verifier call the trainer makes: one bad completion never stops a run, and a reward out of range is not
trained on.

A verifier that raises on the batch, or returns the wrong number of rewards, is asked again one completion at a
time; a completion it still fails on scores 0.0 and counts as an error (reward/error_frac). A reward that is not
a finite number within ±`trainer.reward_max_abs` (1e3 unless set) scores 0.0 and counts as an error too, logged
with the reward's name (`reward.function='my.fn'`): the step's advantages, so its gradient, are its rewards less
their group's mean, and one reward of 1e9 (a sentinel, a unit mistake) would swamp every other group's signal,
or overflow further on, where the run would then stop blaming the learning rate. A ConfigError (the verifier
cannot work at all, e.g. no API key) stops the run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rlvr.errors import ConfigError
from rlvr.protocols import Reward
from rlvr.types import Scores

log = logging.getLogger("rlvr")

MAX_ABS = 1e3
"""`trainer.reward_max_abs` unless set (and for a config stored before it existed): far above any verifier's
scale in conf/reward (0 to 1), far below where float32 advantages lose the other groups' signal."""


@dataclass(frozen=True)
class RewardGuard:
    """The range a run's rewards must keep, and the reward's name in the warning when one does not."""

    name: str = "reward"
    max_abs: float = MAX_ABS

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> RewardGuard:
        """The run's, from its composed config: `trainer.reward_max_abs` and the `reward` group's name —
        `reward.function='my.fn'` for a reward that names a function, else `reward <its _target_>`."""
        reward = config.get("reward") or {}
        name = (f"reward.function={reward['function']!r}" if "function" in reward
                else f"reward <{reward.get('_target_', '?')}>")
        return cls(name, config.get("trainer", {}).get("reward_max_abs", MAX_ABS))


def guarded_score(reward: Reward, completions: Sequence[str], references: Sequence[str],
                  guard: RewardGuard = RewardGuard()) -> Scores:
    """The verifier's `Scores`, with one bad completion never stopping the run, and every reward a finite number
    within ±`guard.max_abs` (module docstring)."""
    try:
        scores = reward.score(completions, references)
        if len(scores.values) != len(completions):
            raise ValueError(f"{len(scores.values)} rewards for {len(completions)} completions")
    except ConfigError:  # not a bad completion: the verifier cannot work at all (no API key)
        raise
    except Exception as err:  # noqa: BLE001 - any verifier failure is contained here and counted
        log.warning("%s failed on the batch (%r): scoring one completion at a time", guard.name, err)
        scores = one_at_a_time(reward, completions, references)
    return in_range(scores, guard)


def one_at_a_time(reward: Reward, completions: Sequence[str], references: Sequence[str]) -> Scores:
    """Each completion scored alone; one the verifier raises on (or answers with other than one reward) scores 0.0
    and counts as an error."""
    parts = []
    for completion, reference in zip(completions, references):
        try:
            part = reward.score([completion], [reference])
            if len(part.values) != 1:
                raise ValueError(part.values)
            parts.append(part)
        except Exception:  # noqa: BLE001
            parts.append(Scores([0.0], errors=1))
    return Scores(
        [p.values[0] for p in parts],
        timeouts=sum(p.timeouts for p in parts),
        errors=sum(p.errors for p in parts),
        parse_failures=sum(p.parse_failures for p in parts),
    )


def in_range(scores: Scores, guard: RewardGuard) -> Scores:
    """`scores` with each value that is not a finite number within ±`guard.max_abs` scored 0.0 and counted as an
    error, the first of them logged with the reward's name."""
    values = [float(v) if ok(v, guard.max_abs) else 0.0 for v in scores.values]
    bad = [v for v in scores.values if not ok(v, guard.max_abs)]
    if not bad:
        return replace(scores, values=values)
    log.warning("%s returned %r for %d of %d completions: a reward must be a finite number within "
                "±trainer.reward_max_abs=%g; scored 0.0 and counted in reward/error_frac", guard.name, bad[0],
                len(bad), len(values), guard.max_abs)
    return replace(scores, values=values, errors=scores.errors + len(bad))


def ok(value: object, max_abs: float) -> bool:
    """A number (bool included: a verdict), finite, within ±max_abs."""
    return isinstance(value, int | float) and math.isfinite(value) and abs(value) <= max_abs
