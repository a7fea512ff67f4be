"""`logger=mlflow`: one MLflow run per rlvr run, through MLflow's own client (`MlflowClient`: no active-run state,
so the cells of a packed grid, threads of one process, each log to their own run).

    experiment   logger.experiment, else the campaign's name (campaign=sepa_ablation), else `rlvr`
    run          named `<condition>_s<seed>`, tagged condition=<condition>, seed=<seed>
    params       the composed config flattened to `a.b.c` keys (MLflow's limits: a key keeps letters, digits and
                 `_ - . / : space`, any other character becomes `_`, and at most 250 characters; a value longer than
                 6000 characters is cut there, ending in `...`); the whole config is also the artifact config.json
    metrics      every row's numbers at its own `step`
    summary      at the end, summary.json's numbers as `summary/<key>` metrics at the run's last step, and the file
                 itself as an artifact; the run ends FINISHED, or KILLED when it stopped before its end
    resume       the run id is kept in the run folder (mlflow.json), and a resumed run continues that run (same
                 tracking URI): params it did not have are added, those it had keep their first value (MLflow's
                 params cannot change; config.json is the config of the latest segment)

logger.tracking_uri is $MLFLOW_TRACKING_URI's, else null: a file store in the run folder (`mlruns/`, offline;
`mlflow ui --backend-store-uri <folder>/mlruns`); MLflow 3 asks $MLFLOW_ALLOW_FILE_STORE=true for a file store,
which this logger sets when it is unset. A server that does not answer is refused at start
(rlvr/logger/mlflow_check.py).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.logger.mlflow_check import MLFLOW_PACKAGE, MlflowServer
from rlvr.logger.values import SummaryWatch, flat, last_step, numbers, text
from rlvr.protocols import Needs

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

RUN_FILE = "mlflow.json"
MAX_KEY = 250
MAX_VALUE = 6000
PARAMS_PER_CALL = 100
_BAD_KEY_CHARACTER = re.compile(r"[^\w./\- :]")


def key(name: str) -> str:
    """`name` as MLflow accepts a param or metric key (module docstring)."""
    return _BAD_KEY_CHARACTER.sub("_", name)[:MAX_KEY]


def value(leaf: object) -> str:
    found = text(leaf)
    return found if len(found) <= MAX_VALUE else found[:MAX_VALUE - 3] + "..."


def campaign() -> str | None:
    """The campaign this job belongs to (Hydra's choice of `campaign=`), or None."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get("campaign") if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001 - a composition without a job: no campaign
        return None
    return None if choice in (None, "null", "None") else str(choice)


class MlflowLogger:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(MLFLOW_PACKAGE, MlflowServer(settings.get("tracking_uri"))))

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.client: MlflowClient | None = None
        self.run_id: str | None = None
        self.folder: Path | None = None
        self.watch: SummaryWatch | None = None

    def _client(self, uri: str) -> MlflowClient:
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient  # only in the job, and only when this logger is chosen

        return MlflowClient(tracking_uri=uri)

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        uri = self.tracking_uri or (folder.resolve() / "mlruns").as_uri()
        self.folder, self.watch, self.client = folder, SummaryWatch(folder), self._client(uri)
        self.run_id = self._continued(uri)
        had: dict[str, str] = {}
        if self.run_id is None:
            seed = next((t.removeprefix("seed") for t in tags if t.startswith("seed")), "")
            run = self.client.create_run(self._experiment_id(), run_name=name,
                                         tags={"condition": group, "seed": seed, "rlvr.folder": str(folder.resolve())})
            self.run_id = run.info.run_id
            (folder / RUN_FILE).write_text(json.dumps({"tracking_uri": uri, "run_id": self.run_id}) + "\n")
        else:
            had = self.client.get_run(self.run_id).data.params
            self.client.update_run(self.run_id, status="RUNNING")
        self._params({k: v for k, v in params(config).items() if k not in had})
        self.client.log_dict(self.run_id, config, "config.json")

    def _continued(self, uri: str) -> str | None:
        """The run id mlflow.json keeps for this tracking URI, when that run still exists."""
        assert self.folder is not None and self.client is not None
        path = self.folder / RUN_FILE
        stored = json.loads(path.read_text()) if path.is_file() else {}
        if stored.get("tracking_uri") != uri or not stored.get("run_id"):
            return None
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(stored["run_id"])
        except MlflowException:
            return None
        return str(stored["run_id"])

    def _experiment_id(self) -> str:
        """The experiment's id, created when missing (by another job at the same time: then read again)."""
        assert self.client is not None
        name = self.experiment or campaign() or "rlvr"
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:
            again = self.client.get_experiment_by_name(name)
            if again is None:
                raise
            return str(again.experiment_id)

    def _params(self, values: dict[str, str]) -> None:
        from mlflow.entities import Param

        assert self.client is not None and self.run_id is not None
        items = [Param(k, v) for k, v in values.items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=items[i:i + PARAMS_PER_CALL])

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        assert self.client is not None and self.run_id is not None
        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key(k), v, stamp, step) for k, v in values.items()])

    def log(self, row: dict) -> None:
        step = row.get("step")
        self._metrics(numbers({k: v for k, v in row.items() if k != "step"}), step if isinstance(step, int) else 0)

    def update_summary(self, folder: Path, values: dict) -> None:
        """Add `values` (a campaign's squeeze result) to the finished run of `folder`: numbers as metrics at its
        last step, the rest as tags."""
        stored = json.loads((folder / RUN_FILE).read_text())
        self.client, self.run_id = self._client(stored["tracking_uri"]), stored["run_id"]
        found = numbers(dict(flat(values)))
        self._metrics(found, last_step(folder) or 0)
        for k, v in flat(values):
            if k not in found:
                self.client.set_tag(self.run_id, key(k), value(v))

    def finish(self) -> None:
        if self.client is None or self.run_id is None or self.folder is None or self.watch is None:
            return
        summary = self.watch.written()
        if summary is not None:
            self._metrics({f"summary/{k}": v for k, v in summary.items()}, last_step(self.folder) or 0)
            self.client.log_artifact(self.run_id, str(self.watch.path))
        self.client.set_terminated(self.run_id, "FINISHED" if summary is not None else "KILLED")
        self.client = self.run_id = None


def params(config: Mapping[str, Any]) -> dict[str, str]:
    """The composed config as MLflow params (module docstring)."""
    return {key(k): value(v) for k, v in flat(config)}
