"""Checking a transform's YAML knobs at construction: a wrong type or range fails there, before any step, with a
message naming the key as it is overridden (`transform.eta_min=-1 must be > 0`).

YAML gives ints where a float is meant (`eta: 1`), so numbers accept int and float; bool (an int to Python),
strings and None are refused. A key of a nested node is named with its node: `number("schedule.steps", …)` says
`transform.schedule.steps=…` (the λ schedule's settings, rlvr.transform.sepa_controller.LambdaSchedule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _show(key: str, value: Any) -> str:
    return f"transform.{key}={value!r}"


def number(key: str, value: Any, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False) -> float:
    """A finite real in [low, high] (an open end where `low_open`/`high_open`), as float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_show(key, value)} must be a number, not {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{_show(key, value)} must be finite")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{_show(key, value)} must be {'>' if low_open else '>='} {low:g}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{_show(key, value)} must be {'<' if high_open else '<='} {high:g}")
    return value


def optional_number(key: str, value: Any, **bounds: Any) -> float | None:
    """None (null in YAML), or `number(key, value, **bounds)`."""
    return None if value is None else number(key, value, **bounds)


def integer(key: str, value: Any, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_show(key, value)} must be an integer, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{_show(key, value)} must be >= {low}")
    return value


def choice(key: str, value: Any, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{_show(key, value)} is not one of {list(options)}")
    return value

