"""Verifiers for the tests of runs that cannot learn (tests/test_run_lifecycle.py) or must stop while scoring."""

import asyncio
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


async def parity_hangs_when_flagged(completion: str, reference: str) -> float:
    """tests.backpressure.mixed_rewards.parity; but while the file named by $RLVR_TEST_HANG exists, it touches
    `<that file>.hanging.<RANK>` and hangs (async: a batch's calls wait together, reward.timeout_s bounds them)."""
    flag = os.environ.get("RLVR_TEST_HANG")
    if flag and Path(flag).exists():
        Path(f"{flag}.hanging.{os.environ.get('RANK', '0')}").touch()
        await asyncio.sleep(3600)
    return float(sum(map(ord, completion)) % 2 == 0)
