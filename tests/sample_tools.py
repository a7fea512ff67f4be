"""Tools for tests/tools: good ones, and ones that raise, hang, flood or exit (rlvr/tools/)."""

import time


def scale(x: int, factor: float = 2.0, unit: str = "cm") -> str:
    """Scale a length.

    Args:
        x: The length.
        factor: How much larger.
        unit: The unit shown.
    """
    return f"{x * factor}{unit}"


def undocumented(x: int) -> int:
    return x


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def boom(x: int) -> str:
    """Raise.

    Args:
        x: Anything.
    """
    raise ZeroDivisionError("division by zero")


def hang(x: int) -> str:
    """Sleep far past any limit.

    Args:
        x: Anything.
    """
    time.sleep(30)
    return "late"


def flood(x: int) -> str:
    """Return megabytes.

    Args:
        x: Anything.
    """
    return "a" * 5_000_000


def leave(x: int) -> str:
    """Exit the interpreter.

    Args:
        x: Anything.
    """
    raise SystemExit(3)
