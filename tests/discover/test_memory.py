"""The memory block of a discover prompt (rlvr/discover/memory.py) and the demo's graded reward
(rlvr/discover/closeness.py)."""

import pytest

from rlvr.discover.archive import Archive
from rlvr.discover.closeness import Closeness
from rlvr.discover.memory import Memory
from rlvr.errors import ConfigError

TINY = Memory(prompt="{others}{start}", start="{text}=", other="{text}+{percent}+", context_k=2, start_chars=5,
              other_chars=5)


def archive() -> Archive:
    out = Archive()
    for text, reward in (("12", 0.5), ("345", 0.25), ("6", 0.75), ("7", 0.1)):
        out.add(0, text, reward)
    return out


def test_the_compact_block_shows_the_best_others_then_the_start():
    # start "12" (id 1); the others are the 2 best besides it and the root: "6" (0.75), "345" (0.25)
    assert TINY.render("", archive(), 1) == "6+75+345+25+12="
    assert TINY.render("", archive(), 0) == "6+75+12+50+="  # the root: the empty answer
    cut = Memory(prompt="{others}{start}", start="{text}=", other="{text}+", context_k=1, start_chars=1,
                 other_chars=0)
    assert cut.render("", archive(), 2) == "+3="  # texts cut to 1 and 0 characters


def test_the_default_block_is_text_with_rewards():
    prompt = Memory().render("Find 4729.", archive(), 1)
    assert prompt == ("Find 4729.\n\n## Memory\nCurrent answer (reward 0.5000):\n12\n"
                      "Another answer (reward 0.7500):\n6\nAnother answer (reward 0.2500):\n345\n"
                      "Another answer (reward 0.1000):\n7\n\n"
                      "Write an answer that scores higher than the current one.\n")
    assert Memory().start_chars == 1200 and Memory().other_chars == 600 and Memory().context_k == 3


def test_a_bad_format_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"data.memory.other='\{txt\}'"):
        Memory(other="{txt}")
    with pytest.raises(ConfigError, match="data.memory.context_k=-1"):
        Memory(context_k=-1)


def test_closeness_grades_each_digit_of_distance():
    scores = Closeness().score(["4729", "4720", " 4000\n", "12+3", "", "99999999"], ["4729"] * 6)
    # 1 − log10(1 + d)/5: d 0 → 1.0, d 9 → 1 − 1/5 = 0.8, d 729 → 1 − 2.8633/5 = 0.4273, d ≥ 99,999 → 0
    assert scores.values == pytest.approx([1.0, 0.8, 0.42733, 0.0, 0.0, 0.0], abs=1e-5)
    assert scores.parse_failures == 2  # "12+3" and ""
    with pytest.raises(ValueError, match="reward.scale=0"):
        Closeness(scale=0)
