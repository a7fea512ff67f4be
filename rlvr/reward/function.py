"""`reward=function`: any Python function `fn(completion: str, reference: str) -> float`, sync or async,
named by its dotted path in `reward.function` (e.g. `my_rewards.contains_answer`).

A custom verifier is then one function plus one YAML file (see the README). Each completion is scored by
one call, and every call is bounded by `timeout_s`; the result is coerced with `float()`.

- An `async def` function is awaited in this process, the calls of a batch concurrently (`asyncio.gather`),
  each under `asyncio.wait_for`, so a function that waits on I/O does not serialise the batch. (Bounded as
  long as it awaits: one that blocks the event loop, `time.sleep` in an async function, is not.)
- A plain (sync) function runs in `workers` worker processes (rlvr/reward/pool.py, the pool `reward=math`
  grades in), each of which imports it by its dotted path (on this process's sys.path, plus the folder this
  process imported its module from), so only strings and floats cross processes. The calls of a batch are
  dealt to the workers one at a time as they come free; a worker whose call runs past `timeout_s` is killed
  (with whatever it started: its process group) and replaced, so a function that hangs, in Python or in C,
  costs one item and `timeout_s` of one worker. Workers start at the first batch (each imports the function
  before it takes work) and persist across batches; `close()` stops them.

Whole-batch bound (sync): N items on W workers with timeout T take at most ceil(N/W) * (T + S), S being a
worker's start-up (spawn, then import the function's module: about 0.3 s here plus the module's own imports;
one past 120 s is an error), plus about 60 us of dispatch per item. Every worker has one call at a time and
gets the next as soon as it answers, so until the queue is empty no worker idles, and each call ends within
T; only a worker whose call timed out pays S, for its replacement's start, so with no timeouts the bound is
ceil(N/W) * T, and one hanging call among quick ones costs the batch about T. The first batch also waits
for every worker to start (one S, in parallel), as does the batch after an interrupted one (see below).
Measured overhead on a busy 2-core machine: 64 trivial calls take about 3-4 ms a batch on 2 workers (8 ms on
one), against 0.01 ms in-process.

The pool tolerates an exception raised in the calling thread while it waits (a stop request's signal
handler abandoning the step): the workers holding calls of the abandoned batch are killed, and the next
batch starts their replacements, or `close()` stops the rest.

A call that raises, or returns something that is not a finite number, scores 0.0 and counts as an error
(the first one of a batch is logged with the function's name); a call past `timeout_s` scores 0.0 and
counts as a timeout (reward/timeout_frac). A sync call whose worker dies (`os._exit`, a segfault) counts as
an error. A function the workers cannot import (the main process could), or a worker that does not start
within 120 s, stops the run with a ConfigError (rlvr/reward/guarded.py would otherwise retry the batch one
completion at a time, each retry starting workers again).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import importlib
import inspect
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.protocols import Needs
from rlvr.reward import pool
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores

log = logging.getLogger("rlvr")
TIMEOUT = object()  # what a call past timeout_s yields
DIED = "its worker process died during the call (os._exit, a crash, or out of memory)"


class FunctionReward:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __init__(self, function: str, timeout_s: float = 60.0, workers: int | None = None) -> None:
        self.fn: Callable = load_function(function)
        params = inspect.signature(self.fn).parameters
        if len(params) < 2:
            raise ValueError(f"reward.function={function!r} must take (completion, reference)")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"reward.timeout_s={timeout_s!r} must be > 0")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"reward.workers={workers!r} must be >= 1, or null for every core")
        self.name = function
        self.timeout_s = float(timeout_s)
        self.pool: pool.GradingPool | None = None
        """The worker processes of a sync function (none for an async one); they start at the first batch."""
        if not inspect.iscoroutinefunction(self.fn):
            warm_up = functools.partial(_prepare, function, _import_root(function))
            self.pool = pool.GradingPool(_call, workers or pool.available_cores(), self.timeout_s, memory_mb=None,
                                         chunk_items=1, prefetch_items=0, warm_up=warm_up)

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        if not completions:
            return Scores([])
        if self.pool is None:
            async def bounded(completion: str, reference: str):
                try:
                    return _outcome(await asyncio.wait_for(self.fn(completion, reference), self.timeout_s))
                except TimeoutError:
                    return TIMEOUT
                except Exception as err:  # noqa: BLE001 - counted below
                    return _outcome(err)

            async def all_of():
                return await asyncio.gather(*(bounded(c, r) for c, r in zip(completions, references)))

            return self._tally(asyncio.run(all_of()))
        items = [(self.name, c, r) for c, r in zip(completions, references)]
        try:
            graded = self.pool.grade(items, range(len(items)))
        except pool.WarmUpFailed as err:
            raise ConfigError(f"reward.function={self.name!r} cannot be imported in a reward worker process "
                              f"(its traceback is printed above): {err.reason}") from err
        except pool.WorkerStartFailed as err:  # not a bad completion: no use scoring them one by one
            raise ConfigError(f"reward.function={self.name!r}: {err}") from err
        return self._tally([_from_pool(*result) for result in graded])

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop when this process ends)."""
        if self.pool is not None:
            self.pool.close()

    def _tally(self, outcomes: list) -> Scores:
        """Scores from each call's outcome: a finite float, TIMEOUT, or (a string) why it failed."""
        values, timeouts, errors, first_error = [], 0, 0, None
        for outcome in outcomes:
            if outcome is TIMEOUT:
                values.append(0.0)
                timeouts += 1
            elif isinstance(outcome, str):
                values.append(0.0)
                errors += 1
                first_error = first_error or outcome
            else:
                values.append(outcome)
        if first_error:
            log.warning("reward.function=%r: %d of %d calls failed, scored 0.0; the first: %s",
                        self.name, errors, len(outcomes), first_error)
        return Scores(values, timeouts=timeouts, errors=errors)


def _outcome(result) -> float | str:
    """The reward as a finite float, or a description of why it is not one."""
    if isinstance(result, BaseException):
        return f"raised {type(result).__name__}: {result}"
    try:
        value = float(result)
    except (TypeError, ValueError, OverflowError):
        return f"returned {result!r}, not a number"
    return value if math.isfinite(value) else f"returned {value}: rewards must be finite numbers"


def _from_pool(value: float, status: str, detail: str = DIED):
    """A worker's answer (or the pool's verdict) as an outcome for `_tally`."""
    return TIMEOUT if status == pool.TIMEOUT else value if status == pool.OK else detail


def _import_root(function: str) -> str | None:
    """The folder `function`'s module is imported from by its dotted name in this process, or None. A worker
    gets this process's sys.path, but a module can be here without its folder on it (pytest's importlib mode
    puts `tests.x.y` in sys.modules so); the worker appends this folder, last, so as to find it the same way."""
    parts = function.split(".")
    for i in range(len(parts) - 1, 0, -1):
        file = getattr(sys.modules.get(".".join(parts[:i])), "__file__", None)
        if file:
            path = Path(file).resolve()
            depth = i if path.stem == "__init__" else i - 1  # a package's folder is one of the name's parts
            return str(path.parents[depth]) if depth < len(path.parents) else None
    return None


def _prepare(function: str, root: str | None) -> None:
    """A worker's warm-up: import the function, before the worker takes work (a failure is a ConfigError)."""
    if root is not None and root not in sys.path:
        sys.path.append(root)
    _load(function)


@functools.cache
def _load(function: str) -> Callable:
    """In a worker: the function at this dotted path (imported once per worker, by its warm-up)."""
    return load_function(function)


def load_function(function: str) -> Callable:
    """The callable at the dotted path `function`: the longest prefix that imports as a module, then attributes
    (`my_rewards.score`, `pkg.mod.Class.method`). Each failure is one ValueError that names the one thing missing
    (no such module; "module X has no function Y", with the nearest name) rather than Hydra's `get_method`, whose
    guesses ("is 'myrew' a package?") and logged copy of the same error said it twice and named the wrong fix."""
    parts = function.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"reward.function={function!r}: expected a dotted path module.function "
                         "(e.g. my_rewards.contains_answer)")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(name)
            break
        except ModuleNotFoundError as err:  # no such module (try a shorter prefix), or one it imports is missing
            if err.name is None or not (name == err.name or name.startswith(err.name + ".")):
                raise ValueError(f"reward.function={function!r} cannot be imported: importing module {name} "
                                 f"raised {type(err).__name__}: {err}") from err
        except Exception as err:  # noqa: BLE001 - the module itself is broken: say so, with its error
            raise ValueError(f"reward.function={function!r} cannot be imported: importing module {name} raised "
                             f"{type(err).__name__}: {err}") from err
    else:
        raise ValueError(f"reward.function={function!r} cannot be imported: no module named {parts[0]!r} on the "
                         "import path (train.py's folder, the installed packages, and PYTHONPATH's folders)")
    for i in range(cut, len(parts)):
        if not hasattr(found, parts[i]):
            raise ValueError(f"reward.function={function!r}: {_owner(found, '.'.join(parts[:i]))} has no function "
                             f"{parts[i]!r}{_nearest(found, parts[i], '.'.join(parts[:i]))}")
        found = getattr(found, parts[i])
    if not callable(found):
        raise ValueError(f"reward.function={function!r} is a {type(found).__name__}, not a function")
    return found


def _owner(found: object, name: str) -> str:
    """`module my_rewards (/path/my_rewards.py)`, or `class Scorer` for an attribute's owner."""
    where = getattr(found, "__file__", None)
    return f"module {name}{f' ({where})' if where else ''}" if inspect.ismodule(found) else (
        f"{type(found).__name__ if not inspect.isclass(found) else 'class'} {name}")


def _nearest(found: object, missing: str, name: str) -> str:
    """` (did you mean <name>.<closest>?)`, else ` (its functions: …)`, from the public callables of `found`."""
    names = sorted(n for n, v in vars(found).items() if callable(v) and not n.startswith("_")) if hasattr(
        found, "__dict__") else []
    close = difflib.get_close_matches(missing, names, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {name}.{close[0]}?)"
    return f" (its functions: {', '.join(names[:20])}{', …' if len(names) > 20 else ''})" if names else (
        " (it defines no functions)")


def _call(function: str, completion: str, reference: str) -> tuple:
    """In a worker: one call, as `(value, OK)` or `(0.0, ERROR, why)` (the pool's grader protocol)."""
    try:
        outcome = _outcome(_load(function)(completion, reference))
    except BaseException as err:  # noqa: BLE001 - SystemExit too: the worker is the function's sandbox
        outcome = _outcome(err)
    return (0.0, pool.ERROR, outcome) if isinstance(outcome, str) else (outcome, pool.OK)
