"""Stopping on request. SIGTERM or SIGUSR1 (what SLURM sends before preempting or at the time limit) and
SIGINT (Ctrl-C) ask the trainer to finish the step it is in, checkpoint, flush its logs, mark the run
`preempted` and exit: with `REQUEUE_EXIT_CODE` after SIGTERM/SIGUSR1, the status a launcher reads as
"requeue me", and with `INTERRUPT_EXIT_CODE` after Ctrl-C. A second signal exits at once. Started again
with the same command (resume=auto), the run continues from that checkpoint.

Scoring may wait on a verifier that hangs (a reward function, a judge): inside `interruptible()` the first
signal raises `StepInterrupted` at once, the trainer drops the step in progress and checkpoints the steps
already done. A second signal exits at once, after `on_forced_exit` (rlvr/run.py marks the run's status.json,
so no exited process leaves it `running`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("rlvr")

REQUEUE_EXIT_CODE = 75
"""EX_TEMPFAIL: the job stopped cleanly at a checkpoint and should be started again in the same folder."""
INTERRUPT_EXIT_CODE = 130
"""128 + SIGINT, the shell's status for a program stopped by Ctrl-C."""
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


LISTENERS: set[StopSignals] = set()
"""The StopSignals entered outside the main thread (the cells of a packed grid, rlvr/pack/cells.py): signals reach
the main thread's handler only, which passes each on to them."""


def exit_code(signum: int) -> int:
    return INTERRUPT_EXIT_CODE if signum == signal.SIGINT else REQUEUE_EXIT_CODE


def warn_from_handler(message: str, *args: object) -> None:
    """A warning said in a signal handler, logged by a thread of its own: the handler may have interrupted the main
    thread inside a logging call, where writing to the same stream again raises ("reentrant call", printed as a
    logging error with a traceback); the thread waits for the handler's lock instead."""
    threading.Thread(target=log.warning, args=(message, *args), daemon=True).start()


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Preempted(Exception):
    """Raised by the trainer at a step boundary in answer to a stop signal (`signum`), after checkpointing."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class StepInterrupted(BaseException):
    """Raised from the signal handler inside `StopSignals.interruptible()`: the step in progress is abandoned.
    A BaseException, so that a verifier's `except Exception` (rlvr/reward/guarded.py) does not swallow it."""


class StopSignals:
    """Context manager: while active, the first SIGTERM/SIGUSR1/SIGINT sets `requested`; a second exits now.

    Nested, the inner one takes over a request the outer one already holds: `train.py` listens from the
    moment the job starts, so a signal that comes while it is still importing or loading the model is
    remembered (not fatal) and the trainer acts on it at its first step boundary. Entered outside the main thread
    (a packed grid's cell) it sets no handler: the main thread's passes each signal on to it (`LISTENERS`).
    """

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict = {}
        self.plan = "finishing this step, then checkpoint and exit"
        """What a first signal does now, as the warning says it (the warm-up sets its own)."""
        self.on_forced_exit: Callable[[str], None] | None = None
        """Called with the reason before a second signal exits the process."""
        self._interruptible = False

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            reason = f"second stop signal ({signal_name(signum)}): exited at once, without a checkpoint"
            log.error(reason)
            for stop in [self, *LISTENERS]:
                if stop.on_forced_exit is not None:
                    try:
                        stop.on_forced_exit(reason)
                    except Exception:  # noqa: BLE001 - exiting regardless: the signal asked for it
                        log.exception("could not record the forced exit")
            logging.shutdown()
            os._exit(exit_code(self.requested))
        self.requested = signum
        for listener in list(LISTENERS):
            listener.requested = listener.requested or signum
        if self._interruptible:
            warn_from_handler("%s received while scoring: dropping this step, then checkpoint the steps done and exit "
                              "(%s again: exit at once)", signal_name(signum), signal_name(signum))
            raise StepInterrupted(signal_name(signum))
        warn_from_handler("%s received: %s (%s again: exit at once)", signal_name(signum), self.plan,
                          signal_name(signum))

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Inside, a first signal raises StepInterrupted where the main thread is (a wait on a verifier). A signal
        that came before keeps its promise (this step finishes): the verifier's own timeout bounds it."""
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def stopped(self, where: str) -> Preempted:
        """The exception to raise at a step boundary after a request, `where` saying what was kept."""
        if self.requested is None:
            raise RuntimeError("StopSignals.stopped() called before any stop signal was received")
        return Preempted(f"stopped by {signal_name(self.requested)} {where}", self.requested)

    def __enter__(self) -> StopSignals:
        outer = getattr(signal.getsignal(SIGNALS[0]), "__self__", None)
        if isinstance(outer, StopSignals):
            self.requested = outer.requested
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        else:  # a packed grid's cell (rlvr/pack/cells.py): the main thread's handler tells it
            LISTENERS.add(self)
        return self

    def __exit__(self, *exc) -> None:
        LISTENERS.discard(self)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
