r"""Honest answers: what `reward=math` must keep grading exactly as before its guards and budgets.

Three sources, each a list of `(reference, completion, reward)` with the reward math-verify 0.9.0 gives:

- `EQUIVALENCE`: the MATH equivalence table of test_math_equivalence.py (131 pairs; its strict xfails keep
  the verdict math-verify really gives, which is what must not change);
- `GSM8K`: GSM8K-style integer references (the number after `####`, commas removed) against completions
  that box the number as models write it (plain, with a thousands comma, with a dollar sign or a unit), or
  box a wrong one;
- `MATH`: MATH-style references (the last `\boxed{}` of a solution: fractions, radicals, intervals,
  matrices, polynomials, trigonometry, text answers, large exact values) against the same answer, an
  equivalent rewrite, or a wrong one.

`ANSWERS` is every reference and every boxed answer of the three, the texts the structural guards must
never reject.
"""

from __future__ import annotations

import random

from reward.test_math_equivalence import PAIRS

from rlvr.data.boxed import extract_boxed


def _box(answer: str) -> str:
    return "\\boxed{" + answer + "}"


def _equivalence() -> list[tuple[str, str, float]]:
    out = []
    for pair in PAIRS:
        if hasattr(pair, "values"):  # a strict xfail: math-verify gives the opposite of the right verdict
            reference, answer, equivalent = pair.values
            equivalent = not equivalent
        else:
            reference, answer, equivalent = pair
        out.append((reference, _box(answer), float(equivalent)))
    return out


def _gsm8k() -> list[tuple[str, str, float]]:
    rng = random.Random(8)
    out = []
    for n in [0, 3, 7, 18, 42, 100, 624, 1000, 1234, 5000, 14400, 86400, 250000, 1000000, -3, -12]:
        n += rng.randint(0, 9) if n > 1000 else 0
        comma = f"{n:,}"
        prose = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day. "
        out += [
            (str(n), prose + f"So the answer is {_box(str(n))}.", 1.0),
            (str(n), _box(comma), 1.0),
            (str(n), _box(f"\\${comma}") if n >= 0 else _box(str(n)), 1.0),
            (str(n), _box(f"{n} \\text{{ dollars}}"), 1.0),
            (str(n), _box(str(n + 1)), 0.0),
            (str(n), "I think it is " + str(n), 0.0),  # no box
        ]
    return out


# (reference, an equivalent answer or None, a wrong answer): MATH solutions' boxed answers of every subject.
_MATH_ANSWERS: list[tuple[str, str | None, str]] = [
    (r"\frac{3}{4}", "0.75", r"\frac{4}{3}"),
    (r"2\sqrt{5}", r"\sqrt{20}", r"5\sqrt{2}"),
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", r"\frac{\sqrt{2}}{2}"),
    (r"(-\infty, -2) \cup (3, \infty)", r"(-\infty,-2)\cup(3,\infty)", r"(-2, 3)"),
    (r"\begin{pmatrix} 2 \\ -1 \\ 3 \end{pmatrix}", r"\begin{pmatrix}2\\-1\\3\end{pmatrix}",
     r"\begin{pmatrix} 2 \\ 1 \\ 3 \end{pmatrix}"),
    (r"\begin{pmatrix} \frac{1}{3} & -\frac{2}{3} & \frac{2}{3} \\ \frac{2}{3} & \frac{2}{3} & \frac{1}{3} \\ "
     r"-\frac{2}{3} & \frac{1}{3} & \frac{2}{3} \end{pmatrix}", None,
     r"\begin{pmatrix} 1 & 0 & 0 \\ 0 & 1 & 0 \\ 0 & 0 & 1 \end{pmatrix}"),
    (r"x^2 - 4x + 5", r"(x-2)^2+1", r"x^2+4x+5"),
    (r"\text{(B)}", "B", r"\text{(D)}"),
    (r"8\pi", r"8 \pi", r"4\pi"),
    (r"\frac{25\pi}{4}", r"6.25\pi", r"\frac{25\pi}{2}"),
    (r"10\sqrt{3}", r"\sqrt{300}", r"10\sqrt{2}"),
    (r"-\frac{7}{2}", "-3.5", r"\frac{7}{2}"),
    (r"3 - 2\sqrt{2}", r"(\sqrt{2}-1)^2", r"3 + 2\sqrt{2}"),
    (r"\left( 2, \frac{5 \pi}{3} \right)", r"(2, \frac{5\pi}{3})", r"\left( 2, \frac{\pi}{3} \right)"),
    (r"(1,2,3)", r"(1, 2, 3)", r"(3,2,1)"),
    (r"1\frac{1}{4}", r"\frac{5}{4}", r"\frac{3}{4}"),
    (r"45^\circ", "45", r"135^\circ"),
    (r"-2, 2", r"2, -2", "2"),
    (r"y = -\frac{3}{4} x + 2", r"y=2-\frac{3}{4}x", r"y = \frac{3}{4} x + 2"),
    (r"\sqrt[3]{2}", r"2^{1/3}", r"\sqrt{2}"),
    (r"\frac{1 + \sqrt{5}}{2}", r"\frac{\sqrt{5}+1}{2}", r"\frac{1 - \sqrt{5}}{2}"),
    (r"2 + 2i", r"2i+2", r"2 - 2i"),
    (r"-1 + 3i", r"3i - 1", r"1 - 3i"),
    (r"\frac{\pi}{4}", r"0.25\pi", r"\frac{\pi}{2}"),
    (r"\frac{7\pi}{6}", r"\frac{7}{6}\pi", r"\frac{5\pi}{6}"),
    (r"\left[ -\frac{1}{2}, \frac{1}{2} \right]", r"[-0.5, 0.5]", r"\left( -\frac{1}{2}, \frac{1}{2} \right)"),
    (r"[0, \infty)", r"[0,\infty)", r"(0, \infty)"),
    (r"(-2, 3]", r"(-2,3]", r"[-2, 3]"),
    (r"\frac{17}{2}", "8.5", r"\frac{17}{3}"),
    (r"2 \sqrt{41}", r"\sqrt{164}", r"4 \sqrt{41}"),
    (r"3\sqrt[3]{4}", r"\sqrt[3]{108}", r"3\sqrt[3]{2}"),
    (r"\frac{3 \sqrt{3}}{2}", r"\frac{3}{2}\sqrt{3}", r"\frac{3 \sqrt{2}}{2}"),
    (r"6x^2+30x+36", r"6(x+2)(x+3)", r"6x^2+30x-36"),
    (r"x^4+4", r"(x^2+2x+2)(x^2-2x+2)", r"x^4-4"),
    (r"(x-1)(x+2)(x-3)", r"x^3-2x^2-5x+6", r"(x+1)(x+2)(x-3)"),
    (r"\frac{n(n+1)}{2}", r"\frac{n^2+n}{2}", r"\frac{n(n-1)}{2}"),
    (r"\text{odd}", r"\text{odd}", r"\text{even}"),
    (r"\text{Tuesday}", r"\text{Tuesday}", r"\text{Monday}"),
    (r"\text{(A), (C)}", None, r"\text{(B)}"),
    (r"-\frac{\pi}{6}", r"-\frac{1}{6}\pi", r"\frac{\pi}{6}"),
    (r"\sqrt{10}", r"10^{1/2}", r"\sqrt{11}"),
    (r"\frac{\sqrt{6} - \sqrt{2}}{4}", r"\frac{-\sqrt{2}+\sqrt{6}}{4}", r"\frac{\sqrt{6} + \sqrt{2}}{4}"),
    (r"\sqrt{2 + \sqrt{3}}", r"\frac{\sqrt{6}+\sqrt{2}}{2}", r"\sqrt{2 - \sqrt{3}}"),
    (r"\frac{1}{\sqrt{\sqrt{2}+1}}", None, r"\sqrt{\sqrt{2}+1}"),
    (r"2^{2007}", None, r"2^{2006}"),
    (r"\frac{2^{100}-1}{3}", None, r"\frac{2^{100}+1}{3}"),
    (r"3^{100}", None, r"3^{99}"),
    (r"10^{100}", r"10^{100}", r"10^{99}"),
    (r"2^{2^{2}}", "16", "8"),
    (r"e^{x^2}", r"e^{x^{2}}", r"e^{2x}"),
    (r"2^{n^2}", r"2^{n^{2}}", r"2^{2n}"),
    (r"\binom{10}{3}", "120", "100"),
    (r"\binom{20}{10}", "184756", "184755"),
    (r"10!", "3628800", "3628799"),
    (r"\frac{12!}{2}", "239500800", "239500801"),
    (r"\frac{100!}{98!}", "9900", "9901"),
    (r"2007", "2,007", "2008"),
    (r"1.5 \times 10^{8}", "150000000", "15000000"),
    (r"0.4", r"\frac{2}{5}", "0.04"),
    (r"\$1.50", "1.5", "15"),
    (r"12\%", r"12\%", r"21\%"),
    (r"\frac{1}{2} \log_2 3", r"\log_2 \sqrt{3}", r"2 \log_2 3"),
    (r"\log_2 3", r"\frac{\ln 3}{\ln 2}", r"\log_3 2"),
    (r"\tan 40^\circ", r"\tan 40^\circ", r"\tan 50^\circ"),
    (r"\cos 2x", r"\cos^2 x - \sin^2 x", r"\cos x"),
    (r"\sin^2 x", r"1 - \cos^2 x", r"\cos^2 x"),
    (r"\frac{a+b}{2}", r"\frac{b+a}{2}", r"\frac{a-b}{2}"),
    (r"a^3 b^2", r"b^2 a^3", r"a^2 b^3"),
    (r"x^5 - x^4 + x^3 - x^2 + x - 1", r"(x-1)(x^4+x^2+1)", r"x^5 + x^4 + x^3 + x^2 + x + 1"),
    (r"\{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29\}", None, r"\{1, 3, 5\}"),
    (r"1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20", None, "1, 2, 3"),
    (r"\frac{4\sqrt{2}}{3}", r"\frac{4}{3}\sqrt{2}", r"\frac{4\sqrt{3}}{3}"),
    (r"\sqrt{2}+\sqrt{3}", r"\sqrt{3}+\sqrt{2}", r"\sqrt{5}"),
    (r"5\sqrt{2} - 7", r"-7+5\sqrt{2}", r"7 - 5\sqrt{2}"),
    (r"\frac{9}{4}\pi", r"\frac{9\pi}{4}", r"\frac{9}{2}\pi"),
    (r"y^2 = 4x", r"y^2=4x", r"y^2 = 2x"),
    (r"(x-2)^2 + (y+3)^2 = 25", r"(y+3)^2+(x-2)^2=25", r"(x-2)^2 + (y-3)^2 = 25"),
    (r"\frac{x^2}{9} + \frac{y^2}{4} = 1", None, r"\frac{x^2}{4} + \frac{y^2}{9} = 1"),
    (r"\left( -\frac{1}{3}, \frac{2}{3}, \frac{2}{3} \right)", r"(-1/3, 2/3, 2/3)", r"(1/3, 2/3, 2/3)"),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", None, r"\begin{pmatrix} 4 & 3 \\ 2 & 1 \end{pmatrix}"),
    (r"\begin{pmatrix} -\frac{4}{5} & \frac{3}{5} \\ \frac{3}{5} & \frac{4}{5} \end{pmatrix}",
     r"\begin{pmatrix} -0.8 & 0.6 \\ 0.6 & 0.8 \end{pmatrix}",
     r"\begin{pmatrix} \frac{4}{5} & \frac{3}{5} \\ \frac{3}{5} & -\frac{4}{5} \end{pmatrix}"),
    (r"\sqrt{\frac{3}{2}}", r"\frac{\sqrt{6}}{2}", r"\frac{3}{2}"),
    (r"\frac{1}{2^{10}}", r"\frac{1}{1024}", r"\frac{1}{2^{9}}"),
    (r"\frac{3^{10}-1}{2}", "29524", "29525"),
    (r"\frac{\sqrt{\sqrt{5}-1}}{2}", None, r"\frac{\sqrt{\sqrt{5}+1}}{2}"),
    (r"\frac{1}{4} \left( 1 + \sqrt{2} + \sqrt{4 + 2\sqrt{2}} \right)", None, r"\frac{1}{4}"),
    (r"\sec^2 x", r"1 + \tan^2 x", r"\csc^2 x"),
    (r"\arctan 2", r"\tan^{-1} 2", r"\arctan 3"),
    (r"1 - \frac{\sqrt{2}}{2}", r"\frac{2 - \sqrt{2}}{2}", r"1 + \frac{\sqrt{2}}{2}"),
    (r"x \in [-2, 7]", r"[-2,7]", r"[-7, 2]"),
    (r"\dfrac{5}{12}", r"\frac{5}{12}", r"\frac{7}{12}"),
    (r"\infty", r"\infty", "0"),
    (r"-\infty", r"-\infty", r"\infty"),
    (r"\emptyset", r"\emptyset", "0"),
    (r"k = 3", "3", "4"),
    (r"f^{-1}(x) = \frac{x-3}{2}", None, r"f^{-1}(x) = \frac{x+3}{2}"),
    (r"23_{8}", r"23_8", r"32_8"),
    (r"2^{12} \cdot 3^{5}", "995328", "995327"),
    (r"\frac{(2n)!}{n!(n+1)!}", None, r"\frac{(2n)!}{n!^2}"),
]


def _math() -> list[tuple[str, str, float]]:
    out = []
    for reference, equivalent, wrong in _MATH_ANSWERS:
        out.append((reference, f"The final answer is {_box(reference)}.", 1.0))
        if equivalent is not None:
            out.append((reference, _box(equivalent), 1.0))
        out.append((reference, _box(wrong), 0.0))
    return out


EQUIVALENCE = _equivalence()
GSM8K = _gsm8k()
MATH = _math()
ALL = EQUIVALENCE + GSM8K + MATH

ANSWERS: list[str] = sorted({text for reference, completion, _ in ALL for text in (reference, extract_boxed(completion))
                             if text})
"""Every honest reference and boxed answer (non-empty)."""
