"""The archive's arithmetic (rlvr/discover/archive.py): q, the linear rank prior, PUCT selection, pruning, state."""

import json
import math

import pytest

from rlvr.discover.archive import Archive, capacity


def three_children() -> Archive:
    """root (0.0) with a "12" 0.5, b "345" 0.2, c "6" 0.5 (ids 1, 2, 3), after the first step's two picks."""
    archive = Archive()
    assert archive.select(2, c=1.0) == [0, 0]  # the root alone: repeated; score 0 + 1·1·√1/1 = 1
    for text, reward in (("12", 0.5), ("345", 0.2), ("6", 0.5)):
        archive.add(0, text, reward)
    return archive


def test_q_is_the_entry_or_its_best_descendant():
    archive = three_children()
    root = archive.entries[0]
    assert (root.expansions, root.children, root.best_descendant, root.q) == (2, 3, 0.5, 0.5)
    d = archive.add(2, "34", 0.9)  # under b: b's q 0.2 → 0.9, the root's 0.5 → 0.9
    assert (archive.entries[2].q, archive.entries[0].q, archive.entries[d].depth) == (0.9, 0.9, 2)
    archive.add(2, "3", 0.1)  # a worse child changes no record
    assert (archive.entries[2].best_descendant, archive.best_reward) == (0.9, 0.9)


def test_linear_rank_prior():
    # ranked by reward, ties older first: a (0.5), c (0.5), b (0.2), root (0.0); M = 4, Σ ranks = 10
    assert three_children().priors() == {1: 4 / 10, 3: 3 / 10, 2: 2 / 10, 0: 1 / 10}


def test_puct_scores_and_picks():
    archive = three_children()
    # N = 2 (the root's two expansions); √(1 + N) = √3
    # root: q 0.5 + 1·0.1·√3/(1 + 2) = 0.5577   a: 0.5 + 0.4·√3 = 1.1928   c: 0.5 + 0.3·√3 = 1.0196
    # b:    0.2 + 0.2·√3 = 0.5464
    scores = archive.scores(c=1.0)
    expected = {0: 0.5 + 0.1 * math.sqrt(3) / 3, 1: 0.5 + 0.4 * math.sqrt(3), 3: 0.5 + 0.3 * math.sqrt(3),
                2: 0.2 + 0.2 * math.sqrt(3)}
    assert scores == pytest.approx(expected)
    assert archive.select(3, c=1.0) == [1, 3, 0]  # distinct, highest first
    assert [archive.entries[i].expansions for i in (0, 1, 2, 3)] == [3, 1, 0, 1]
    # c = 0: plain q, ties to the older entry: root (q 0.5, id 0), a (0.5, id 1), c (0.5, id 3)
    assert archive.select(3, c=0.0) == [0, 1, 3]


def test_prune_removes_the_lowest_reward_leaf_never_the_root():
    archive = three_children()
    d = archive.add(2, "3456", 0.1)  # under b (0.2), which stops being a leaf
    e = archive.add(1, "13", 0.5)  # ties c (0.5): the newer leaves first
    # leaves: c 0.5, d 0.1, e 0.5; the cut to 3 removes d (0.1), then b (0.2, a leaf again), then e (0.5, newer than c)
    assert archive.prune(3) == [d, 2, e]
    assert sorted(archive.entries) == [0, 1, 3]
    assert archive.entries[1].children == 0 and archive.entries[0].children == 2
    assert archive.entries[0].best_descendant == 0.5  # the root's record stands
    assert archive.best_reward == 0.5  # never lowered by a prune
    assert archive.prune(0) == [3, 1] and list(archive.entries) == [0]  # a, c tie: the newer first; the root stays


def test_capacity_is_max_of_64_2BG_and_the_setting():
    assert capacity(8, 8, 4096) == 4096
    assert capacity(2, 4, 1) == 64  # 2·2·4 = 16 < 64
    assert capacity(16, 16, 100) == 512  # 2·16·16


def test_state_round_trips_through_json():
    archive = three_children()
    archive.add(3, "67", 0.7)
    archive.prune(4)
    copy = Archive()
    copy.load_state_dict(json.loads(json.dumps(archive.state_dict())))
    assert copy.state_dict() == archive.state_dict()
    assert copy.select(2, c=1.0) == archive.select(2, c=1.0)


def test_select_refuses_no_picks():
    with pytest.raises(ValueError, match="cannot pick 0"):
        Archive().select(0, c=1.0)
