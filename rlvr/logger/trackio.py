"""`logger=trackio`: one Trackio run per rlvr run, in Trackio's local mode (its SQLite database under $TRACKIO_DIR,
else Hugging Face's cache; `trackio show` opens the dashboard). No Space, no server, no account.

    project  logger.project (the project wandb uses too: `rlvr`); run `<condition>_s<seed>`, group `<condition>`
    config   the composed config (Trackio's run config)
    metrics  every row's numbers at its own `step`
    summary  at the end, summary.json's numbers as `summary/<key>` at the run's last step
    resume   Trackio's resume mode: a run's first segment opens a new Trackio run (`resume="never"`), and keeps its
             name and id in the run folder (trackio.json); a resumed run continues it (`resume="must"`)

Trackio keeps its current run per context (a thread starts with none), so the cells of a packed grid each log to
their own run; this logger calls its run object, never the module's current run. Trackio's automatic CPU and GPU
sampling is off: rlvr's rows carry its own timings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.logger.values import SummaryWatch, last_step, numbers
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra

TRACKIO_PACKAGE = Package("trackio", pip_extra("trackio"))
RUN_FILE = "trackio.json"
log = logging.getLogger("rlvr")


class TrackioLogger:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(TRACKIO_PACKAGE,))

    def __init__(self, project: str = "rlvr") -> None:
        self.project = project
        self.run: Any = None
        self.folder: Path | None = None
        self.watch: SummaryWatch | None = None

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        import trackio  # only in the job, and only when this logger is chosen

        path = folder / RUN_FILE
        stored = json.loads(path.read_text()) if path.is_file() else {}
        resume = "must" if stored.get("project") == self.project and stored.get("name") else "never"
        self.folder, self.watch = folder, SummaryWatch(folder)
        self.run = trackio.init(project=self.project, name=stored.get("name", name) if resume == "must" else name,
                                group=group, config=config, resume=resume, embed=False, auto_log_cpu=False,
                                auto_log_gpu=False)
        if resume == "must" and self.run.id != stored.get("id"):
            log.warning("trackio: project %s holds a newer run named %s than this folder's (id %s): the resumed run "
                        "continues the newer one (%s)", self.project, self.run.name, stored.get("id"), self.run.id)
        path.write_text(json.dumps({"project": self.project, "name": self.run.name, "id": self.run.id}) + "\n")

    def log(self, row: dict) -> None:
        step = row.get("step")
        self.run.log(numbers({k: v for k, v in row.items() if k != "step"}), step=step if isinstance(step, int)
                     else None)

    def update_summary(self, folder: Path, values: dict) -> None:
        """Add `values` (a campaign's squeeze result) to the finished run of `folder`, at its last step."""
        import trackio

        stored = json.loads((folder / RUN_FILE).read_text())
        run = trackio.init(project=stored["project"], name=stored["name"], resume="must", embed=False,
                           auto_log_cpu=False, auto_log_gpu=False)
        run.log(numbers(values), step=last_step(folder) or 0)
        run.finish()

    def finish(self) -> None:
        run, self.run = self.run, None
        if run is None or self.folder is None or self.watch is None:
            return
        summary = self.watch.written()
        if summary is not None:
            run.log({f"summary/{k}": v for k, v in summary.items()}, step=last_step(self.folder) or 0)
        run.finish()
