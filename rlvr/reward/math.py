r"""`math`: symbolic equivalence of the last boxed answer with math-verify.

Rule, per completion:
1. `answer = extract_boxed(completion)`; an empty answer → 0.0 (a parse failure).
2. The answer is the reference, character for character (after stripping) → 1.0 without asking sympy.
3. Structural guards (below) on the reference, then on the answer: a reference past one → 0.0 (an error),
   an answer past one → 0.0 (a parse failure).
4. `gold = parse("\\boxed{" + reference + "}")` and `pred = parse("\\boxed{" + answer + "}")`, both with
   `extraction_config=[LatexExtractionConfig()]`, each within `parsing_timeout_s`; an empty gold → 0.0 (an
   error, so an empty reference never scores 1.0).
5. `verify(gold, pred)` within `verify_timeout_s` → 1.0 if True else 0.0. `verify` is not symmetric: the
   reference goes first.

So `\boxed{\frac{1}{2}}` matches `0.5`, `\boxed{\dfrac{1}{2}}` matches `\frac12`, and `\boxed{(x+1)^2}`
matches `x^2+2x+1`. Reference parses are cached per process (an LRU keyed by reference and budget); a
reference whose parse ran out of time stays cached as such, so it scores 0.0 every time (deterministic).

Statuses (counted in `reward/*_frac`): no boxed answer, an answer a guard rejects, or a wrong answer that
math-verify could not turn into a sympy object (it then falls back to comparing the raw string) → parse
failure; a parse or comparison past its budget, or the hard bound below → timeout; anything else raised,
or a reference that a guard rejects or that does not parse → error. All of them score 0.0.

Guards (`Guards`): cheap checks on the text, before sympy sees it, of what makes sympy run for minutes or
for ever: more than `max_answer_chars` characters; brackets (`{`, `(`, `[`) nested deeper than
`max_nesting` (latex2sympy's parse time grows fast with bare nesting); a command of `refused_commands`
(integrals and limits: sympy tries to evaluate them); or a number of more than `max_digits` decimal
digits, estimated by `log10_bound` from the structure (powers, factorials, binomials, big sums and
products), with every letter or constant read as a number about 3, so `10^{10^{10}}`, `(10^6)!`,
`x^{10^{10}}` and `\sum_{k=1}^{10^{12}} k^k` are refused. Every honest answer measured stays far below
each limit (`tests/reward/test_guards.py`); conf/reward/math.yaml gives the figures the limits come from.

Budgets: math-verify's own timeouts are `signal.alarm`, whole seconds of wall time only (a float makes
`signal.alarm` raise TypeError, which math-verify swallows: [] / False), per parse and per gold×answer
pair. Here instead `budget` puts a CPU-time timer (`signal.setitimer(ITIMER_PROF)`, fractional seconds)
around each parse and around the whole `verify` call, with math-verify's alarms off: honest answers need
at most a third of a second of CPU (median 8 ms), and CPU time does not run out because the machine is
busy. Like math-verify's alarms, the timers interrupt Python code only, in a main thread only.

Bounds: one huge C-level computation (a big-integer power) finishes before any timer is handled, which
can be never. So grading always runs in a `GradingPool` (`pool.py`): `pool_workers` processes (null =
every core this process may use), each grading in its own main thread, and the parent kills and replaces
a worker that spends more than `item_timeout_s` on one item. Workers are capped at `worker_memory_mb` of
address space, so a runaway expansion fails with MemoryError (an error) instead of exhausting the node.
A worker claims up to `chunk_items` consecutive items with the same reference and is sent them one at a
time, `prefetch_items` ahead; an idle worker takes half of another's unsent claim, so a run of slow items
spreads over the workers instead of holding up one. The pool starts at the first batch (a few seconds:
each worker imports math-verify and grades one answer before it takes work) and lives for the run.
"""

from __future__ import annotations

import logging
import math
import re
import signal
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rlvr.data.boxed import extract_boxed
from rlvr.protocols import Needs
from rlvr.requirements import ChildProbe, Package, pip_dependency
from rlvr.reward.exact import check_pairs
from rlvr.reward.pool import ERROR, OK, PARSE_FAIL, TIMEOUT, GradingPool, available_cores
from rlvr.types import Scores


class OverBudget(BaseException):
    """Raised by `budget`'s timer. A BaseException, so sympy's and math-verify's `except Exception` let it
    through to `grade`."""


@contextmanager
def budget(cpu_seconds: float) -> Iterator[None]:
    """Raise OverBudget in this (main) thread once the process has used `cpu_seconds` of CPU time inside the
    block (ITIMER_PROF: user + system time, so a busy machine does not eat an honest answer's budget)."""

    def expire(signum: int, frame: object) -> None:
        raise OverBudget

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


# ---------------------------------------------------------------------------------------------------------
# Structural guards

ATOM_LOG10 = 0.5
"""A letter or a constant (x, e, π, ∞) counts as a number of about 10^0.5 ≈ 3."""
_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_TOKEN = re.compile(r"\\[a-zA-Z]+|\\.|" + _NUMBER.pattern + r"|\S")
_OPEN = {"{", "(", "[", "\\{", "\\lbrace", "\\langle", "\\lfloor", "\\lceil"}
_CLOSE = {"}", ")", "]", "\\}", "\\rbrace", "\\rangle", "\\rfloor", "\\rceil"}
_SKIP = {"\\left", "\\right", "\\,", "\\;", "\\:", "\\!", "\\ ", "\\quad", "\\qquad", "\\displaystyle", "$",
         "\\big", "\\Big", "\\bigl", "\\bigr", "\\Bigl", "\\Bigr", "\\limits", "'", "\\prime"}
_SEPARATORS = {"+", "-", "=", "<", ">", ",", "&", ";", ":", "|", "\\\\", "\\pm", "\\mp", "\\le", "\\leq", "\\ge",
               "\\geq", "\\ne", "\\neq", "\\lt", "\\gt", "\\cup", "\\cap", "\\setminus", "\\to", "\\in", "\\approx",
               "\\equiv", "\\mid", "\\vert", "\\and", "\\or"}
_TIMES = {"\\cdot", "\\times", "*", "/", "\\div", "\\ast"}
_TEXT = {"\\text", "\\mathrm", "\\textbf", "\\mathbf", "\\textit", "\\mathit", "\\operatorname", "\\mbox",
         "\\textrm", "\\begin", "\\end", "\\mathbb", "\\mathcal"}
_FRACTIONS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"}
_BINOMIALS = {"\\binom", "\\dbinom", "\\tbinom"}
_BIG_OPERATORS = {"\\sum", "\\prod", "\\int", "\\iint", "\\iiint", "\\oint", "\\lim", "\\bigcup", "\\bigcap"}
_EXP_LIMIT = 300.0  # 10**x overflows a float past ~308: from here on a size is infinite


def _power(log10: float) -> float:
    """An upper bound of |value| from an upper bound of log10 |value|."""
    return math.inf if log10 > _EXP_LIMIT else 10.0**log10


def _factorial_log10(log10: float) -> float:
    """log10 bound of n! (and of Γ(n), n!!) for |n| ≤ 10^log10: n! ≤ n^n."""
    n = _power(log10)
    return n * math.log10(n + 1.0) if math.isfinite(n) else math.inf


class _Magnitude:
    """Recursive descent over LaTeX tokens, bounding log10 of how far each value is from 1 (max(|v|, 1/|v|),
    so a tiny number is as big as its reciprocal). Sums: the largest term plus log10 of their count;
    products and quotients: the sum; a^b: log10(a) · |b|; n!: n·log10(n); binomial(n, k) ≤ 2^n; roots,
    logarithms and other functions: no smaller than their argument (sympy builds the argument first);
    \\sum and \\prod over n terms: n times the term, a bound on the work rather than the value."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = [t for t in tokens if t not in _SKIP]
        self.i = 0
        self.atom = ATOM_LOG10  # a letter's size; inside \sum_{k=1}^{n} the index k runs up to n

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        self.i += 1
        return self.tokens[self.i - 1]

    def whole(self) -> float:
        size = self.expr()
        while self.peek() is not None:  # an unmatched closer ends expr(): skip it and read on
            self.take()
            size = max(size, self.expr())
        return size

    def expr(self) -> float:
        terms = []
        while (token := self.peek()) is not None and token not in _CLOSE:
            if token in _SEPARATORS:
                self.take()
                continue
            terms.append(self.term())
        return max(terms) + math.log10(len(terms)) if terms else 0.0

    def term(self) -> float:
        size = 0.0
        while (token := self.peek()) is not None and token not in _CLOSE and token not in _SEPARATORS:
            if token in _TIMES:
                self.take()
                continue
            size += self.factor()
        return size

    def factor(self) -> float:
        size = self.primary()
        while (token := self.peek()) in ("^", "_", "!"):
            self.take()
            if token == "^":
                exponent = self.argument()
                size = max(size * _power(exponent), exponent) if size > 0 else exponent
            elif token == "_":
                self.argument()  # a subscript names (x_1, 1011_2, \log_2): it does not scale the value
            else:
                size = _factorial_log10(size)
        return size

    def argument(self) -> float:
        """A command's or a script's argument: a group, or one token (`\\frac12` is 1 over 2)."""
        token = self.peek()
        if token is None:
            return 0.0
        if token[0].isdigit() and len(token) > 1:  # one digit only; the rest is read later
            self.tokens[self.i] = token[1:]
            return abs(math.log10(int(token[0]))) if token[0] != "0" else 0.0
        return self.primary()

    def group(self) -> float:
        self.take()
        size = self.expr()
        if self.peek() in _CLOSE:
            self.take()
        return size

    def primary(self) -> float:
        token = self.peek()
        if token is None or token in _CLOSE:
            return 0.0
        if token in _OPEN:
            return self.group()
        self.take()
        if _NUMBER.fullmatch(token):
            value = float(token)
            return abs(math.log10(value)) if value > 0 else 0.0
        if token in _FRACTIONS:
            return self.argument() + self.argument()
        if token == "\\sqrt":
            if self.peek() == "[":
                self.group()  # a root's index: the root is no bigger than its radicand
            return self.argument()
        if token in _BINOMIALS:
            n = self.argument()
            self.argument()
            return max(_power(n) * math.log10(2.0), n)
        if token in _TEXT:
            if self.peek() == "{":  # skip the raw text: it is a name, not a value
                depth = 0
                while (inner := self.peek()) is not None:
                    self.take()
                    depth += inner == "{"
                    depth -= inner == "}"
                    if depth == 0:
                        break
            return self.atom
        if token in _BIG_OPERATORS:
            # The work of summing or multiplying `count` terms, not just the value: count × the term's size.
            upper = 0.0
            while self.peek() in ("_", "^"):
                if self.take() == "^":
                    upper = self.argument()
                else:
                    self.argument()
            outer, self.atom = self.atom, max(self.atom, upper)
            body = self.factor() if self.peek() not in (None, *_CLOSE, *_SEPARATORS) else 0.0
            self.atom = outer
            return max(_power(max(upper, ATOM_LOG10)) * max(body, ATOM_LOG10), upper)
        if token == "\\Gamma":
            return _factorial_log10(self.factor())
        if token == "\\exp":
            return max(_power(self.factor()) * math.log10(math.e), 0.0)
        if token.startswith("\\") and token[1:].isalpha() and self.peek() not in (None, *_CLOSE, *_SEPARATORS,
                                                                                     *_TIMES):
            # \sin, \log, \ln, \det, ... (or a constant followed by a factor): at least the argument's size
            return max(self.atom, self.factor())
        return self.atom


def log10_bound(text: str) -> float:
    """An upper bound of log10 of the largest number (or reciprocal) the LaTeX `text` may denote, letters
    and constants read as about 3: `10^{10^{10}}` → 1e10, `(10^{6})!` → 6e6, `\\frac{\\sqrt{2}}{2}` → 0.8;
    a sum or product of n terms as n times its term. Meant for text whose nesting is already bounded (it
    recurses a few frames per level)."""
    return _Magnitude(_TOKEN.findall(text)).whole()


def nesting_depth(text: str) -> int:
    """How deep `{`, `(` and `[` nest (closers of any kind close; a stray closer does not go below 0)."""
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]" and depth:
            depth -= 1
    return deepest


@dataclass(frozen=True)
class Guards:
    """Limits on an answer's (or a reference's) text before sympy sees it; None (or no commands) switches a
    check off."""

    max_answer_chars: int | None
    max_nesting: int | None
    max_digits: int | None
    refused_commands: frozenset[str]

    def reject(self, text: str) -> str | None:
        """Why `text` is refused ("length", "nesting", "command", "magnitude"), or None when it passes.
        Checked in that order, cheapest first, so the magnitude's recursion only sees bounded nesting."""
        if self.max_answer_chars is not None and len(text) > self.max_answer_chars:
            return "length"
        if self.max_nesting is not None and nesting_depth(text) > self.max_nesting:
            return "nesting"
        tokens = _TOKEN.findall(text)
        if self.refused_commands and not self.refused_commands.isdisjoint(tokens):
            return "command"
        if self.max_digits is not None:
            try:
                if not _Magnitude(tokens).whole() <= self.max_digits:  # NaN and inf fail too
                    return "magnitude"
            except RecursionError:  # \sqrt\sqrt\sqrt... without braces nests without a bracket
                return "nesting"
        return None


# ---------------------------------------------------------------------------------------------------------
# Grading


@lru_cache(maxsize=65536)
def _parse_reference(reference: str, parsing_timeout_s: float) -> list | None:
    """math-verify's parse of the reference; None when it ran out of time (cached like any other)."""
    try:
        return _parse_boxed(reference, parsing_timeout_s)
    except OverBudget:
        return None


def _parse_boxed(answer: str, parsing_timeout_s: float) -> list:
    from math_verify import LatexExtractionConfig, parse

    with budget(parsing_timeout_s):
        return parse("\\boxed{" + answer + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)


def _symbolic(parsed: list) -> bool:
    """Whether math-verify turned the text into a sympy object (else it kept only the raw string)."""
    from sympy import Basic, MatrixBase

    return any(isinstance(p, Basic | MatrixBase) for p in parsed)


def grade(completion: str, reference: str, parsing_timeout_s: float, verify_timeout_s: float,
          guards: Guards | None) -> tuple[float, str]:
    """One completion's reward and status; runs in a pool worker's main thread (the budgets' timers)."""
    from math_verify import verify

    try:
        answer = extract_boxed(completion)
        if not answer:
            return 0.0, PARSE_FAIL
        reference = reference.strip()
        if answer == reference:
            return 1.0, OK
        if guards is not None:
            if guards.reject(reference):
                return 0.0, ERROR
            if guards.reject(answer):
                return 0.0, PARSE_FAIL
        gold = _parse_reference(reference, parsing_timeout_s)
        if gold is None:
            return 0.0, TIMEOUT
        if not gold:
            return 0.0, ERROR
        pred = _parse_boxed(answer, parsing_timeout_s)
        with budget(verify_timeout_s):
            correct = bool(pred) and verify(gold, pred, timeout_seconds=None)
    except OverBudget:
        return 0.0, TIMEOUT
    except BaseException as err:  # noqa: BLE001 - sympy raises anything on hostile input; counted, scored 0
        if isinstance(err, KeyboardInterrupt | SystemExit):
            raise
        return 0.0, ERROR
    if correct:
        return 1.0, OK
    return 0.0, (OK if _symbolic(pred) else PARSE_FAIL)


def warm_up() -> None:
    """Run in each worker before it takes work: import math-verify and sympy and grade one answer (loads the
    LaTeX grammar), so the first real item's time bound is not spent on imports; and keep math-verify's
    one-time "Timeout is disabled" warning (its alarms are off on purpose) off the worker's stderr."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    grade("\\boxed{\\frac{1}{2}}", "0.5", 60.0, 60.0, None)


MATH_VERIFY_PROBE = r"from math_verify import parse, verify; print(verify(parse('$\\frac{1}{2}$'), parse('$0.5$')))"
"""A real parse and verify in a child process: 1/2 = 0.5 must come out True."""


MATH_VERIFY_PACKAGE = Package("math_verify", pip_dependency("math-verify==0.9.0"), ("math-verify",))
"""math-verify on the import path: checked by every reward=math run at start (its graders import it later)."""


def math_verify_works() -> ChildProbe:
    """math-verify parses and verifies here (checked by `rlvr doctor`; its alarms need a real main thread)."""
    return ChildProbe("math-verify", MATH_VERIFY_PROBE, "True", 30.0)


class MathVerify:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(math_verify_works(), MATH_VERIFY_PACKAGE))

    def __init__(self, parsing_timeout_s: float, verify_timeout_s: float, item_timeout_s: float,
                 pool_workers: int | None, worker_memory_mb: int | None, max_answer_chars: int | None,
                 max_nesting: int | None, max_digits: int | None, refused_commands: Sequence[str],
                 chunk_items: int, prefetch_items: int) -> None:
        for name, value in (("parsing_timeout_s", parsing_timeout_s), ("verify_timeout_s", verify_timeout_s),
                            ("item_timeout_s", item_timeout_s)):
            # a timer of 0 is no timer at all (setitimer), not "no time"
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"reward.{name}={value!r} must be a number of seconds > 0")
        if pool_workers is not None and pool_workers < 1:
            raise ValueError(f"reward.pool_workers={pool_workers!r} must be >= 1, or null for every core")
        if worker_memory_mb is not None and worker_memory_mb < 256:
            raise ValueError(f"reward.worker_memory_mb={worker_memory_mb!r} must be >= 256 (MB), or null")
        for name, limit in (("max_answer_chars", max_answer_chars), ("max_nesting", max_nesting),
                            ("max_digits", max_digits)):
            if limit is not None and limit < 1:
                raise ValueError(f"reward.{name}={limit!r} must be >= 1, or null to switch the check off")
        if isinstance(refused_commands, str) or any(not _TOKEN.fullmatch(c) or c[0] != "\\" for c in refused_commands):
            raise ValueError(f"reward.refused_commands={refused_commands!r} must be a list of LaTeX commands "
                             "like '\\int'")
        if chunk_items < 1 or prefetch_items < 0:
            raise ValueError(f"reward.chunk_items={chunk_items!r} must be >= 1 and "
                             f"reward.prefetch_items={prefetch_items!r} >= 0")
        guards = Guards(max_answer_chars, max_nesting, max_digits, frozenset(refused_commands))
        self.guards = None if guards == Guards(None, None, None, frozenset()) else guards
        self.timeouts = (float(parsing_timeout_s), float(verify_timeout_s))
        self.pool = GradingPool(grade, pool_workers or available_cores(), item_timeout_s, worker_memory_mb,
                                chunk_items=chunk_items, prefetch_items=prefetch_items, warm_up=warm_up)

    def answer(self, completion: str) -> str | None:
        """The last boxed answer as written (None when there is none): what a sampled evaluation's maj@k votes on,
        as a string (equivalent forms vote apart; rlvr/rollout/sampled_eval.py)."""
        return extract_boxed(completion) or None

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        items = [(c, r, *self.timeouts, self.guards) for c, r in zip(completions, references)]
        graded = self.pool.grade(items, references)
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
