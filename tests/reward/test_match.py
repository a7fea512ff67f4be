import pytest

from rlvr.reward.match import BoxedMatch


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        (r"so the answer is \boxed{42}.", "42", 1.0),
        (r"\boxed{ 42 }", " 42 ", 1.0),  # both sides stripped
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),  # nested braces
        (r"\boxed{\frac{1}{2}}", "0.5", 0.0),  # no maths normalisation
        (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 0.0),
        (r"\boxed{1} wait, no: \boxed{2}", "2", 1.0),  # last box wins
        (r"\boxed{2} wait, no: \boxed{1}", "2", 0.0),
        (r"\boxed{x = 3}", "3", 0.0),
        (r"\boxed{3 \text{ cm}}", r"3 \text{ cm}", 1.0),  # answer with spaces
        (r"\boxed{7} and some text after", "7", 1.0),
        (r"\boxed{\frac{1}{2", r"\frac{1}{2", 1.0),  # unbalanced: rest of text
        ("42", "42", 0.0),  # no box, no answer
        (r"\boxed{}", "42", 0.0),
    ],
)
def test_boxed_match(completion: str, reference: str, reward: float) -> None:
    assert BoxedMatch().score([completion], [reference]).values == [reward]


def test_empty_reference_never_scores() -> None:
    # The predecessor gave 1.0 to the first two (an empty reference paid any completion without a boxed answer;
    # docs/predecessor.md#rewards); we give 0.0 to all.
    scores = BoxedMatch().score(["no box", r"\boxed{}", r"\boxed{1}"], ["", "  ", ""])
    assert (scores.values, scores.parse_failures) == ([0.0, 0.0, 0.0], 2)  # no box, empty box: no answer


def test_batched_and_length_mismatch() -> None:
    assert BoxedMatch().score([r"\boxed{1}", r"\boxed{2}"], ["1", "1"]).values == [1.0, 0.0]
    with pytest.raises(ValueError, match="1 completions but 3 references"):
        BoxedMatch().score(["a"], ["a", "b", "c"])
