r"""`math`: symbolic equivalence of the last boxed answer with math-verify (spec §7 `math`).

Rule, per completion:
1. `answer = extract_boxed(completion)`; an empty answer → 0.0.
2. `gold = parse("\\boxed{" + reference + "}")` and `pred = parse("\\boxed{" + answer + "}")`, both with
   `extraction_config=[LatexExtractionConfig()]` and `parsing_timeout=parsing_timeout_s`; either parse
   empty → 0.0 (so an empty reference never scores 1.0).
3. `verify(gold, pred, timeout_seconds=verify_timeout_s)` → 1.0 if True else 0.0. `verify` is not
   symmetric: the reference goes first.
4. Any exception, including math-verify's `TimeoutException` (a BaseException), → 0.0.

So `\boxed{\frac{1}{2}}` matches `0.5`, `\boxed{\dfrac{1}{2}}` matches `\frac12`, and `\boxed{(x+1)^2}`
matches `x^2+2x+1`. Reference parses are cached per process (an LRU keyed by reference and timeout); a
reference whose parse timed out stays cached as empty, so it scores 0.0 every time (deterministic).

Threads: math-verify's timeouts are `signal.alarm`, which only works in the main thread (its
`parse`/`verify` raise ValueError elsewhere), and switching them off would let one pathological answer
hang the run. So `score` grades inline when called from the main thread, and otherwise sends the batch
to a process pool (spawned lazily, `pool_workers` processes, "spawn" start method because forking a
multi-threaded process can deadlock) whose workers grade in their own main threads with the same
timeouts. The first threaded call pays the workers' start-up (about a second).

Limit: a signal interrupts Python code only; a single C-level computation (one huge big-integer
operation) finishes before the alarm is handled.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from itertools import repeat
from multiprocessing import get_context

from rlvr.reward.boxed import extract_boxed


@lru_cache(maxsize=65536)
def _parse_reference(reference: str, parsing_timeout_s: int) -> list:
    return _parse_boxed(reference, parsing_timeout_s)


def _parse_boxed(answer: str, parsing_timeout_s: int) -> list:
    from math_verify import LatexExtractionConfig, parse

    return parse(
        "\\boxed{" + answer + "}",
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=parsing_timeout_s,
    )


def _grade(completion: str, reference: str, parsing_timeout_s: int, verify_timeout_s: int) -> float:
    """One completion's reward; must run in a main thread (math-verify's alarms)."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        answer = extract_boxed(completion)
        if not answer:
            return 0.0
        gold = _parse_reference(reference, parsing_timeout_s)
        if not gold:
            return 0.0
        pred = _parse_boxed(answer, parsing_timeout_s)
        if not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=verify_timeout_s) else 0.0
    except (Exception, TimeoutException):
        return 0.0


class MathVerify:
    def __init__(self, parsing_timeout_s: int, verify_timeout_s: int, pool_workers: int) -> None:
        for name, value in (
            ("parsing_timeout_s", parsing_timeout_s),
            ("verify_timeout_s", verify_timeout_s),
            ("pool_workers", pool_workers),
        ):
            # signal.alarm takes whole seconds; 0/None would switch math-verify's timeout off.
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"reward.{name}={value!r} must be an integer >= 1")
        self.parsing_timeout_s = parsing_timeout_s
        self.verify_timeout_s = verify_timeout_s
        self.pool_workers = pool_workers
        self._pool: ProcessPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def score(self, completions: Sequence[str], references: Sequence[str]) -> list[float]:
        if len(completions) != len(references):
            raise ValueError(
                f"{len(completions)} completions but {len(references)} references; they must pair up"
            )
        timeouts = (repeat(self.parsing_timeout_s), repeat(self.verify_timeout_s))
        if threading.current_thread() is threading.main_thread():
            return list(map(_grade, completions, references, *timeouts))
        chunksize = max(1, len(completions) // (4 * self.pool_workers))
        return list(self._executor().map(_grade, completions, references, *timeouts, chunksize=chunksize))

    def _executor(self) -> ProcessPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.pool_workers, mp_context=get_context("spawn"))
            return self._pool
