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

Statuses (counted in `reward/*_frac`): no boxed answer, or an answer math-verify cannot parse → parse
failure; math-verify's own timeout, or the hard bound below → timeout; anything else raised, or a
reference that does not parse → error. All of them score 0.0.

Bounds: math-verify's timeouts are `signal.alarm`, which only works in a main thread (its `parse`/`verify`
raise ValueError elsewhere) and interrupts Python code only: one huge big-integer operation (`9^{9^{9^9}}`)
finishes before the alarm is handled, which can be never. So grading always runs in a `GradingPool`
(`pool.py`): `pool_workers` processes (null = every core this process may use), each grading in its own
main thread with math-verify's alarms, and the parent kills and replaces a worker that spends more than
`item_timeout_s` on one item. Workers are capped at `worker_memory_mb` of address space, so a runaway
expansion fails with MemoryError (an error) instead of exhausting the node. The pool starts at the first
batch (about a second) and lives for the run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache

from rlvr.reward.boxed import extract_boxed
from rlvr.reward.exact import check_pairs
from rlvr.reward.pool import ERROR, OK, PARSE_FAIL, TIMEOUT, GradingPool, available_cores
from rlvr.types import Scores


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


def grade(completion: str, reference: str, parsing_timeout_s: int, verify_timeout_s: int) -> tuple[float, str]:
    """One completion's reward and status; runs in a pool worker's main thread (math-verify's alarms)."""
    from math_verify import verify

    timeouts = _timeout_counter()
    before = timeouts.count
    try:
        answer = extract_boxed(completion)
        if not answer:
            return 0.0, PARSE_FAIL
        gold = _parse_reference(reference, parsing_timeout_s)
        pred = _parse_boxed(answer, parsing_timeout_s) if gold else []
        correct = bool(gold and pred and verify(gold, pred, timeout_seconds=verify_timeout_s))
    except BaseException as err:  # noqa: BLE001 - sympy raises anything on hostile input; counted, scored 0
        if isinstance(err, KeyboardInterrupt | SystemExit):
            raise
        return 0.0, ERROR
    if correct:
        return 1.0, OK
    if timeouts.count > before:  # math-verify returns [] / False on its own timeouts, and logs them
        return 0.0, TIMEOUT
    return 0.0, (ERROR if not gold else PARSE_FAIL if not pred else OK)


class _TimeoutCounter(logging.Handler):
    """Counts math-verify's "Timeout during parsing/comparison" warnings (it returns [] or False on a
    timeout instead of raising), and keeps them off the worker's stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("Timeout during")


@lru_cache(maxsize=1)
def _timeout_counter() -> _TimeoutCounter:
    counter = _TimeoutCounter()
    logger = logging.getLogger("math_verify")
    logger.addHandler(counter)
    logger.propagate = False
    return counter


class MathVerify:
    def __init__(self, parsing_timeout_s: int, verify_timeout_s: int, item_timeout_s: float,
                 pool_workers: int | None, worker_memory_mb: int | None) -> None:
        for name, value in (("parsing_timeout_s", parsing_timeout_s), ("verify_timeout_s", verify_timeout_s)):
            # signal.alarm takes whole seconds; 0/None would switch math-verify's timeout off.
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"reward.{name}={value!r} must be an integer >= 1")
        if not item_timeout_s > 0:
            raise ValueError(f"reward.item_timeout_s={item_timeout_s!r} must be > 0")
        if pool_workers is not None and pool_workers < 1:
            raise ValueError(f"reward.pool_workers={pool_workers!r} must be >= 1, or null for every core")
        if worker_memory_mb is not None and worker_memory_mb < 256:
            raise ValueError(f"reward.worker_memory_mb={worker_memory_mb!r} must be >= 256 (MB), or null")
        self.timeouts = (parsing_timeout_s, verify_timeout_s)
        self.pool = GradingPool(grade, pool_workers or available_cores(), item_timeout_s, worker_memory_mb)

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        graded = self.pool.grade([(c, r, *self.timeouts) for c, r in zip(completions, references)], references)
        statuses = [status for _, status in graded]
        return Scores(
            [value for value, _ in graded],
            timeouts=statuses.count(TIMEOUT),
            errors=statuses.count(ERROR),
            parse_failures=statuses.count(PARSE_FAIL),
        )

    def close(self) -> None:
        """Stop the grading workers (they also stop when this process ends)."""
        self.pool.close()
