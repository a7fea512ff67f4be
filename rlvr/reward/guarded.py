"""The verifier call the trainer makes: one bad completion never stops a run."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from rlvr.errors import ConfigError
from rlvr.protocols import Reward
from rlvr.types import Scores

log = logging.getLogger("rlvr")


def guarded_score(reward: Reward, completions: Sequence[str], references: Sequence[str]) -> Scores:
    """The verifier's `Scores`, with one bad completion never stopping the run: a verifier that raises on
    the batch, or returns the wrong number of rewards or a non-finite one, is asked again one completion
    at a time; a completion it still fails on scores 0.0 and counts as an error. A ConfigError stops the run."""
    try:
        scores = reward.score(completions, references)
        if len(scores.values) == len(completions) and all(math.isfinite(v) for v in scores.values):
            return scores
        raise ValueError(f"{len(scores.values)} rewards for {len(completions)} completions, or one not finite")
    except ConfigError:  # not a bad completion: the verifier cannot work at all (no API key)
        raise
    except Exception as err:  # noqa: BLE001 - any verifier failure is contained here and counted
        log.warning("reward %s failed on the batch (%r): scoring one completion at a time", type(reward).__name__, err)
    parts = []
    for completion, reference in zip(completions, references):
        try:
            part = reward.score([completion], [reference])
            if len(part.values) != 1 or not math.isfinite(part.values[0]):
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
