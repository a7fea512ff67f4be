r"""MATH-style answer equivalence as the `math` reward judges it (completion = `\boxed{answer}`).

The expectation is the mathematically right verdict. Where math-verify 0.9.0 gets it wrong the pair stays
in the table as a strict xfail naming what it does, so an upstream fix shows up as an XPASS.
All pairs are graded in one batch (one pool round trip); each pair then asserts on its cached value.
"""

import pytest
from reward.hostile import math_reward


def wrong(reference: str, answer: str, equivalent: bool, why: str):
    mark = pytest.mark.xfail(strict=True, reason=f"math-verify 0.9.0: {why}")
    return pytest.param(reference, answer, equivalent, marks=mark)


# (reference, model answer, equivalent)
PAIRS = [
    # fractions, decimals and their spellings
    (r"\frac{1}{2}", "0.5", True),
    (r"\frac{1}{2}", r"\dfrac{1}{2}", True),
    (r"\frac{1}{2}", r"\tfrac{1}{2}", True),
    (r"\frac{1}{2}", r"\frac12", True),
    (r"\frac{1}{2}", "1/2", True),
    (r"\frac{2}{4}", r"\frac{1}{2}", True),
    (r"\frac{1}{3}", "0.333", False),
    (r"\frac{1}{2}", r"\frac{1}{3}", False),
    (r"\frac{3}{2}", r"\frac{2}{3}", False),
    (r"-\frac{1}{2}", r"\frac{-1}{2}", True),
    (r"-\frac{1}{2}", r"\frac{1}{2}", False),
    (r"\frac{7}{4}", "1.75", True),
    (r"\frac{7}{4}", "1.7", False),
    (r"0.125", r"\frac{1}{8}", True),
    # integers, signs, formatting
    ("5", "5.0", True),
    ("5", "05", True),
    ("5", "-5", False),
    ("-3", "-3", True),
    ("-3", "3", False),
    ("1000", "1,000", True),
    ("1000000", "1{,}000{,}000", True),
    ("1000", "100", False),
    ("12", "21", False),
    ("0", "-0", True),
    ("0", r"\emptyset", False),
    # equations and variable assignments
    ("3", "x=3", True),
    ("3", "x = 3", True),
    ("3", "x=4", False),
    ("y=2x+1", "y=1+2x", True),
    ("y=2x+1", "y=2x-1", False),
    ("x=3", "3", True),
    # radicals
    (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", True),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"\frac{\sqrt{2}}{2}", r"\frac{\sqrt2}2", True),
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    (r"2\sqrt{2}", r"\sqrt{2}", False),
    (r"3\sqrt{3}", r"\sqrt{27}", True),
    (r"3\sqrt{3}", r"\sqrt{18}", False),
    (r"\sqrt[3]{8}", "2", True),
    (r"5+2\sqrt{6}", r"(\sqrt{2}+\sqrt{3})^2", True),
    (r"5+2\sqrt{6}", r"5-2\sqrt{6}", False),
    # pi, e, trigonometry, logarithms
    (r"2\pi", r"\pi \cdot 2", True),
    (r"2\pi", r"\pi", False),
    (r"\frac{\pi}{3}", r"\frac{1}{3}\pi", True),
    (r"\frac{\pi}{3}", r"\frac{\pi}{6}", False),
    (r"\frac{\sqrt{3}}{2}", r"\sin\frac{\pi}{3}", True),
    (r"\frac{\sqrt{3}}{2}", r"\cos\frac{\pi}{3}", False),
    (r"\log_2 8", "3", True),
    (r"\ln e^2", "2", True),
    (r"e^2", r"2e", False),
    # degrees
    ("90", "90^\\circ", True),
    ("90", "90^{\\circ}", True),
    ("90^\\circ", "90", True),
    ("45", "45^\\circ", True),
    ("45^\\circ", "30^\\circ", False),
    # tuples, ordered pairs
    ("(1,2)", "(1, 2)", True),
    ("(1,2)", "(2,1)", False),
    ("(1,-2)", r"\left(1,-2\right)", True),
    ("(3,4,5)", "(3,4,5)", True),
    ("(3,4,5)", "(3,5,4)", False),
    (r"\left(\frac{1}{2}, 3\right)", "(0.5, 3)", True),
    # intervals and unions
    ("[1,3)", "[1,3)", True),
    ("[1,3)", "[1,3]", False),
    ("[1,3)", "(1,3)", False),
    (r"(-\infty,2]", r"(-\infty, 2]", True),
    (r"(-\infty,2]", r"(-\infty,2)", False),
    (r"(-\infty,0)\cup(1,\infty)", r"(-\infty,0) \cup (1,\infty)", True),
    (r"(-\infty,0)\cup(1,\infty)", r"(1,\infty)\cup(-\infty,0)", True),
    (r"(-\infty,0)\cup(1,\infty)", r"(-\infty,0]\cup[1,\infty)", False),
    (r"[2,5]", r"[2,5]\cup[5,5]", True),
    # sets and lists of solutions
    (r"\{1,2\}", r"\{2,1\}", True),
    (r"\{1,2\}", r"\{1,2,3\}", False),
    ("1,2", "2,1", True),
    ("1,2", "1", False),
    ("-2, 3", "3, -2", True),
    ("-2, 3", "2, -3", False),
    # matrices and vectors
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True),
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{bmatrix}1&2\\3&4\end{bmatrix}", True),
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&3\\2&4\end{pmatrix}", False),
    (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix}1\\-2\end{pmatrix}", False),
    (r"\begin{pmatrix}\frac{1}{2}\\0\end{pmatrix}", r"\begin{pmatrix}0.5\\0\end{pmatrix}", True),
    # polynomials and expressions
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("x^2-1", "(x-1)^2", False),
    ("x^2+2x+1", "x^2+2x-1", False),
    ("2x+3", "3+2x", True),
    ("2x+3", "2x+4", False),
    (r"\frac{x+1}{x}", r"1+\frac{1}{x}", True),
    ("a^2b", "ba^2", True),
    ("a^2b", "ab^2", False),
    ("6x^3-x^2", "x^2(6x-1)", True),
    # scientific notation
    (r"3\times 10^5", "300000", True),
    (r"3\times 10^5", "30000", False),
    (r"1.5\times10^{-3}", "0.0015", True),
    (r"1.5\times10^{-3}", "0.015", False),
    # percents
    (r"50\%", r"50\%", True),
    wrong(r"25\%", "0.25", True, r"`\boxed{25\%}` parses to no expression, so a percent only matches itself"),
    (r"50\%", "25", False),
    # text and multiple-choice answers
    (r"\text{(A)}", r"\text{(A)}", True),
    (r"\text{(A)}", "A", True),
    (r"\text{(A)}", r"\text{(B)}", False),
    (r"\text{Monday}", r"\text{Monday}", True),
    (r"\text{Monday}", r"\text{Tuesday}", False),
    (r"\text{odd}", r"\text{even}", False),
    # units
    ("5", r"5\text{ cm}", True),
    ("5", r"5 \text{ cm}^2", True),
    ("10", r"\$10", True),
    ("10", r"\$11", False),
    ("12", r"12\text{ inches}", True),
    # mixed numbers
    (r"\frac{7}{2}", r"3\frac{1}{2}", True),
    (r"\frac{7}{2}", "3.5", True),
    (r"\frac{7}{2}", r"3\frac{1}{3}", False),
    # repeating decimals
    wrong(r"\frac{1}{3}", r"0.\overline{3}", True, r"`\overline` repeating decimals parse to no expression"),
    (r"\frac{1}{3}", r"0.\overline{6}", False),
    # complex numbers
    ("3+4i", "4i+3", True),
    ("3+4i", "3-4i", False),
    wrong("1+i", r"\frac{2}{1-i}", True, "`i` is a plain symbol, not the imaginary unit (sqrt(-1) != i)"),
    # inequalities
    ("x>2", "x>2", True),
    ("x>2", "2<x", True),
    ("x>2", "x\\ge 2", False),
    ("x>2", "x<2", False),
    (r"x\le 5", r"x \leq 5", True),
    # base subscripts
    ("1011_2", "1011_2", True),
    ("1011_2", "1101_2", False),
    wrong("1011_2", "11", True, "the base subscript is dropped: 1011_2 parses as 1011"),
    wrong("1011_2", "1011", False, "the base subscript is dropped: 1011_2 parses as 1011, so it 'equals' 1011"),
    # large exact values
    ("2^{10}", "1024", True),
    ("2^{10}", "1023", False),
    ("10!", "3628800", True),
    (r"\binom{5}{2}", "10", True),
    (r"\binom{5}{2}", "20", False),
]


def _value(pair) -> tuple[str, str, bool]:
    return tuple(pair.values) if hasattr(pair, "values") else pair


@pytest.fixture(scope="module")
def verdicts() -> dict[tuple[str, str], float]:
    pairs = [_value(p) for p in PAIRS]
    reward = math_reward()
    try:
        scores = reward.score([f"\\boxed{{{answer}}}" for _, answer, _ in pairs], [ref for ref, _, _ in pairs])
    finally:
        getattr(reward, "close", lambda: None)()
    values = getattr(scores, "values", scores)  # Scores, or the list the inline version returned
    return {(ref, answer): value for (ref, answer, _), value in zip(pairs, values, strict=True)}


def test_table_is_large_and_balanced() -> None:
    pairs = [_value(p) for p in PAIRS]
    assert len(pairs) >= 100 and len(set((r, a) for r, a, _ in pairs)) == len(pairs)
    assert 0.3 <= sum(not eq for _, _, eq in pairs) / len(pairs) <= 0.5


@pytest.mark.parametrize(("reference", "answer", "equivalent"), PAIRS)
def test_equivalence(verdicts: dict, reference: str, answer: str, equivalent: bool) -> None:
    assert verdicts[(reference, answer)] == float(equivalent), f"\\boxed{{{answer}}} vs reference {reference}"
