"""A process body for tests/backend/test_throttle.py (a module on the test path, so spawned children can
import it by name whichever way pytest was started)."""

import time

from rlvr.backend.throttle import Throttle


def hold(folder: str, slots: int, inside, peak, lock, hold_s: float) -> None:
    with Throttle(folder, slots, poll_s=0.01):
        with lock:
            inside.value += 1
            peak.value = max(peak.value, inside.value)
        time.sleep(hold_s)
        with lock:
            inside.value -= 1
