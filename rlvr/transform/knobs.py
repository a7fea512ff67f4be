"""Checking a transform's YAML knobs at construction: a wrong type or range fails there, before any step, with a
message naming the key as it is overridden (`transform.eta_min=-1 must be > 0`).

YAML gives ints where a float is meant (`eta: 1`), so numbers accept int and float; bool (an int to Python),
strings and None are refused. The SEPA controller's own checks (rlvr.transform.sepa_controller) name the bare
key; `sepa_controller` adds the types and the `transform.` prefix for the transforms that own one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rlvr.transform.sepa_controller import SCHEDULES, SEPAController


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


def sepa_controller(*, steps: Any, schedule: Any, delay_steps: Any, correct_rate_gate: Any, ema_decay: Any,
                    var_threshold: Any, warmup_sequences: Any) -> SEPAController:
    """The SEPA controller (its knobs as conf/transform/sepa.yaml states them), types and ranges checked here."""
    knobs = dict(
        steps=integer("steps", steps, low=0),
        schedule=choice("schedule", schedule, SCHEDULES),
        delay_steps=integer("delay_steps", delay_steps, low=0),
        correct_rate_gate=number("correct_rate_gate", correct_rate_gate, low=0.0, high=1.0),
        ema_decay=number("ema_decay", ema_decay, low=0.0, high=1.0),
        var_threshold=number("var_threshold", var_threshold, low=0.0, low_open=True),
        warmup_sequences=integer("warmup_sequences", warmup_sequences, low=1),
    )
    try:
        return SEPAController(**knobs)
    except ValueError as error:  # a check the controller has and these do not: its message names the bare key
        raise ValueError(f"transform.{error}") from None
