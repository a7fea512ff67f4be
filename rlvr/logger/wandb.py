"""`logger=wandb`: every metrics row also goes to Weights & Biases.

Naming follows the predecessor's campaigns: run name `<condition>_s<seed>`, group `<condition>`, tags
`<condition>` and `seed<seed>`. The run id is derived from the run folder (sha256 of its absolute path),
and `resume="allow"`, so a job that is requeued or relaunched in its folder continues the same wandb run
(offline runs with the same id merge when synced). Rows are logged against their own `step` field
(`define_metric(step_metric="step")`), not wandb's internal counter, so a resume that goes back to
its last checkpoint never trips wandb's "steps must increase" rule. `reinit="finish_previous"` gives
one wandb run per job even when several jobs share a process one after another; the cells of a packed grid, alive
at once in one process (rlvr/pack/), each open a run of their own (`reinit="create_new"`) and log through it.

`logger.mode` defaults to $WANDB_MODE, else online (conf/logger/wandb.yaml); what the mode needs (a key, a
server that answers) is checked before any model loads (rlvr/logger/preflight.py). `mode: offline` needs no
network or key.

The logger never ends the training: the trainer writes each row to metrics.jsonl before it hands it here, and
when wandb fails (its service process gone, the server unreachable at `wandb.init`) the failure is reported once
(a warning), the logger tears wandb down, reopens the same run id offline and logs every row of the run into it
again, those before the failure and those after, so the offline run's files in the run folder hold the whole run
whatever wandb lost (its service buffers records): `wandb sync <folder>/wandb/offline-run-<time>-<id>` uploads it,
into the same run. If reopening fails too, the rest of the rows are only counted. At the end one line says how
many calls failed and how many rows did not reach wandb; the count is also in the (reopened) wandb run's summary
as `logger/failures`. An online run whose server went away mid-run does not fail a call (wandb retries in the
background), so its end waits at most FINISH_TIMEOUT_S for the upload (wandb's `finish_timeout`; unbounded by
default), then the run ends and its local files in the run folder are left for `wandb sync`.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.logger.preflight import Mode, resolve_mode, wandb_requirements
from rlvr.pack.cells import current_cell
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra

if TYPE_CHECKING:
    from wandb import Run

WANDB_PACKAGE = Package("wandb", pip_extra("wandb"))
FINISH_TIMEOUT_S = 120.0
"""The longest `finish` waits for the upload at the end of a run (module docstring)."""
log = logging.getLogger("rlvr")


class WandbLogger:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(WANDB_PACKAGE, *wandb_requirements(settings["mode"])))

    def __init__(self, project: str, entity: str | None, mode: str, dir: str | None) -> None:
        resolved = resolve_mode(mode)
        if resolved is None:
            raise ValueError(f"logger.mode={mode!r} (from $WANDB_MODE unless given): expected online, offline or "
                             "disabled")
        self.project, self.entity, self.dir, self.mode = project, entity, dir, resolved
        self.run: Run | None = None
        self.folder: Path | None = None
        self.opening: dict[str, Any] = {}
        self.failures = 0
        """wandb calls that raised."""
        self.unsent = 0
        """Rows that did not reach wandb (online or offline)."""
        self.reopened = False
        self.rows: list[dict] = []
        """Every row's values so far, replayed into a reopened run (tens of numbers a row: a few MB for 10^4 rows)."""

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        self.folder = folder
        self.opening = {"name": name, "group": group, "tags": tags, "config": config}
        if not self._call("wandb.init", None, lambda: self._open(self.mode)):
            self._reopen_offline()

    def _open(self, mode: Mode) -> None:
        import wandb  # only in the job, and only when this logger is chosen

        assert self.folder is not None
        self.run = wandb.init(project=self.project, entity=self.entity, mode=mode, dir=self.dir or str(self.folder),
                              id=run_id(self.folder), resume="allow",
                              reinit="create_new" if current_cell() is not None else "finish_previous",
                              settings=wandb.Settings(finish_timeout=FINISH_TIMEOUT_S), **self.opening)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, row: dict) -> None:
        values = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not _bad(v)}
        step = row.get("step")
        if not (self._send(values, step) or (self.run is not None and self._reopen_offline() and
                                             self._send(values, step))):
            self.unsent += 1
        self.rows.append(values)

    def _send(self, values: dict, step: object) -> bool:
        run = self.run
        return run is not None and self._call("logging a row", step, lambda: run.log(values))

    def _call(self, what: str, step: object, action: Callable[[], object]) -> bool:
        """Run one wandb call; a failure is counted, and the first one reported."""
        try:
            action()
            return True
        except Exception as err:  # noqa: BLE001 - whatever wandb raises, the training goes on
            self.failures += 1
            if self.failures == 1:
                at = f" at step {step}" if step is not None else ""
                log.warning("wandb: %s failed%s (%s: %s); the training goes on and every row still goes to "
                            "metrics.jsonl; the logger reopens the run offline in %s (`wandb sync` uploads it later)",
                            what, at, type(err).__name__, " ".join(str(err).split())[:300], self._files())
            return False

    def _reopen_offline(self) -> bool:
        """Once per run: tear wandb down (its service may be gone) and open the same run id offline."""
        if self.reopened or self.folder is None:
            self.run = None
            return False
        self.reopened = True
        self.run = None
        import wandb

        try:
            wandb.teardown()
        except Exception:  # noqa: BLE001, S110 - a lost service fails its teardown too; its state is cleared anyway
            pass
        if self._call("reopening the run offline", None, self._open_offline_with_every_row):
            return True
        self.run = None
        return False

    def _open_offline_with_every_row(self) -> None:
        self._open("offline")
        assert self.run is not None
        for values in self.rows:
            self.run.log(values)

    def _files(self) -> str:
        return f"{Path(self.dir or str(self.folder)) / 'wandb'}"

    def update_summary(self, folder: Path, values: dict) -> None:
        """Add `values` to the summary of the (finished) wandb run of `folder`, reopened by its id; used by a
        campaign's auto-squeeze (rlvr/campaign.py)."""
        import wandb

        run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=self.dir or str(folder),
                         id=run_id(folder), resume="allow", reinit="finish_previous")
        run.summary.update(values)
        run.finish()

    def finish(self) -> None:
        run, self.run = self.run, None
        whole = None
        if run is not None:
            if self.failures:
                self._call("recording the failures", None, lambda: run.summary.update({"logger/failures":
                                                                                       self.failures}))
                whole = getattr(run.settings, "sync_dir", None) if self.reopened else None
            self._call("finishing the run", None, run.finish)
        if self.failures:
            where = f"`wandb sync {whole}` uploads the whole run" if whole else \
                f"the run's wandb files: {self._files()}"
            log.warning("wandb: %d call(s) failed in this run; %d row(s) did not reach wandb (metrics.jsonl holds "
                        "every row); %s", self.failures, self.unsent, where)


def run_id(folder: Path) -> str:
    return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]


def _bad(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
