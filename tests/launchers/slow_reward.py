"""A verifier that takes 0.1 s a batch (an async function, awaited concurrently per batch): it makes a training
step slow enough that the time-limit test's run outlasts its first attempt on any machine."""

import asyncio

from rlvr.reward.exact import ExactMatch


async def exact_after_a_pause(completion: str, reference: str) -> float:
    await asyncio.sleep(0.1)
    return ExactMatch().score([completion], [reference]).values[0]


async def exact_after_a_long_pause(completion: str, reference: str) -> float:
    """6 s a batch: a step longer than SLURM's default grace between SIGTERM and SIGKILL is not."""
    await asyncio.sleep(6.0)
    return ExactMatch().score([completion], [reference]).values[0]
