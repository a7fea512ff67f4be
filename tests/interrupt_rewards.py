"""Verifiers for the tests of runs that cannot learn (tests/test_run_lifecycle.py) or must stop while scoring."""

import os
import time
from pathlib import Path


def always_raises(completion: str, reference: str) -> float:
    raise RuntimeError("this verifier is broken")


def scores_nothing(completion: str, reference: str) -> float:
    """Every completion scores 0.0: every group ties, whatever the policy samples."""
    return 0.0


def hangs_when_flagged(completion: str, reference: str) -> float:
    """Exact match; but while the file named by $RLVR_TEST_HANG exists, it touches `<that file>.hanging` and hangs."""
    flag = os.environ.get("RLVR_TEST_HANG")
    if flag and Path(flag).exists():
        Path(flag + ".hanging").touch()
        while True:
            time.sleep(0.5)
    return float(completion.strip() == reference.strip())
