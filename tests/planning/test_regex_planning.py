import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.planning.regex import DEFAULT_STRATEGIC_GRAMS, RegexPlanningDetector, piece_text


def _marked(detector: RegexPlanningDetector, pieces: list[str]) -> list[str]:
    return [p for p, m in zip(pieces, detector.detect(pieces), strict=True) if m]


def test_default_grams_are_retrains_eighteen():
    assert len(DEFAULT_STRATEGIC_GRAMS) == 18 and "the key insight" in DEFAULT_STRATEGIC_GRAMS


def test_multi_token_gram_marks_every_covered_token_and_nothing_else():
    # byte-level pieces: "So let me check the sum" → "let me check" covers Ġlet, Ġme, Ġcheck only
    pieces = ["So", "Ġlet", "Ġme", "Ġcheck", "Ġthe", "Ġsum"]
    assert RegexPlanningDetector().detect(pieces) == [0, 1, 1, 1, 0, 0]


def test_word_split_into_sub_tokens_matches():
    # "double check" as Ġdou + ble + Ġcheck (retrain joined sub-words with a space and missed this)
    assert _marked(RegexPlanningDetector(), ["Ġdou", "ble", "Ġcheck", "Ġit"]) == ["Ġdou", "ble", "Ġcheck"]


def test_sentencepiece_markers_case_and_newlines():
    # ▁ is a space; matching ignores case; a newline between gram words is whitespace (\s+)
    detector = RegexPlanningDetector()
    assert _marked(detector, ["▁Notice", "▁THAT", "▁x"]) == ["▁Notice", "▁THAT"]
    assert _marked(detector, ["Let", "Ġme", "Ċ", "think"]) == ["Let", "Ġme", "Ċ", "think"]


def test_overlapping_grams_are_all_found():
    # "wait let me think" holds "wait let me" and "let me think": all four words are marked
    assert RegexPlanningDetector().detect(["Ġwait", "Ġlet", "Ġme", "Ġthink", "."]) == [1, 1, 1, 1, 0]


def test_longer_gram_wins_at_the_same_position():
    # custom grams "let me" and "let me check" both match at "let": the longer one covers "check" too
    detector = RegexPlanningDetector(grams=["let me", "let me check"])
    assert detector.detect(["Ġlet", "Ġme", "Ġcheck", "Ġit"]) == [1, 1, 1, 0]


def test_word_boundaries():
    # \bnotice that\b does not match inside "notice thatch"
    assert RegexPlanningDetector().detect(["Ġnotice", "Ġthatch"]) == [0, 0]


def test_apostrophes_straight_curly_and_byte_level():
    # "that's not right" with ' as its own piece, with a literal ’, and with byte-level âĢĻ (UTF-8 of ’)
    detector = RegexPlanningDetector()
    for apostrophe in ("'", "’", "âĢĻ"):
        assert detector.detect(["Ġthat", apostrophe + "s", "Ġnot", "Ġright"]) == [1, 1, 1, 1]


def test_custom_grams_replace_the_defaults_and_blanks_are_dropped():
    detector = RegexPlanningDetector(grams=["  hmm ", "", "   "])
    assert detector.grams == ("hmm",)
    assert detector.detect(["Ġhmm", ",", "Ġlet", "Ġme", "Ġcheck"]) == [1, 0, 0, 0, 0]


def test_no_grams_mark_nothing_and_empty_completion_is_empty():
    assert RegexPlanningDetector(grams=[]).detect(["Ġlet", "Ġme", "Ġcheck"]) == [0, 0, 0]
    assert RegexPlanningDetector().detect([]) == []


def test_a_string_is_not_a_gram_list():
    with pytest.raises(TypeError, match="list of phrases"):
        RegexPlanningDetector(grams="let me check")


def test_batch_mask_is_padded_with_false():
    detector = RegexPlanningDetector()
    mask = detector.mask([["Ġlet", "Ġme", "Ġcheck"], [], ["Ġok"]], length=4)
    assert mask.dtype == torch.bool
    assert mask.int().tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="completion 0 has 3 tokens, more than length=2"):
        detector.mask([["a", "b", "c"]], length=2)


def test_piece_text():
    assert [piece_text(p) for p in ("Ġa", "▁b", "ĊĊ", "ĉ", "<0x0A>")] == [" a", " b", "\n\n", "\t", "\n"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["Ġlet", "Ġme", "Ġcheck", "Ġthe", "Ġkey", "Ġis", "Ġx", "Ċ", "Ġwait", "ble", "."]),
        max_size=12,
    )
)
def test_marks_are_exactly_the_tokens_overlapping_a_gram(pieces):
    # reference by brute force: a token is planning iff some gram occurrence's character span overlaps it
    import re

    text = "".join(piece_text(p) for p in pieces)
    covered = [False] * len(text)
    for gram in DEFAULT_STRATEGIC_GRAMS:
        pattern = re.compile(r"\b" + r"\s+".join(map(re.escape, gram.split())) + r"\b", re.IGNORECASE)
        for start in range(len(text)):
            match = pattern.match(text, start)
            if match:
                covered[match.start() : match.end()] = [True] * (match.end() - match.start())
    expected, offset = [], 0
    for p in pieces:
        n = len(piece_text(p))
        expected.append(int(any(covered[offset : offset + n])))
        offset += n
    assert RegexPlanningDetector().detect(pieces) == expected
