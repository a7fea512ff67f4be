"""bench/guess_feedback.py's counting, on hand-made transcripts of env=guess games (prompt "=", higher "+",
lower "="): a policy that moves with the feedback gets both rates 1, one that ignores it cannot."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "guess_feedback.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_guess_feedback", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def game(*turns: str) -> list[dict]:
    """"=", "5", "+", "8" → the transcript rlvr/rollout/episodes.py writes: the prompt, then policy and env in turn."""
    return [{"role": "env" if i % 2 == 0 else "policy", "text": t} for i, t in enumerate(("=", *turns))]


def counts(bench, games: list[tuple[list[dict], bool]]):
    c = bench.FeedbackCounts()
    for transcript, solved in games:
        c.add(transcript, solved, higher="+", lower="=")
    return c


def test_a_policy_that_follows_the_feedback_has_both_rates_one(bench):
    # bisection from 5: after "+" 7 (> 5), after "=" 2 (< 5); one game solved at once, one solved at turn 3
    c = counts(bench, [(game("5"), True), (game("5", "+", "7"), True), (game("5", "=", "2", "+", "3"), True),
                       (game("5", "+", "7", "+", "8"), False)])
    assert (c.games, c.success) == (4, 1.0 - 1 / 4)
    assert c.rate("higher") == 1.0 and c.rate("lower") == 1.0
    # g2 − g1: after "+" 7 − 5 = +2 twice; after "=" 2 − 5 = −3 once
    assert c.summary()["step_after_higher"] == "+2:2" and c.summary()["step_after_lower"] == "-3:1"


def test_a_policy_that_ignores_the_feedback_cannot_have_both(bench):
    # the same g2 = 7 whatever the feedback: right after "+", wrong after "="
    c = counts(bench, [(game("5", "+", "7", "+", "9"), False), (game("5", "=", "7", "=", "1"), False),
                       (game("5", "=", "7", "=", "2"), False)])
    assert c.rate("higher") == 1.0 and c.rate("lower") == 0.0
    # repeating the first guess moves neither way: both rates 0 (the untrained warm-up's greedy policy)
    c = counts(bench, [(game("4", "+", "4", "+", "4"), False), (game("4", "=", "4", "=", "4"), False)])
    assert c.rate("higher") == 0.0 and c.rate("lower") == 0.0
    assert c.summary()["step_after_higher"] == "+0:1"


def test_degenerate_games(bench):
    # no games; a game solved at the first guess (no second guess); an invalid first action (the game ends);
    # an invalid second action (counted, as neither higher nor lower: x)
    assert math.isnan(bench.FeedbackCounts().success)
    c = counts(bench, [(game("3"), True), (game("x"), False), (game("5", "+", "ab"), False)])
    assert (c.games, c.solved) == (3, 1)
    assert math.isnan(c.rate("lower"))
    assert c.rate("higher") == 0.0 and c.summary()["step_after_higher"] == "x:1"
    assert c.summary()["n_after_higher"] == 1 and c.summary()["n_after_lower"] == 0
