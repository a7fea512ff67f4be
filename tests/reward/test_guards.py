r"""The structural guards of `reward=math` (rlvr/reward/math.py `Guards`), with conf/reward/math.yaml's limits:
no honest answer or reference is refused, the hostile attacks are, and a check is cheap on any text."""

import random
import time

import pytest
from reward.honest import ANSWERS
from reward.hostile import CORPUS, math_settings

from rlvr.data.boxed import extract_boxed
from rlvr.reward.math import Guards, log10_bound, nesting_depth

CONF = math_settings()
GUARDS = Guards(CONF["max_answer_chars"], CONF["max_nesting"], CONF["max_digits"], frozenset(CONF["refused_commands"]))

# Attack payloads the guards let through: no bracket nested past the limit, no huge number, no calculus;
# sympy may still work on them for a while, which the CPU budgets bound (they time out or finish). The
# random megabyte's box closes after 47 characters; a root's index does not make a number bigger.
PASSING_ATTACKS = {"exponential series", "cardano", "(sqrt2+sqrt3+sqrt5)^100", "1.0000001^10^12",
                   "1 MB random latex", "10^10-th root"}
ATTACK_CATEGORIES = {"power tower", "integral", "huge sum", "factorial", "deep nesting", "megabyte box", "radical"}


def test_the_shipped_guards_are_on() -> None:
    assert None not in (GUARDS.max_answer_chars, GUARDS.max_nesting, GUARDS.max_digits) and GUARDS.refused_commands


def test_no_honest_answer_or_reference_is_refused() -> None:
    assert len(ANSWERS) > 400
    refused = {text: GUARDS.reject(text) for text in ANSWERS if GUARDS.reject(text)}
    assert not refused, refused


def test_honest_answers_are_far_from_every_limit() -> None:
    """The margins the limits were chosen with (the YAML comments): at least 2x on each."""
    assert max(map(len, ANSWERS)) * 5 <= GUARDS.max_answer_chars
    assert max(map(nesting_depth, ANSWERS)) * 2 <= GUARDS.max_nesting
    assert max(map(log10_bound, ANSWERS)) * 10 <= GUARDS.max_digits


@pytest.mark.parametrize("category", sorted(ATTACK_CATEGORIES))
def test_attacks_are_refused(category: str) -> None:
    items = [h for h in CORPUS if h.category == category]
    payload = {h.name.rsplit(" vs ", 1)[0]: extract_boxed(h.completion) for h in items}
    passed = {name for name, text in payload.items() if GUARDS.reject(text) is None}
    assert passed <= PASSING_ATTACKS, passed - PASSING_ATTACKS


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (r"2^{2^{2^{2^{2^{2}}}}}", "magnitude"),
        (r"10^{10^{10}}", "magnitude"),
        (r"10^{-10^{10}}", "magnitude"),
        (r"x^{10^{10}}", "magnitude"),
        (r"e^{e^{e^{e^{e}}}}", "magnitude"),
        (r"(10^{6})!", "magnitude"),
        (r"1000000!!", "magnitude"),
        (r"\Gamma(10^{8})", "magnitude"),
        (r"\binom{10^{9}}{10^{8}}", "magnitude"),
        (r"\sum_{k=1}^{10^{12}} k^{k}", "magnitude"),
        (r"\sum_{k=1}^{100} k^{k^{k}}", "magnitude"),  # the index runs to 100, not 3
        (r"\prod_{k=2}^{10^{6}} \frac{k^3-1}{k^3+1}", "magnitude"),
        (r"\sin\left(10^{10^{10}}\right)", "magnitude"),
        ("{" * 9 + "1" + "}" * 9, "nesting"),
        (r"\left(" * 9 + "x" + r"\right)" * 9, "nesting"),
        (r"\int_0^\infty e^{-x^2}dx", "command"),
        (r"\lim_{n\to\infty} n", "command"),
        ("x+" * 600, "length"),
    ],
)
def test_each_check_names_its_reason(text: str, reason: str) -> None:
    assert GUARDS.reject(text) == reason


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [
        ("7", 0.8, 0.9),
        (r"\frac{1}{2}", 0.3, 0.7),
        ("0.001", 2.9, 3.1),  # as far from 1 as 1000
        (r"2^{10}", 3.0, 3.1),
        (r"2^{2007}", 604, 605),
        (r"10!", 6.5, 10.5),  # n! <= n^n
        (r"\frac{\sqrt{2}}{2}", 0.3, 0.7),
        (r"10^{10^{10}}", 0.99e10, 1.01e10),
        ("x", 0.5, 0.5),  # a letter: about 3
        (r"\text{Monday}", 0.5, 0.5),
    ],
)
def test_the_magnitude_estimate(text: str, low: float, high: float) -> None:
    assert low <= log10_bound(text) <= high


def test_nesting_without_brackets_is_refused_too() -> None:
    """`\\sqrt\\sqrt...` nests without a bracket; past what the estimate's recursion can follow it is refused
    (with the shipped length limit such a text is refused for its length first)."""
    no_length_limit = Guards(None, GUARDS.max_nesting, GUARDS.max_digits, GUARDS.refused_commands)
    assert no_length_limit.reject(r"\sqrt" * 2000 + "2") == "nesting"
    assert GUARDS.reject(r"\sqrt" * 2000 + "2") == "length"


def test_off_switches() -> None:
    off = Guards(None, None, None, frozenset())
    assert off.reject("{" * 100 + r"10^{10^{10}}\int" * 1000) is None


def test_the_checks_never_raise_and_are_cheap_on_any_text() -> None:
    rng = random.Random(12)
    alphabet = list("x12^_!{}()[]+-*/=,.&|' \\") + [r"\frac", r"\sqrt", r"\sum", r"\binom", r"\left(", r"\right)",
                                                   r"\text{a}", r"\Gamma", r"\begin{pmatrix}", r"\end", "10^{10}", "!!"]
    texts = ["".join(rng.choices(alphabet, k=rng.randint(1, 300))) for _ in range(2000)]
    texts += [extract_boxed(h.completion) for h in CORPUS] + [h.reference for h in CORPUS]
    start = time.process_time()
    for text in texts:
        assert GUARDS.reject(text) in (None, "length", "nesting", "command", "magnitude")
    assert time.process_time() - start < 5.0  # measured: about 0.5 s for these 3,100 texts
