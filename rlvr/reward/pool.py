"""A pool of grading processes with a hard time bound per item, enforced from outside.

A verifier running model output can hang in ways no in-process timeout stops: math-verify's `signal.alarm`
cannot interrupt one long C-level computation (a big-integer power), and a thread cannot be killed. So
each item is graded in a worker process, in that process's main thread (where alarms work), and the
parent watches the clock: a worker that has not answered `item_timeout_s` after it started an item is
killed (SIGKILL) and replaced; that item is reported as a timeout and the rest of its chunk goes back in
the queue. A worker that dies (out of memory under `memory_mb`, a segfault) costs its item an error.

Items go out in chunks of consecutive items that share a key (the trainer's G completions of one prompt
share a reference, so a worker parses each reference once) and answers come back one item at a time, so
the time bound is per item. Workers are spawned once, when the first batch comes, and live until `close`
(or the end of the process); `grade` may be called from any thread, one call at a time.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

log = logging.getLogger("rlvr")

OK, PARSE_FAIL, TIMEOUT, ERROR = "ok", "parse_fail", "timeout", "error"
"""What happened to an item; a grader returns `(value, one of these)`."""
MAX_CHUNK = 16
STARTUP_TIMEOUT_S = 120.0


def _serve(grader: Callable[..., tuple[float, str]], conn: Connection, memory_mb: int | None) -> None:
    """A worker: grade chunks until the parent closes the pipe, answering `(index, value, status)` per item."""
    if memory_mb:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    conn.send("ready")
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        for index, args in chunk:
            try:
                value, status = grader(*args)
            except MemoryError:
                value, status = 0.0, ERROR
            conn.send((index, float(value), status))


class _Worker:
    def __init__(self, context, grader: Callable, memory_mb: int | None) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(grader, child, memory_mb), daemon=True)
        self.process.start()
        child.close()
        self.outstanding: deque[int] = deque()  # items sent and not answered, in order
        self.deadline = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()


class GradingPool:
    def __init__(self, grader: Callable[..., tuple[float, str]], workers: int, item_timeout_s: float,
                 memory_mb: int | None) -> None:
        self.grader, self.size, self.item_timeout_s, self.memory_mb = grader, workers, item_timeout_s, memory_mb
        self._context = get_context("spawn")  # forking a process that holds torch's threads can deadlock
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.replaced = 0
        """Workers killed (past the time bound) or dead, and started again, since the pool started."""
        self._finalizer = weakref.finalize(self, _stop, self._workers)

    def grade(self, items: Sequence[tuple], keys: Sequence[Any]) -> list[tuple[float, str]]:
        """`grader(*item)` for each item: `(value, status)`, in order; `keys[i]` groups items into chunks."""
        with self._lock:
            if not self._workers:
                self._start(self.size)
            return self._run(items, keys)

    def close(self) -> None:
        self._finalizer()

    def _start(self, n: int) -> None:
        fresh = [_Worker(self._context, self.grader, self.memory_mb) for _ in range(n)]
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for worker in fresh:
            try:
                started = worker.conn.poll(max(0.0, deadline - time.monotonic())) and worker.conn.recv() == "ready"
            except (EOFError, OSError):
                started = False
            if not started:
                for w in fresh:
                    w.kill()
                raise RuntimeError(f"a grading worker did not start within {STARTUP_TIMEOUT_S:.0f} s "
                                   f"(exit code {worker.process.exitcode}; its error, if any, is printed above)")
        self._workers.extend(fresh)

    def _run(self, items: Sequence[tuple], keys: Sequence[Any]) -> list[tuple[float, str]]:
        results: list[tuple[float, str] | None] = [None] * len(items)
        queue = deque(_chunks(keys))
        while queue or any(w.outstanding for w in self._workers):
            for worker in list(self._workers):
                if not worker.outstanding and queue:
                    self._send(worker, items, queue)
            busy = [w for w in self._workers if w.outstanding]
            if not busy:  # every send found its worker dead: the replacements take the queue next round
                continue
            ready = wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for worker in busy:
                if worker.conn in ready:
                    self._receive(worker, results, queue)
                elif time.monotonic() > worker.deadline:
                    self._replace(worker, results, queue, TIMEOUT)
        return results  # type: ignore[return-value]

    def _send(self, worker: _Worker, items: Sequence[tuple], queue: deque) -> None:
        chunk = queue.popleft()
        try:
            worker.conn.send([(i, items[i]) for i in chunk])
        except OSError:  # died while idle: nothing of this batch is lost
            queue.appendleft(chunk)
            self._replace(worker, [], queue, ERROR)
            return
        worker.outstanding.extend(chunk)
        worker.deadline = time.monotonic() + self.item_timeout_s

    def _receive(self, worker: _Worker, results: list, queue: deque) -> None:
        try:
            while worker.conn.poll():
                index, value, status = worker.conn.recv()
                results[index] = (value, status)
                worker.outstanding.popleft()
                worker.deadline = time.monotonic() + self.item_timeout_s
        except (EOFError, OSError):  # died (memory, a crash): the item it was on is lost
            self._replace(worker, results, queue, ERROR)

    def _replace(self, worker: _Worker, results: list, queue: deque, status: str) -> None:
        """Kill `worker` and start another; the item it was on gets `status`, the rest of its chunk goes back."""
        if worker.outstanding:
            index = worker.outstanding.popleft()
            results[index] = (0.0, status)
            log.warning("grading worker %s on item %d (bound %.0f s): replaced",
                        "timed out" if status == TIMEOUT else "died", index, self.item_timeout_s)
        if worker.outstanding:
            queue.appendleft(list(worker.outstanding))
        worker.kill()
        self._workers.remove(worker)
        self.replaced += 1
        self._start(1)


def _chunks(keys: Sequence[Any]) -> list[list[int]]:
    """Runs of consecutive indices with equal keys, at most MAX_CHUNK long."""
    chunks: list[list[int]] = []
    for i, key in enumerate(keys):
        if chunks and keys[chunks[-1][-1]] == key and len(chunks[-1]) < MAX_CHUNK:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def _stop(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.conn.close()  # the worker's recv sees EOF and returns
    for worker in workers:
        worker.process.join(timeout=5)
        if worker.process.is_alive():
            worker.process.kill()
    workers.clear()


def available_cores() -> int:
    """CPU cores this process may run on (a SLURM allocation's, not the node's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
