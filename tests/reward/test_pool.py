"""The grading pool with real worker processes: a worker stuck in C is killed at the time bound and
replaced, one that dies or runs out of memory costs only its item, and the workers start once."""

import threading
import time

import pytest

from rlvr.reward.pool import ERROR, OK, TIMEOUT, GradingPool, _chunks


@pytest.fixture
def pool():
    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=2, item_timeout_s=2.0, memory_mb=1024)
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


def test_the_rest_of_a_stuck_workers_chunk_is_graded_elsewhere(pool):
    # one key → one chunk → one worker; it hangs on the second item
    assert grade(pool, ["1", "spin", "1", "0"], keys=["q"] * 4) == [(1.0, OK), (0.0, TIMEOUT), (1.0, OK), (0.0, OK)]


def test_a_worker_that_dies_costs_only_its_item(pool):
    assert grade(pool, ["1", "die", "1"], keys=["q"] * 3) == [(1.0, OK), (0.0, ERROR), (1.0, OK)]
    assert pool.replaced == 1


def test_running_out_of_memory_is_an_error_not_a_dead_node(pool):
    assert grade(pool, ["eat", "1"]) == [(0.0, ERROR), (1.0, OK)]
    assert pool.replaced == 0  # MemoryError is caught in the worker, which carries on


def test_workers_start_once_and_any_thread_may_call():
    import pool_graders

    pool = GradingPool(pool_graders.pid, workers=2, item_timeout_s=10.0, memory_mb=None)
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
    assert _chunks(["a", "a", "b", "a"]) == [[0, 1], [2], [3]]
    assert [len(c) for c in _chunks(["a"] * 40)] == [16, 16, 8]


def test_a_worker_that_died_while_idle_is_replaced_and_nothing_is_lost():
    import os
    import signal

    import pool_graders

    pool = GradingPool(pool_graders.grade, workers=1, item_timeout_s=10.0, memory_mb=None)
    try:
        grade(pool, ["1"])
        (worker,) = pool._workers
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(timeout=10)
        assert grade(pool, ["1", "0"]) == [(1.0, OK), (0.0, OK)]
        assert pool.replaced == 1
    finally:
        pool.close()
