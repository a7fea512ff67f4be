"""Real math-verify calls (no mocks), from the main thread and from worker threads."""

import threading
import time
from collections.abc import Callable

import pytest

from rlvr.reward.math import MathVerify

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
    reward = MathVerify(parsing_timeout_s=5, verify_timeout_s=1, item_timeout_s=20, pool_workers=2,
                        worker_memory_mb=4096)
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
    # comparing 10^(10^10) with 1 makes sympy work until the 1 s alarm: a timeout
    scores = reward.score(["no box", r"\boxed{}", r"\boxed{1}", r"\boxed{1}", r"\boxed{2}"],
                          ["1", "1", "}{", r"10^{10^{10}}", "2"])
    assert scores.values == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert (scores.parse_failures, scores.errors, scores.timeouts) == (2, 1, 1)


def test_verify_timeout_scores_zero(reward: MathVerify) -> None:
    start = time.monotonic()
    assert reward.score([r"\boxed{1}", r"\boxed{2}"], [r"10^{10^{10}}", "2"]).values == [0.0, 1.0]
    assert time.monotonic() - start < 30


def test_the_pool_starts_once(reward: MathVerify) -> None:
    reward.score([r"\boxed{1}"], ["1"])
    pids = {w.process.pid for w in reward.pool._workers}
    for _ in range(3):
        reward.score([r"\boxed{1}", r"\boxed{2}"] * 4, ["1", "2"] * 4)
    assert {w.process.pid for w in reward.pool._workers} == pids and len(pids) == 2


def test_length_mismatch_names_both_lengths(reward: MathVerify) -> None:
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        reward.score([r"\boxed{1}", r"\boxed{2}"], ["1"])


@pytest.mark.parametrize("bad", [0, None, 1.5, True])
def test_timeouts_must_be_whole_positive_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="reward.verify_timeout_s"):
        MathVerify(parsing_timeout_s=5, verify_timeout_s=bad, item_timeout_s=20, pool_workers=1,  # type: ignore
                   worker_memory_mb=None)


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
