"""What `logger=mlflow` needs of this machine, checked before any model loads (exit 2, as logger=wandb's
preflight) and by `rlvr doctor`: the mlflow package (the `.[mlflow]` extra, mlflow-skinny), and, for a tracking
server (an http(s):// tracking URI), an answer to one HEAD request within MLFLOW_PROBE_TIMEOUT_S. MLflow itself
retries a server that does not answer for minutes before it raises. A file store (file://, the default) needs
nothing."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.protocols import Finding
from rlvr.requirements import Package, pip_extra

MLFLOW_PACKAGE = Package("mlflow", pip_extra("mlflow"), distributions=("mlflow-skinny", "mlflow"))
MLFLOW_PROBE_TIMEOUT_S = 3.0
"""The most the start check waits for the tracking server's answer."""
FILE_STORE_WAY_OUT = ("start the server, name one that answers (logger.tracking_uri=http://host:5000 or "
                      "$MLFLOW_TRACKING_URI), or log offline to a file store: logger.tracking_uri=null (mlruns/ in "
                      "the run folder) or logger.tracking_uri=file:///an/absolute/path")


@dataclass(frozen=True)
class MlflowServer:
    """An http(s):// tracking URI answers; any other (a file store, a database) is not probed."""

    uri: str | None
    item: str = "mlflow tracking server"
    at_start: bool = True

    def check(self) -> Finding:
        from rlvr.requirements import unanswered_probe

        if not self.uri or not self.uri.startswith(("http://", "https://")):
            return Finding("ok", f"logger.tracking_uri={self.uri} is not a server (nothing to contact)")
        why = unanswered_probe(self.uri, MLFLOW_PROBE_TIMEOUT_S)
        if why is None:
            return Finding("ok", f"{self.uri} answers")
        return Finding("missing", f"logger.tracking_uri: the MLflow tracking server {self.uri} does not answer "
                                  f"({why}): {FILE_STORE_WAY_OUT}")
