"""The grading pool with real worker processes: a worker stuck in C is killed at the time bound and
replaced (while the others keep grading), one that dies or runs out of memory costs only its item, the
workers start once, and a run of slow items spreads over the workers."""

import threading
import time

import pytest

from rlvr.reward.pool import ERROR, OK, TIMEOUT, GradingPool, WarmUpFailed, _chunks


@pytest.fixture
def pool():
    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=2, item_timeout_s=2.0, memory_mb=1024, chunk_items=1,
                       prefetch_items=1)
    yield pool
    pool.close()


def grade(pool: GradingPool, items: list[str], keys=None) -> list[tuple[float, str]]:
    return pool.grade([(i,) for i in items], keys or list(range(len(items))))


def test_a_worker_stuck_in_c_is_killed_at_the_bound_and_replaced(pool):
    grade(pool, ["1"])  # workers started
    start = time.monotonic()
    assert grade(pool, ["1", "spin", "0", "1"]) == [(1.0, OK), (0.0, TIMEOUT), (0.0, OK), (1.0, OK)]
    assert time.monotonic() - start < 2.0 + 30  # the bound, plus a replacement's start-up on a busy machine
    assert pool.replaced == 1 and len(pool._workers) == 2
    assert grade(pool, ["1", "0"]) == [(1.0, OK), (0.0, OK)]  # the replacement grades


def test_the_rest_of_a_stuck_workers_chunk_is_graded_elsewhere():
    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=2, item_timeout_s=2.0, memory_mb=None, chunk_items=16,
                       prefetch_items=16)
    try:  # one key → one chunk, sent whole to one worker; it hangs on the second item
        assert grade(pool, ["1", "spin", "1", "0"], keys=["q"] * 4) == [(1.0, OK), (0.0, TIMEOUT), (1.0, OK),
                                                                        (0.0, OK)]
    finally:
        pool.close()


def test_a_worker_that_dies_costs_only_its_item(pool):
    assert grade(pool, ["1", "die", "1"], keys=["q"] * 3) == [(1.0, OK), (0.0, ERROR), (1.0, OK)]
    assert pool.replaced == 1


def test_running_out_of_memory_is_an_error_not_a_dead_node(pool):
    assert grade(pool, ["eat", "1"]) == [(0.0, ERROR), (1.0, OK)]
    assert pool.replaced == 0  # MemoryError is caught in the worker, which carries on


def test_workers_start_once_and_any_thread_may_call():
    import pool_graders

    pool = GradingPool(pool_graders.pid, workers=2, item_timeout_s=10.0, memory_mb=None, chunk_items=1,
                       prefetch_items=1)
    try:
        pids = {v for v, _ in grade(pool, list("abcdefgh"))}
        seen = []
        caller = threading.Thread(target=lambda: seen.extend(v for v, _ in grade(pool, list("abcdefgh"))))
        caller.start()
        caller.join(timeout=60)
        assert set(seen) <= {w.process.pid for w in pool._workers} and len(pool._workers) == 2
        assert pids | set(seen) <= {w.process.pid for w in pool._workers}
    finally:
        pool.close()
    assert not pool._workers


def test_chunks_are_runs_of_one_key_capped():
    assert _chunks(["a", "a", "b", "a"], 16) == [[0, 1], [2], [3]]
    assert [len(c) for c in _chunks(["a"] * 40, 16)] == [16, 16, 8]
    assert _chunks(["a"] * 3, 1) == [[0], [1], [2]]


@pytest.mark.parametrize(("chunk_items", "prefetch_items", "balanced"), [(16, 1, True), (1, 1, True), (16, 16, False)])
def test_a_run_of_slow_items_spreads_over_the_workers(chunk_items: int, prefetch_items: int, balanced: bool):
    """Eight slow items in a row for one reference (a prompt whose G completions are all hostile), then eight
    fast ones. One worker claims all sixteen; the other, with nothing to claim, takes the back half of the
    claim not yet sent, then half of what is left, and so on: the two share the slow ones, in about half
    the slow time. Sent as one chunk (as before issue 12) all eight stay with the worker that claimed them."""
    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=2, item_timeout_s=10.0, memory_mb=None,
                       chunk_items=chunk_items, prefetch_items=prefetch_items)
    try:
        grade(pool, ["1"])  # workers started
        start = time.monotonic()
        assert grade(pool, ["sleep 0.4"] * 8 + ["1"] * 8, keys=["q"] * 16) == [(0.0, OK)] * 8 + [(1.0, OK)] * 8
        elapsed = time.monotonic() - start
    finally:
        pool.close()
    slow_total = 8 * 0.4
    if balanced:
        assert elapsed < 0.75 * slow_total, f"{elapsed:.1f} s: the slow items did not spread"
    else:
        assert elapsed >= slow_total


def test_the_time_bound_is_per_item_with_items_queued_behind():
    """A worker with items queued behind the one it grades gets `item_timeout_s` for each item in turn,
    not for the whole queue: four items of 0.6 s on one worker, under a 1.5 s bound, all finish."""
    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=1, item_timeout_s=1.5, memory_mb=None, chunk_items=1,
                       prefetch_items=3)
    try:
        assert grade(pool, ["sleep 0.6"] * 4) == [(0.0, OK)] * 4
        assert pool.replaced == 0
    finally:
        pool.close()


def test_the_other_workers_grade_on_while_a_replacement_starts():
    """A replacement's start-up (here 2 s of warm-up) does not hold up the batch: the killed worker's
    item is reported at the bound and the other worker has graded the rest by then."""
    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=2, item_timeout_s=1.0, memory_mb=None, chunk_items=1,
                       prefetch_items=1, warm_up=pool_graders.slow_warm_up)
    try:
        grade(pool, ["1"])  # both workers started (2 s of warm-up each, side by side)
        start = time.monotonic()
        assert grade(pool, ["spin"] + ["1"] * 4) == [(0.0, TIMEOUT)] + [(1.0, OK)] * 4
        assert time.monotonic() - start < 1.0 + 1.5, "the batch waited for the replacement to start"
        assert pool.replaced == 1 and len(pool._workers) == 2
        assert grade(pool, ["1", "0"] * 3) == [(1.0, OK), (0.0, OK)] * 3  # the replacement, once ready, grades
    finally:
        pool.close()


def test_chunk_and_prefetch_sizes_are_checked():
    import pool_graders

    with pytest.raises(ValueError, match="chunk_items=0"):
        GradingPool(pool_graders.grade, workers=1, item_timeout_s=1.0, memory_mb=None, chunk_items=0,
                    prefetch_items=0)


def test_a_worker_that_died_while_idle_is_replaced_and_nothing_is_lost():
    import os
    import signal

    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=1, item_timeout_s=10.0, memory_mb=None, chunk_items=1,
                       prefetch_items=1)
    try:
        grade(pool, ["1"])
        (worker,) = pool._workers
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(timeout=10)
        assert grade(pool, ["1", "0"]) == [(1.0, OK), (0.0, OK)]
        assert pool.replaced == 1
    finally:
        pool.close()


def test_an_exception_raised_while_waiting_leaves_the_pool_usable():
    """A signal handler raises in `grade`'s thread (a stop request abandoning the step) while a worker holds
    items of the batch: the exception comes through at once, that worker is killed, and the next batch (here
    a shorter one) gets its own answers, not the abandoned batch's; `close` stops everything."""
    import signal

    import pool_graders

    class Stop(BaseException):  # as rlvr.preemption.StepInterrupted
        pass

    def stop(signum, frame):
        raise Stop

    pool = GradingPool(pool_graders.grade, workers=1, item_timeout_s=30.0, memory_mb=None, chunk_items=1,
                       prefetch_items=1)
    previous = signal.signal(signal.SIGALRM, stop)
    try:
        grade(pool, ["1"])
        (busy,) = pool._workers
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        with pytest.raises(Stop):
            grade(pool, ["sleep 20", "1", "1"])
        assert time.monotonic() - start < 3
        assert not busy.process.is_alive() and not pool._workers
        start = time.monotonic()
        assert grade(pool, ["0"]) == [(0.0, OK)]
        assert time.monotonic() - start < 15, "the next batch waited for the abandoned one's item"
        assert len(pool._workers) == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        workers = list(pool._workers)
        pool.close()
    assert not pool._workers and not any(w.process.is_alive() for w in workers)


def test_a_warm_up_that_raises_stops_the_pool_with_its_error():
    import pool_graders
    from reward.sync_rewards import failing_warm_up

    pool = GradingPool(pool_graders.grade, workers=2, item_timeout_s=10.0, memory_mb=None, chunk_items=1,
                       prefetch_items=1, warm_up=failing_warm_up)
    with pytest.raises(WarmUpFailed, match="failed to start: OSError: no such model") as raised:
        grade(pool, ["1"])
    assert raised.value.reason == "OSError: no such model" and not pool._workers
    pool.close()
