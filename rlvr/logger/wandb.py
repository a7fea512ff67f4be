"""`logger=wandb`: every metrics row also goes to Weights & Biases.

Naming follows the predecessor's campaigns: run name `<condition>_s<seed>`, group `<condition>`, tags
`<condition>` and `seed<seed>`. The run id is derived from the run folder (sha256 of its absolute path),
and `resume="allow"`, so a job that is requeued or relaunched in its folder continues the same wandb run
(offline runs with the same id merge when synced). Rows are logged against their own `step` field
(`define_metric(step_metric="step")`), not wandb's internal counter, so a resume that goes back to
its last checkpoint never trips wandb's "steps must increase" rule. `reinit="finish_previous"` gives
one wandb run per job even when several jobs share a process. `mode: offline` needs no network or key.
"""

from __future__ import annotations

import hashlib
import math
import netrc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from rlvr.protocols import Finding, Needs
from rlvr.requirements import Package, pip_extra

if TYPE_CHECKING:
    from wandb import Run

WANDB_PACKAGE = Package("wandb", pip_extra("wandb"))
Mode = Literal["online", "offline", "disabled"]


@dataclass(frozen=True)
class WandbKey:
    """logger.mode=online needs a W&B key ($WANDB_API_KEY or a netrc entry for api.wandb.ai); offline does not."""

    mode: str
    item: str = "wandb key"
    at_start: bool = False

    def check(self) -> Finding:
        if os.environ.get("WANDB_API_KEY", "").strip():
            return Finding("ok", "$WANDB_API_KEY is set (the value is never shown)")
        try:
            if netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai"):
                return Finding("ok", "a netrc entry for api.wandb.ai")
        except (OSError, netrc.NetrcParseError):
            pass
        if self.mode == "online":
            return Finding("missing", "logger.mode=online needs a W&B key: $WANDB_API_KEY or `wandb login` "
                                      "(or logger.mode=offline)")
        return Finding("ok", f"logger.mode={self.mode} needs no key")


class WandbLogger:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(machine=(WANDB_PACKAGE, WandbKey(settings["mode"])))

    def __init__(self, project: str, entity: str | None, mode: str, dir: str | None) -> None:
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.mode={mode!r}: expected online, offline or disabled")
        self.project, self.entity, self.dir = project, entity, dir
        self.mode = cast(Mode, mode)  # checked above
        self.run: Run | None = None

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        import wandb  # only in the job, and only when this logger is chosen

        self.run = wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, dir=self.dir or str(folder), id=run_id(folder),
            name=name, group=group, tags=tags, config=config, resume="allow", reinit="finish_previous",
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, row: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and not _bad(v)})

    def update_summary(self, folder: Path, values: dict) -> None:
        """Add `values` to the summary of the (finished) wandb run of `folder`, reopened by its id; used by a
        campaign's auto-squeeze (rlvr/campaign.py)."""
        import wandb

        run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=self.dir or str(folder),
                         id=run_id(folder), resume="allow", reinit="finish_previous")
        run.summary.update(values)
        run.finish()

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def run_id(folder: Path) -> str:
    return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]


def _bad(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
