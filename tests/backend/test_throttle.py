"""The campaign throttle: a semaphore across processes, and nothing at all for a single run."""

import multiprocessing as mp
import time

import pytest
from throttle_holder import hold

from rlvr.backend.throttle import Throttle


@pytest.mark.parametrize("slots", [1, 2])
def test_at_most_n_processes_hold_a_slot_at_once(tmp_path, slots):
    # 5 jobs each hold a slot 0.3 s: with n slots, never more than n inside (on a loaded machine the children
    # may start too far apart to overlap, so the peak is only bounded)
    ctx = mp.get_context("spawn")
    inside, peak, lock = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Lock()
    jobs = [ctx.Process(target=hold, args=(str(tmp_path), slots, inside, peak, lock, 0.3)) for _ in range(5)]
    t0 = time.perf_counter()
    for j in jobs:
        j.start()
    for j in jobs:
        j.join(60)
        assert j.exitcode == 0
    assert 1 <= peak.value <= slots
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"slot_{i}.lock" for i in range(slots)]
    # 5 holds of 0.3 s through n slots take at least ceil(5/n) × 0.3 s (plus process start-up)
    assert time.perf_counter() - t0 >= -(-5 // slots) * 0.3


def test_a_killed_holder_frees_its_slot(tmp_path):
    ctx = mp.get_context("spawn")
    inside, peak, lock = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Lock()
    holder = ctx.Process(target=hold, args=(str(tmp_path), 1, inside, peak, lock, 3600))
    holder.start()
    deadline = time.monotonic() + 120
    while inside.value == 0:
        assert holder.exitcode is None and time.monotonic() < deadline, "the holder never took the slot"
        time.sleep(0.01)
    holder.kill()
    holder.join()
    t0 = time.perf_counter()
    with Throttle(tmp_path, 1, poll_s=0.01):
        pass
    assert time.perf_counter() - t0 < 5


def test_no_folder_is_a_no_op(tmp_path):
    throttle = Throttle(None, 1)
    with throttle, throttle:  # nests freely: nothing is locked
        pass
    assert list(tmp_path.iterdir()) == []


def test_nested_use_in_one_process_holds_two_slots(tmp_path):
    throttle = Throttle(tmp_path, 2)
    with throttle, throttle:
        assert len(throttle._held) == 2
    assert throttle._held == []
