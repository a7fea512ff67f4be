"""Graders for tests/reward/test_pool.py (module-level, so spawned workers can import them by name)."""

import os
import time

from rlvr.reward.pool import OK


def grade(item: str) -> tuple[float, str]:
    """'1' → 1.0, anything else → 0.0; three ways to misbehave, and 'sleep <s>': a slow item (off the CPU)."""
    if item.startswith("sleep "):
        time.sleep(float(item.split()[1]))
    if item == "spin":  # one C-level loop: no signal handler runs until it ends, so only a kill stops it
        sum(range(10**13))
    if item == "die":
        os._exit(3)
    if item == "eat":
        bytearray(8 * 2**30)  # 8 GB, past the worker's address-space cap: MemoryError
    return float(item == "1"), OK


def pid(item: str) -> tuple[float, str]:
    return float(os.getpid()), OK


def slow_warm_up() -> None:
    """A worker start-up as slow as math-verify's imports on a busy machine."""
    time.sleep(2.0)
