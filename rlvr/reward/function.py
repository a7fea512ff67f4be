"""`reward=function`: any Python function `fn(completion: str, reference: str) -> float`, sync or async,
named by its dotted path in `reward.function` (e.g. `my_rewards.contains_answer`).

A custom verifier is then one function plus one YAML file (see the README). Each completion is scored by
one call; an `async def` function is awaited, the calls of a batch concurrently (`asyncio.gather`), so
a function that waits on I/O does not serialise the batch. The result is coerced with `float()`; a
value that is not a finite number is an error naming the function.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Sequence

from hydra.utils import get_method


class FunctionReward:
    def __init__(self, function: str) -> None:
        try:
            self.fn: Callable = get_method(function)
        except Exception as err:  # noqa: BLE001 - any import failure is a config error
            raise ValueError(f"reward.function={function!r} cannot be imported: {err}") from err
        params = inspect.signature(self.fn).parameters
        if len(params) < 2:
            raise ValueError(f"reward.function={function!r} must take (completion, reference)")
        self.name = function

    def score(self, completions: Sequence[str], references: Sequence[str]) -> list[float]:
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references; they must pair up")
        if inspect.iscoroutinefunction(self.fn):
            async def all_of():
                return await asyncio.gather(*(self.fn(c, r) for c, r in zip(completions, references)))

            values = asyncio.run(all_of())
        else:
            values = [self.fn(c, r) for c, r in zip(completions, references)]
        out = [float(v) for v in values]
        bad = [v for v in out if not math.isfinite(v)]
        if bad:
            raise ValueError(f"reward.function={self.name!r} returned {bad[0]}: rewards must be finite numbers")
        return out
