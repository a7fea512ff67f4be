"""Stopping on request: SIGTERM or SIGUSR1 (what SLURM sends before preempting or at the time limit)
asks the trainer to finish the step it is in, checkpoint, flush its logs and exit with
`REQUEUE_EXIT_CODE`, the status a launcher reads as "requeue me". A second signal exits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger("rlvr")

REQUEUE_EXIT_CODE = 75
"""EX_TEMPFAIL: the job stopped cleanly at a checkpoint and should be started again in the same folder."""
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Raised by the trainer after it checkpointed in answer to a stop signal."""


class StopSignals:
    """Context manager: while active, the first SIGTERM/SIGUSR1 sets `requested`; a second exits now.

    Nested, the inner one takes over a request the outer one already holds: `train.py` listens from the
    moment the job starts, so a signal that comes while it is still importing or loading the model is
    remembered (not fatal) and the trainer acts on it at its first step boundary.
    """

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            log.error("second stop signal (%s): exiting without a checkpoint", signal.Signals(signum).name)
            logging.shutdown()
            os._exit(REQUEUE_EXIT_CODE)
        self.requested = signum
        log.warning("%s received: finishing this step, then checkpoint and exit", signal.Signals(signum).name)

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
