"""A counting semaphore shared by processes: at most `slots` holders at once across every process that
uses the same folder (the parallel jobs of one campaign calling the Tinker service).

The folder holds `slot_0.lock` … `slot_{n-1}.lock`; holding a slot is holding an exclusive `flock` on its
file. Entering tries every slot without blocking and takes the first free one; when all are held it
sleeps `poll_s` and tries again. (The predecessor blocked on slot 0, which leaves a slot idle when
another one frees first; polling every 50 ms costs nothing next to a service call that takes seconds.)
The kernel releases a lock when its holder dies, so a killed job never leaks a slot.

`Throttle(None, n)` is a no-op: a single run pays nothing. Lock files are never removed (removing one
while another process waits on it would break the count).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class Throttle:
    def __init__(self, folder: str | Path | None, slots: int, poll_s: float = 0.05) -> None:
        if slots < 1:
            raise ValueError(f"backend.max_concurrent={slots} must be >= 1")
        self.folder = Path(folder) if folder is not None else None
        self.slots = slots
        self.poll_s = poll_s
        self._held: list[int] = []
        """File descriptors of the slots this object holds (a stack: the context manager nests)."""
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Throttle:
        if self.folder is None:
            return self
        while True:
            for i in range(self.slots):
                fd = os.open(self.folder / f"slot_{i}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held.append(fd)
                return self
            time.sleep(self.poll_s)

    def __exit__(self, *exc) -> None:
        if self.folder is None or not self._held:
            return
        fd = self._held.pop()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
