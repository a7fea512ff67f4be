"""Progress of a phase (the warm-up, the RL steps) as a reader of the console or of a log file meets it.

On a terminal: a tqdm bar with rate and ETA, log lines printed above it. Off a terminal (a log file, SLURM,
CI), where a bar would be unreadable carriage returns: a plain log line now and then,

    warm-up 240/800 steps | 9.8 step/s | ETA 57s

at most one per `MIN_GAP_S`, and one whenever a tenth of the phase or `EVERY_S` seconds have passed since the
last. The rate counts the steps done in this process only (a resumed run does not count the steps it skipped).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger("rlvr")

EVERY_S = 60.0
MIN_GAP_S = 5.0


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress(contextlib.AbstractContextManager):
    """`with Progress("warm-up", total=800) as p: … p.update()`; `p.text()` is `240/800 | 9.8 step/s | ETA 57s`.
    `lines=False` leaves the off-terminal lines to the caller (the RL loop's own console line carries `text()`)."""

    def __init__(self, name: str, total: int, done: int = 0, unit: str = "step", lines: bool = True) -> None:
        self.name, self.total, self.done, self.unit, self.lines = name, total, done, unit, lines
        self._start_done, self._t0 = done, time.perf_counter()
        self._last_line_t, self._last_line_done = self._t0, done
        terminal = sys.stderr.isatty()
        self._bar = tqdm(total=total, initial=done, desc=name, unit=unit, leave=False, disable=not terminal,
                         dynamic_ncols=True)
        self._redirect = logging_redirect_tqdm() if terminal else contextlib.nullcontext()

    def __enter__(self) -> Progress:
        self._redirect.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.close()
        self._redirect.__exit__(*exc)

    def update(self, n: int = 1) -> None:
        self.done += n
        self._bar.update(n)
        if self.lines and self._bar.disable and self._line_due():
            log.info("%s %s", self.name, self.text())
            self._last_line_t, self._last_line_done = time.perf_counter(), self.done

    def rate(self) -> float:
        """Steps per second in this process so far (0.0 before the first)."""
        elapsed = time.perf_counter() - self._t0
        return (self.done - self._start_done) / elapsed if elapsed > 0 else 0.0

    def text(self) -> str:
        rate, left = self.rate(), self.total - self.done
        eta = duration(left / rate) if rate > 0 else "?"
        return f"{self.done}/{self.total} {self.unit}s | {rate:.3g} {self.unit}/s | ETA {eta}"

    def _line_due(self) -> bool:
        now = time.perf_counter()
        if self.done >= self.total:
            return False  # the phase's own closing line says it is done
        since = now - self._last_line_t
        tenth = self.done - self._last_line_done >= max(1, self.total // 10)
        return since >= MIN_GAP_S and (tenth or since >= EVERY_S)
