import pytest

from rlvr.data.boxed import extract_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{\sqrt{\frac{a}{b^{2}}}} done", r"\sqrt{\frac{a}{b^{2}}}"),
        (r"first \boxed{1}, then \boxed{2}", "2"),  # the last box wins
        (r"\boxed{ x = 3 }", "x = 3"),  # stripped, inner spaces kept
        (r"\boxed{5} \text{ is the answer, since } \{1, 2\}", "5"),  # text after the box
        (r"\boxed{}", ""),  # empty box
        (r"\boxed{   }", ""),
        ("no box at all", ""),
        ("", ""),
        (r"\boxed{\frac{1}{2", r"\frac{1}{2"),  # unbalanced: the rest of the text
        (r"\boxed{1} and \boxed{2", "2"),  # the last marker starts an unbalanced box
        (r"\boxed 5", ""),  # only the literal `\boxed{` counts
        (r"\boxed {5}", ""),
        (r"\fbox{5}", ""),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces count as braces and balance here
        (r"$\boxed{\dfrac{3}{4}}$", r"\dfrac{3}{4}"),
        ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ],
)
def test_extract_boxed(text: str, expected: str) -> None:
    assert extract_boxed(text) == expected
