"""One writer per run folder: an advisory lock on `<run folder>/.lock`, held for the run's whole life.

Two processes given the same `hydra.run.dir` (a second terminal, two SLURM tasks, a campaign launched twice)
would otherwise both train and interleave their rows in one `metrics.jsonl`. The first takes the lock; the
second exits with status 2 at once, naming the first one's pid and host. The lock is `flock(2)` on an open
file: the kernel drops it when the process ends, however it ends (SIGKILL, a node lost), so a lock is never
stale; Linux's NFS client maps it onto NFS locks, so it also holds across the nodes of a shared file system.

Only rank 0 of a distributed run takes it (the other ranks write no file of the folder). The lock file stays
in the folder after the run (it holds the last holder's pid, host and start time, as JSON); its bytes are
rewritten only once a run is accepted, so a command that is refused leaves it as it was.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from rlvr.errors import ConfigError

LOCK_FILE = ".lock"
_HELD: set[int] = set()
"""Descriptors of the locks this process holds: a forked child (the sampler's worker, a reward pool) closes its copies
at once, so that a child outliving its killed parent cannot keep the folder locked (closing a copy, unlike
LOCK_UN, leaves the parent's lock in place; an exec'd child never gets one: os.open's descriptors are not inherited)."""


def _close_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunFolderBusy(ConfigError):
    """Another live process holds the run folder (printed as a config error: exit status 2, no traceback)."""


class FolderLock:
    """`FolderLock.take(folder)` or RunFolderBusy; `.claim()` once the run is accepted; `.release()` at its end."""

    def __init__(self, folder: Path, fd: int, created: bool) -> None:
        self.folder, self._fd, self._created = folder, fd, created

    @classmethod
    def take(cls, folder: Path) -> FolderLock:
        path = folder / LOCK_FILE
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusy(f"run folder {folder} is in use by {holder(folder)}: one run writes a folder at a "
                                "time. Wait for it to end, stop it, or give this run another hydra.run.dir") from None
        _HELD.add(fd)
        return cls(folder, fd, created)

    def claim(self) -> None:
        """Write this process into the lock file (the run is accepted: the folder is now this run's)."""
        data = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.now(UTC).isoformat(timespec="seconds")}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(data) + "\n").encode(), 0)

    def release(self, keep_file: bool = True) -> None:
        """Drop the lock; a refused command (`keep_file=False`) also removes a lock file it created itself."""
        if self._fd < 0:
            return
        if not keep_file and self._created:
            (self.folder / LOCK_FILE).unlink(missing_ok=True)
        _HELD.discard(self._fd)
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = -1


def holder(folder: Path) -> str:
    """`pid 123 on host node07 (since …)`, as the holder wrote it; `another process` before it has written."""
    starting = "another process (starting: it has not written its pid yet)"
    try:
        data = json.loads((folder / LOCK_FILE).read_text())
        pid, host, since = int(data["pid"]), str(data["host"]), data["since"]
    except (OSError, ValueError, KeyError, TypeError):
        return starting
    if host == socket.gethostname() and not alive(pid):
        return starting  # the file still names the folder's previous run
    return f"pid {pid} on host {host} (since {since})"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_held(folder: Path) -> bool | None:
    """Whether a live process holds `folder`'s lock; None when the folder has no lock file (a run older than it)."""
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
