"""`reward=function`: any Python function `fn(completion: str, reference: str) -> float`, sync or async,
named by its dotted path in `reward.function` (e.g. `my_rewards.contains_answer`).

A custom verifier is then one function plus one YAML file (see the README). Each completion is scored by
one call; an `async def` function is awaited, the calls of a batch concurrently (`asyncio.gather`), each
bounded by `timeout_s`, so a function that waits on I/O does not serialise the batch and one that hangs
does not stall the run. The result is coerced with `float()`.

A call that raises, or returns something that is not a finite number, scores 0.0 and counts as an error
(the first one of a batch is logged with the function's name); an async call past `timeout_s` scores 0.0
and counts as a timeout. A sync function is trusted to return: bound it yourself, or make it async.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hydra.utils import get_method

from rlvr.protocols import Needs
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores

log = logging.getLogger("rlvr")
TIMEOUT = object()  # what a call past timeout_s yields


class FunctionReward:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __init__(self, function: str, timeout_s: float = 60.0) -> None:
        try:
            self.fn: Callable = get_method(function)
        except Exception as err:  # noqa: BLE001 - any import failure is a config error
            raise ValueError(f"reward.function={function!r} cannot be imported: {err}") from err
        params = inspect.signature(self.fn).parameters
        if len(params) < 2:
            raise ValueError(f"reward.function={function!r} must take (completion, reference)")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s={timeout_s!r} must be > 0")
        self.name = function
        self.timeout_s = timeout_s

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        if inspect.iscoroutinefunction(self.fn):
            async def bounded(completion: str, reference: str):
                try:
                    return await asyncio.wait_for(self.fn(completion, reference), self.timeout_s)
                except TimeoutError:
                    return TIMEOUT
                except Exception as err:  # noqa: BLE001 - counted below
                    return err

            async def all_of():
                return await asyncio.gather(*(bounded(c, r) for c, r in zip(completions, references)))

            results = asyncio.run(all_of())
        else:
            results = []
            for completion, reference in zip(completions, references):
                try:
                    results.append(self.fn(completion, reference))
                except Exception as err:  # noqa: BLE001 - counted below
                    results.append(err)
        return self._tally(results)

    def _tally(self, results: list) -> Scores:
        values, timeouts, errors, first_error = [], 0, 0, None
        for result in results:
            if result is TIMEOUT:
                values.append(0.0)
                timeouts += 1
                continue
            value = _finite(result)
            if isinstance(value, str):
                values.append(0.0)
                errors += 1
                first_error = first_error or value
            else:
                values.append(value)
        if first_error:
            log.warning("reward.function=%r: %d of %d calls failed, scored 0.0; the first: %s",
                        self.name, errors, len(results), first_error)
        return Scores(values, timeouts=timeouts, errors=errors)


def _finite(result) -> float | str:
    """The reward as a finite float, or a description of why it is not one."""
    if isinstance(result, BaseException):
        return f"raised {type(result).__name__}: {result}"
    try:
        value = float(result)
    except (TypeError, ValueError):
        return f"returned {result!r}, not a number"
    return value if math.isfinite(value) else f"returned {value}: rewards must be finite numbers"
