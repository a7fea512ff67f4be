"""The `_target_` of every `logger=` option: the trackers chosen, side by side (`logger=none`: none, the run folder
is the only record).

Each tracker option (conf/logger/<name>.yaml) names itself under `trackers` (name → class) and sets its own keys
beside it, flat, so that `logger=wandb logger.mode=offline` reads as before and `logger=[wandb,mlflow]` (Hydra's
list of options from one group) merges the options into one node: `trackers` gathers both, each keeps its keys.
A tracker is built from the keys its constructor names (`project` is wandb's and trackio's alike: one project).

A tracker that raises is reported once (a warning naming the call and the step), then left out for the rest of
the run: the training goes on, every row still goes to metrics.jsonl and to the other trackers, and at the end one
line says how many rows it missed. logger=wandb never raises (it reopens its run offline: rlvr/logger/wandb.py).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import get_class

from rlvr.protocols import Logger, Needs

log = logging.getLogger("rlvr")


def own_settings(cls: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `settings` that `cls`'s constructor takes."""
    taken = inspect.signature(cls).parameters
    return {k: v for k, v in settings.items() if k in taken and k != "trackers"}


def merged(needs: list[Needs]) -> Needs:
    """One Needs for several trackers: what each provides, requires and asks of the machine."""
    return Needs(provides=frozenset().union(*(n.provides for n in needs)),
                 requires={k: v for n in needs for k, v in n.requires.items()},
                 excludes={k: v for n in needs for k, v in n.excludes.items()},
                 machine=tuple(r for n in needs for r in n.machine),
                 errors=tuple(e for n in needs for e in n.errors))


@dataclass
class Tracked:
    """One tracker in a run: whether it is still called, and what it missed."""

    name: str
    logger: Logger
    failed: bool = False
    missed: int = 0


class Trackers:
    """Every tracker chosen; each call goes to each tracker still standing."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        trackers = settings.get("trackers") or {}
        if not isinstance(trackers, Mapping):
            return Needs(errors=("logger.trackers: expected a mapping of tracker name to class, e.g. "
                                 "{wandb: rlvr.logger.wandb.WandbLogger} (choose logger=wandb, mlflow, trackio or "
                                 "tensorboard, or a list of them: logger=[wandb,mlflow])",))
        found = []
        for name, target in trackers.items():
            try:
                cls = get_class(target)
                found.append(cls.needs(own_settings(cls, settings)))
            except ImportError as err:
                found.append(Needs(errors=(f"logger.trackers.{name}={target!r} cannot be imported: {err}",)))
        return merged(found)

    def __init__(self, trackers: dict[str, str], project: str | None = None, entity: str | None = None,
                 mode: str | None = None, dir: str | None = None, tracking_uri: str | None = None,
                 experiment: str | None = None, log_dir: str | None = None) -> None:
        settings = {"project": project, "entity": entity, "mode": mode, "dir": dir, "tracking_uri": tracking_uri,
                    "experiment": experiment, "log_dir": log_dir}
        self.tracked: list[Tracked] = []
        for name, target in trackers.items():
            cls = get_class(target)
            self.tracked.append(Tracked(name, cls(**own_settings(cls, settings))))

    @property
    def loggers(self) -> dict[str, Logger]:
        """Each tracker by its name (logger.trackers' keys)."""
        return {t.name: t.logger for t in self.tracked}

    def _each(self, what: str, step: object, call: Callable[[Logger], object]) -> None:
        for t in self.tracked:
            if t.failed:
                t.missed += what == "logging a row"
                continue
            try:
                call(t.logger)
            except Exception as err:  # noqa: BLE001 - whatever a tracker raises, the training goes on
                t.failed = True
                t.missed += what == "logging a row"
                at = f" at step {step}" if step is not None else ""
                log.warning("logger=%s: %s failed%s (%s: %s); the training goes on and every row still goes to "
                            "metrics.jsonl (and to the other trackers); %s is left out for the rest of the run",
                            t.name, what, at, type(err).__name__, " ".join(str(err).split())[:300], t.name)

    def start(self, name: str, group: str, tags: list[str], folder: Path, config: dict) -> None:
        self._each("starting its run", None, lambda t: t.start(name, group, tags, folder, config))

    def log(self, row: dict) -> None:
        self._each("logging a row", row.get("step"), lambda t: t.log(row))

    def update_summary(self, folder: Path, values: dict) -> None:
        self._each("updating the summary", None, lambda t: t.update_summary(folder, values))

    def finish(self) -> None:
        self._each("finishing its run", None, lambda t: t.finish())
        for t in self.tracked:
            if t.failed:
                log.warning("logger=%s failed in this run; %d row(s) did not reach it (metrics.jsonl holds every "
                            "row)", t.name, t.missed)
            t.failed, t.missed = False, 0
