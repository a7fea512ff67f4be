import pytest

from rlvr.reward.exact import ExactMatch


def test_exact_match_strips_and_compares_strings() -> None:
    completions = ["42", " 42\n", "42.0", "4 2", "", "x"]
    references = ["42", "42", "42", "42", "42", " x "]
    scores = ExactMatch().score(completions, references)
    assert (scores.values, scores.parse_failures) == ([1.0, 1.0, 0.0, 0.0, 0.0, 1.0], 1)  # the empty one


def test_empty_reference_never_scores() -> None:
    assert ExactMatch().score(["", "  ", "0"], ["", " ", ""]).values == [0.0, 0.0, 0.0]


def test_empty_batch() -> None:
    assert ExactMatch().score([], []).values == []


def test_length_mismatch_names_both_lengths() -> None:
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        ExactMatch().score(["1", "2"], ["1"])
