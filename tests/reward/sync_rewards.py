"""Sync reward functions that misbehave, for tests/reward/test_function_workers.py (imported by dotted path,
`reward.sync_rewards.<name>`, in the worker processes that run them)."""

import os
import subprocess
import sys
import time
from pathlib import Path

HANG_S = 60.0
"""How long a hanging call sleeps: past any test's timeout_s, short enough that a test run against code that
does not bound sync calls fails on its clock instead of hanging."""


def sleeps(completion: str, reference: str) -> float:
    """'x' hangs; 'x <path>' writes <path> first (so a test knows the call has started), then hangs."""
    if completion.split(" ")[0] == "x":
        if " " in completion:
            Path(completion.split(" ", 1)[1]).write_text(str(os.getpid()))
        time.sleep(HANG_S)
    return float(reference in completion)


def raises_with_pid(completion: str, reference: str) -> float:
    """'x' raises, naming the process it ran in; 'exit' calls sys.exit."""
    if completion == "x":
        raise RuntimeError(f"pid {os.getpid()}")
    if completion == "exit":
        sys.exit(3)
    return float(reference in completion)


def exits_on_x(completion: str, reference: str) -> float:
    """'x' ends its process at once (no exception, no cleanup), as a crash would."""
    if completion == "x":
        os._exit(3)
    return float(reference in completion)


def spawns(completion: str, reference: str) -> float:
    """'spawn <path>': start a long `sleep` subprocess, write its pid to <path>, and wait for it."""
    if completion.startswith("spawn "):
        child = subprocess.Popen(["sleep", str(HANG_S)])
        Path(completion.split(" ", 1)[1]).write_text(str(child.pid))
        child.wait()
    return float(reference in completion)


def equals(completion: str, reference: str) -> float:
    """The trivial reward (for the overhead measurement)."""
    return float(completion == reference)


def failing_warm_up() -> None:
    """A pool worker's warm-up that fails (tests/reward/test_pool.py)."""
    raise OSError("no such model")
