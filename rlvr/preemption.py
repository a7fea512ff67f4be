"""Stopping on request. SIGTERM or SIGUSR1 (what SLURM sends before preempting or at the time limit) and
SIGINT (Ctrl-C) ask the trainer to finish the step it is in, checkpoint, flush its logs, mark the run
`preempted` and exit: with `REQUEUE_EXIT_CODE` after SIGTERM/SIGUSR1, the status a launcher reads as
"requeue me", and with `INTERRUPT_EXIT_CODE` after Ctrl-C. A second signal exits at once. Started again
with the same command (resume=auto), the run continues from that checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger("rlvr")

REQUEUE_EXIT_CODE = 75
"""EX_TEMPFAIL: the job stopped cleanly at a checkpoint and should be started again in the same folder."""
INTERRUPT_EXIT_CODE = 130
"""128 + SIGINT, the shell's status for a program stopped by Ctrl-C."""
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def exit_code(signum: int) -> int:
    return INTERRUPT_EXIT_CODE if signum == signal.SIGINT else REQUEUE_EXIT_CODE


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Preempted(Exception):
    """Raised by the trainer at a step boundary in answer to a stop signal (`signum`), after checkpointing."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class StopSignals:
    """Context manager: while active, the first SIGTERM/SIGUSR1/SIGINT sets `requested`; a second exits now.

    Nested, the inner one takes over a request the outer one already holds: `train.py` listens from the
    moment the job starts, so a signal that comes while it is still importing or loading the model is
    remembered (not fatal) and the trainer acts on it at its first step boundary.
    """

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            log.error("second stop signal (%s): exiting without a checkpoint", signal_name(signum))
            logging.shutdown()
            os._exit(exit_code(self.requested))
        self.requested = signum
        log.warning("%s received: finishing this step, then checkpoint and exit (%s again: exit at once)",
                    signal_name(signum), signal_name(signum))

    def stopped(self, where: str) -> Preempted:
        """The exception to raise at a step boundary after a request, `where` saying what was kept."""
        return Preempted(f"stopped by {signal_name(self.requested)} {where}", self.requested)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            outer = getattr(signal.getsignal(SIGNALS[0]), "__self__", None)
            if isinstance(outer, StopSignals):
                self.requested = outer.requested
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
