"""Reward functions as a user would write them (imported by dotted path in the tests)."""

import asyncio


def contains_answer(completion: str, reference: str) -> float:
    return float(reference in completion)


async def contains_answer_async(completion: str, reference: str) -> float:
    return float(reference in completion)


def not_a_number(completion: str, reference: str) -> float:
    return float("nan")


def raises_on_x(completion: str, reference: str) -> float:
    if completion == "x":
        raise KeyError(completion)
    return float(reference in completion)


async def hangs_on_x(completion: str, reference: str) -> float:
    if completion == "x":
        await asyncio.sleep(3600)
    return float(reference in completion)


def huge_on_x(completion: str, reference: str) -> float:
    """A sentinel a user might return for "very wrong", far beyond any reward's scale."""
    return 1e9 if completion == "x" else float(reference in completion)
