"""Real math-verify calls (no mocks), from the main thread and from worker threads."""

import threading
import time
from collections.abc import Callable

import pytest
from reward.hostile import math_reward

from rlvr.reward.math import MathVerify, OverBudget, budget

# (completion, reference, reward) as models write them.
CASES = [
    (r"so $x = \boxed{\frac{1}{2}}$", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    (r"\boxed{2, 1}", "1,2", 1.0),
    (r"\boxed{5 \text{ cm}}", "5", 1.0),  # units in text are dropped
    (r"first \boxed{3}, no wait: \boxed{4}", "4", 1.0),  # last box wins
    (r"first \boxed{4}, no wait: \boxed{3}", "4", 0.0),
    (r"\boxed{4} Therefore we are done.", "4", 1.0),  # text after the box
    (r"\boxed{3}", "4", 0.0),
    (r"\boxed{}", "4", 0.0),  # empty box
    ("the answer is 4", "4", 0.0),  # no box
    (r"\boxed{\frac{1}{2", "0.5", 1.0),  # unbalanced: the rest of the text is the answer
    (r"\boxed{4}", "", 0.0),  # empty reference never scores
    (r"\boxed{\text{hello}}", r"\text{world}", 0.0),
]


def score_in_thread(reward: MathVerify, completions: list[str], references: list[str]) -> list[float]:
    out: list[list[float]] = []
    worker = threading.Thread(target=lambda: out.append(reward.score(completions, references).values))
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "MathVerify.score hung in a non-main thread"
    assert out, "MathVerify.score raised in a non-main thread"
    return out[0]


@pytest.fixture(scope="module")
def reward() -> MathVerify:
    reward = math_reward()  # conf/reward/math.yaml's values, 2 workers
    yield reward
    reward.close()


def direct(reward: MathVerify, completions: list[str], references: list[str]) -> list[float]:
    return reward.score(completions, references).values


@pytest.mark.parametrize("call", [direct, score_in_thread], ids=["main_thread", "worker_thread"])
def test_math_verify_cases(reward: MathVerify, call: Callable[..., list[float]]) -> None:
    completions, references, expected = map(list, zip(*CASES, strict=True))
    assert call(reward, completions, references) == expected


def test_statuses_are_counted(reward: MathVerify) -> None:
    # no box and an empty box: parse failures; a reference math-verify cannot read: an error;
    # expanding (x+y+z)^1000 keeps sympy busy past the 1 s CPU budget: a timeout
    scores = reward.score(["no box", r"\boxed{}", r"\boxed{1}", r"\boxed{(x+y+z)^{1000}}", r"\boxed{2}"],
                          ["1", "1", "}{", "-17", "2"])
    assert scores.values == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert (scores.parse_failures, scores.errors, scores.timeouts) == (2, 1, 1)


def test_an_answer_math_verify_could_not_parse_is_a_parse_failure(reward: MathVerify) -> None:
    """math-verify falls back to the raw string when it cannot make a sympy object of an answer; such an
    answer is compared as text only, and counted as a parse failure unless that text is the reference."""
    scores = reward.score([r"\boxed{50\%}", r"\boxed{0.\overline{3}}", r"\boxed{50\%}", r"\boxed{\frac{1}{3}}"],
                          ["0.5", r"\frac{1}{3}", r"50\%", r"\frac{1}{2}"])
    assert scores.values == [0.0, 0.0, 1.0, 0.0]
    assert (scores.parse_failures, scores.errors, scores.timeouts) == (2, 0, 0)  # the last one parsed: wrong


def test_guarded_answers_are_parse_failures_and_references_errors(reward: MathVerify) -> None:
    towers = [r"10^{10^{10^{10}}}", r"2^{2^{2^{2^{2^{2}}}}}", r"(10^{6})!", r"\int_0^\infty e^{-x^2}dx",
              "{" * 50 + "}" * 50]
    n = len(towers)
    start = time.monotonic()
    scores = reward.score([rf"\boxed{{{t}}}" for t in towers] + [r"\boxed{1}"] * n + [rf"\boxed{{{towers[0]}}}"],
                          [r"\frac{1}{2}"] * n + towers + [towers[0]])
    assert time.monotonic() - start < 10  # each refused before sympy sees it (measured: 0.1 s in all)
    assert scores.values == [0.0] * 2 * n + [1.0]  # the same text as the reference is that reference
    assert (scores.parse_failures, scores.errors, scores.timeouts) == (n, n, 0)


def test_verify_timeout_scores_zero(reward: MathVerify) -> None:
    start = time.monotonic()
    assert reward.score([r"\boxed{(x+y+z)^{1000}}", r"\boxed{2}"], ["-17", "2"]).values == [0.0, 1.0]
    assert time.monotonic() - start < 30


def test_the_budget_stops_python_code_after_its_cpu_time() -> None:
    start = time.process_time()
    with pytest.raises(OverBudget), budget(0.2):
        while True:
            pass
    assert 0.15 <= time.process_time() - start < 1.0  # the kernel accounts CPU time in ticks of a few ms


def test_the_pool_starts_once(reward: MathVerify) -> None:
    reward.score([r"\boxed{1}"], ["1"])
    pids = {w.process.pid for w in reward.pool._workers}
    for _ in range(3):
        reward.score([r"\boxed{1}", r"\boxed{2}"] * 4, ["1", "2"] * 4)
    assert {w.process.pid for w in reward.pool._workers} == pids and len(pids) == 2


def test_length_mismatch_names_both_lengths(reward: MathVerify) -> None:
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        reward.score([r"\boxed{1}", r"\boxed{2}"], ["1"])


@pytest.mark.parametrize("bad", [0, None, -1.5, True, "1"])
def test_timeouts_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="reward.verify_timeout_s"):
        math_reward(verify_timeout_s=bad)


@pytest.mark.parametrize(("key", "bad"), [("max_nesting", 0), ("refused_commands", "\\int"),
                                          ("refused_commands", ["int"]), ("chunk_items", 0), ("prefetch_items", -1)])
def test_guard_and_scheduling_settings_are_checked(key: str, bad: object) -> None:
    with pytest.raises(ValueError, match=f"reward.{key}"):
        math_reward(**{key: bad})


def test_the_thread_trap_is_real() -> None:
    # Why the pool exists: math-verify's signal-based timeout refuses to run off the main thread.
    from math_verify import parse

    errors: list[BaseException] = []

    def parse_with_timeout() -> None:
        try:
            parse(r"\boxed{1}", parsing_timeout=5)
        except ValueError as e:
            errors.append(e)

    worker = threading.Thread(target=parse_with_timeout)
    worker.start()
    worker.join(timeout=60)
    assert errors and "threaded environment" in str(errors[0])
