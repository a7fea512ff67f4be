"""The cells of a pack, each a run in a thread of its own, taking turns (rlvr/pack/__init__.py).

Turns. Exactly one thread runs at a time: the pack's (the scheduler, `run_pack`) or one cell's. A cell runs until it
asks for samples (`Cell.wait_for`, from its engine: rlvr/pack/sampling.py) or ends; then the turn goes back to the
scheduler, which runs the next cell. When every cell still running waits for samples, the scheduler samples all the
requests (batched where they can be) and hands each its result; each cell then runs on in its turn. So cells step
in lockstep, and the order of everything is fixed: a pack repeats exactly.

What a cell owns, swapped in at each of its turns and out at its end: the global random streams (Python, NumPy,
torch: each cell starts from the state the pack started with, as a solo run starts from a fresh process's) and
Hydra's job config (`HydraConfig`, which `rlvr/run.py` reads). Its log lines go to its own train.log
(rlvr/run_record.py: a handler that takes the records of the cell's thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.checkpoint import rng_state, set_rng_state

log = logging.getLogger("rlvr")

_here = threading.local()


def current_cell() -> Cell | None:
    """The cell whose thread is running, or None outside a pack (a solo run)."""
    return getattr(_here, "cell", None)


@dataclass
class Cell:
    """One run of the pack: its job config and its task, its thread, its turn."""

    name: str
    """For the pack's log: the cell's run folder."""
    task: Callable[[], Any]
    """The run itself (the job's task function on its config); its return value or exit is the cell's outcome."""
    hydra_cfg: Any = None
    """Hydra's config of this job (`HydraConfig.instance().cfg`), set at each of the cell's turns."""
    pack: str = ""
    """Which pack, for the run's status.json ("1 of 3: jobs 0, 1 in process 123 on node7")."""
    rng: dict | None = None
    result: Any = None
    """The cell's outcome once done: the task's return value, or the exception (SystemExit included) it ended on."""
    failed: bool = False
    shared: dict = field(default_factory=dict)
    """What the pack's cells share (one dict for all, `run_pack`): the base models loaded, engine=vllm's `Hosts`
    (rlvr/start.py). What in it has a `close` is closed when the pack ends."""
    size: int = 1
    """How many cells the pack has."""
    request: Any = None
    """What the cell waits for (a sampling request), None while it runs or once done."""
    answer: Any = None
    done: bool = False
    _go: threading.Event = field(default_factory=threading.Event)
    _paused: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def wait_for(self, request: Any) -> Any:
        """From the cell's thread: hand the turn back until the pack has answered `request`; the answer (an
        exception raised by answering is raised here)."""
        self.request = request
        self._pause()
        answer, self.answer = self.answer, None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def start_thread(self) -> None:
        """The cell's thread, waiting for its first turn."""
        self.thread = threading.Thread(target=self._body, name=f"cell {self.name}", daemon=True)
        self.thread.start()

    def turn(self) -> None:
        """From the scheduler: let the cell run until it waits or ends."""
        self._paused.clear()
        self._go.set()
        self._paused.wait()

    def _body(self) -> None:
        self._resume()
        try:
            self.result = self.task()
        except BaseException as ended:  # noqa: BLE001 - the cell's outcome, whatever it is: the pack goes on
            self.result, self.failed = ended, True
        finally:
            self.done = True
            self.rng = None
            self._paused.set()

    def _pause(self) -> None:
        self.rng = rng_state()
        self._paused.set()
        self._resume()

    def _resume(self) -> None:
        self._go.wait()
        self._go.clear()
        _here.cell = self
        if self.hydra_cfg is not None:
            from hydra.core.hydra_config import HydraConfig

            HydraConfig.instance().cfg = self.hydra_cfg
        assert self.rng is not None
        set_rng_state(self.rng)


def run_pack(cells: list[Cell], answer: Callable[[list[Cell]], None]) -> None:
    """Run `cells` to their ends, in turns (module docstring); `answer(waiting)` answers the requests of the cells
    that wait (it sets each one's `answer`)."""
    start, shared = rng_state(), dict[str, Any]()
    for cell in cells:
        cell.shared, cell.size = shared, len(cells)
        if cell.thread is None:
            cell.start_thread()
        cell.rng = start
    try:
        take_turns(cells, answer)
    finally:
        for held in shared.values():
            if hasattr(held, "close"):
                held.close()
    set_rng_state(start)


def take_turns(cells: list[Cell], answer: Callable[[list[Cell]], None]) -> None:
    """Each cell that runs, in turn, until it waits or ends; then the waiting cells' requests answered; until every
    cell has ended."""
    while True:
        for cell in cells:
            if not cell.done and cell.request is None:
                cell.turn()
        waiting = [cell for cell in cells if not cell.done and cell.request is not None]
        if not waiting:
            break
        try:
            answer(waiting)
        except Exception as err:  # noqa: BLE001 - each waiting cell fails with it, on its own thread
            for cell in waiting:
                cell.answer = err
        for cell in waiting:
            cell.request = None
