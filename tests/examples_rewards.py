"""Reward functions as a user would write them (imported by dotted path in the tests)."""


def contains_answer(completion: str, reference: str) -> float:
    return float(reference in completion)


async def contains_answer_async(completion: str, reference: str) -> float:
    return float(reference in completion)


def not_a_number(completion: str, reference: str) -> float:
    return float("nan")
