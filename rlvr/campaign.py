"""Campaigns: a condition × seed grid as a Hydra multirun, with stable run folders and a manifest.

A campaign file (`conf/campaign/*.yaml`) sets `hydra.mode: MULTIRUN`, the grid in
`hydra.sweeper.params`, the root `outputs/<campaign>` and the run folder `<condition>/seed=<seed>`
(derived from the choices, not the clock), and registers `ManifestCallback`. Before anything is
launched, the callback expands the grid exactly as Hydra's basic sweeper does, refuses grids in which two
runs would share a folder, prints the plan (runs, steps, and the estimated wall time = runs × steps ×
median step time of a pilot / runs at once; docs/predecessor.md#campaigns) and writes
`manifest.json`; each job then records its own state there (`record`). Launching the same campaign
again reuses the folders: unfinished runs resume from their checkpoints, finished ones return at once.

Auto-squeeze: with `auto_squeeze: {threshold: 0.95}` on the callback, the first run to finish
analyses its final LoRA adapter (rlvr/squeeze.py) and records the recommended rank under `squeeze` in the
manifest; later finishers see the key and do nothing. The predecessor's sequential runner squeezed the first
run *in launch order*; in a job array "first" can only mean first to finish.

This module stays light (no torch): it runs in the process that submits the grid.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any, cast, overload

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("rlvr")

MANIFEST = "manifest.json"


def expand_grid(sweeper_params: dict[str, str], cli_overrides: list[str]) -> list[list[str]]:
    """Every job's overrides, in launch order: the basic sweeper's cartesian product of the swept keys
    (config params first, command line after, a later value for the same key winning)."""
    swept = [*(f"{k}={v}" for k, v in sweeper_params.items()), *cli_overrides]
    parsed = OverridesParser.create().parse_overrides(swept)
    choices: dict[str, list[str]] = {}
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    jobs: list[list[str]] = [[]]
    for options in choices.values():
        jobs = [job + [option] for job in jobs for option in options]
    return jobs


@overload
def value_of(overrides: list[str], key: str, default: str) -> str: ...


@overload
def value_of(overrides: list[str], key: str, default: None = None) -> str | None: ...


def value_of(overrides: list[str], key: str, default: str | None = None) -> str | None:
    for item in overrides:
        name, _, value = item.lstrip("+~").partition("=")
        if name == key:
            return value
    return default


@dataclass(frozen=True)
class Plan:
    jobs: list[list[str]]
    max_steps: int
    step_time_s: float | None
    """Median step time of a pilot run (20–50 steps); None when nothing has been measured."""
    parallel: int
    """How many runs execute at once."""
    memory: list[str] | None = None
    """What the engine takes of the GPU it shares with the trainer, phase by phase (`engine_memory`); None: the
    engine holds no GPU memory of its own."""
    overlapped_s: float | None = None
    """The step time sampling ahead of training would give (`overlapped_step_time`), when the pilot was
    synchronous."""
    packs: list[int] | None = None
    """A packed grid's packs (hydra/launcher=packed, or slurm with pack_size > 1): how many runs each; None: one run
    a process."""
    sample_time_s: float | None = None
    """Median sampling time of the pilot's steps (`measured_sample_time`), for a packed grid's estimate."""
    pack_bases: int = 0
    """Distinct base models in the largest pack (one per seed where the seed draws the weights or a warm-up trains
    them, else one)."""

    @property
    def total_steps(self) -> int:
        return len(self.jobs) * self.max_steps

    def describe(self) -> str:
        conditions = sorted({value_of(job, "condition", "-") for job in self.jobs})
        seeds = sorted({value_of(job, "seed", "-") for job in self.jobs}, key=lambda s: (len(s), s))
        lines = [
            f"campaign: {len(conditions)} conditions × {len(seeds)} seeds = {len(self.jobs)} runs × "
            f"{self.max_steps} steps = {self.total_steps} steps",
            f"  conditions: {', '.join(conditions)}",
            f"  seeds: {', '.join(seeds)}",
        ]
        if self.step_time_s:
            seconds = self.total_steps * self.step_time_s / max(self.parallel, 1)
            lines.append(
                f"  estimated wall time: {self.total_steps} × {self.step_time_s:.3g} s / {self.parallel} at once "
                f"= {_duration(seconds)} of training steps (median step time of a pilot; start-up, warm-up "
                "and evaluation come on top)"
            )
        else:
            lines.append("  estimated wall time: unknown (set campaign step_time_s from a 20–50 step pilot)")
        if self.step_time_s and self.overlapped_s:
            lines.append(f"  sampling ahead (trainer.off_policy_steps=1, docs/overlap.md): about "
                         f"{self.overlapped_s:.3g} s a step ({self.overlapped_s / self.step_time_s:.2f}× the "
                         "pilot's), the longer of its sampling and the rest of its step")
        lines += self.packed_lines()
        lines += [f"  {line}" for line in self.memory or []]
        return "\n".join(lines)

    def packed_lines(self) -> list[str]:
        """A packed grid: its packs, and its wall time between two bounds (rlvr/pack/: a pack's cells step one after
        another, their sampling decoded together): every cell's sampling shared in one decoding loop, and nothing
        shared."""
        if not self.packs:
            return []
        sizes = ", ".join(f"{count} of {n} run{'s' if n > 1 else ''}"
                          for n, count in sorted(Counter(self.packs).items(), reverse=True))
        lines = [f"  packed: {len(self.packs)} pack{'s' if len(self.packs) > 1 else ''} ({sizes}): runs of one model, "
                 "engine and backend share a process and its base model; a full fine-tuning run is a pack of its own"]
        if self.pack_bases:
            lines.append(f"  memory: a pack holds {self.pack_bases} copy(ies) of the base weights (a seed's own where "
                         "the seed draws the weights or a warm-up trains them; with engine=vllm a vLLM for each) and "
                         "each run's adapter, optimizer state and merged sampling copy; 6 runs of the default task "
                         "peaked at 1.6× one run (docs/measured/grid.md)")
        if self.step_time_s:
            parallel = min(max(self.parallel, 1), len(self.packs))
            high = sum(self.max_steps * n * self.step_time_s for n in self.packs) / parallel
            if self.sample_time_s is None:
                lines.append(f"  estimated wall time packed: at most {_duration(high)} of training steps, {parallel} "
                             "pack(s) at once (a pilot's sample_time_s says how much sharing its sampling saves)")
                return lines
            sample = min(self.sample_time_s, self.step_time_s)
            low = sum(self.max_steps * (n * (self.step_time_s - sample) + sample) for n in self.packs) / parallel
            lines.append(f"  estimated wall time packed: {_duration(low)} (every cell's sampling in one decoding loop "
                         f"as fast as one cell's) to {_duration(high)} (none shared) of training steps, {parallel} "
                         "pack(s) at once")
        return lines


def engine_memory(config: DictConfig) -> list[str] | None:
    """What the chosen engine takes of the GPU beside the trainer (engine=vllm: rlvr/engine/vllm.py
    `colocated_memory`, which `engine.sleep_level` changes); None for the others, which hold no GPU memory of their
    own (pytorch samples with the trainer's module; openai and tinker run elsewhere)."""
    from rlvr.config_check import declared_needs
    from rlvr.engine.vllm import colocated_memory

    engine = config.get("engine")
    if engine is None or "engine_gpu_memory" not in declared_needs(config, "engine").provides:
        return None
    return colocated_memory(cast(dict[str, Any], OmegaConf.to_container(engine, resolve=True)))  # a DictConfig's


def planned_memory(config: DictConfig) -> list[str] | None:
    """`engine_memory`'s lines, the reference model's (algorithm.kl.coef > 0, rlvr/algorithm/kl.py
    `reference_memory`) and a teacher's (rlvr/distill/distill.py `teacher_memory`); None when none has any."""
    from rlvr.algorithm.kl import reference_memory
    from rlvr.config_check import declared_needs
    from rlvr.distill.distill import teacher_memory

    plain = cast(dict[str, Any], OmegaConf.to_container(config, resolve=False))
    self_scoring = "self_scoring" in declared_needs(config, "transform").requires
    lines = (engine_memory(config) or []) + reference_memory(plain) + teacher_memory(plain, self_scoring)
    return lines or None


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def measured_step_time(root: Path) -> float | None:
    """Median `step_time_s` over the training rows already in the campaign's run folders, if any."""
    times = [row["step_time_s"] for row in _pilot_rows(root)]
    return median(times) if times else None


def measured_sample_time(root: Path) -> float | None:
    """Median `sample_time_s` over the training rows already in the campaign's run folders, if any."""
    times = [row["sample_time_s"] for row in _pilot_rows(root) if "sample_time_s" in row]
    return median(times) if times else None


def overlapped_step_time(root: Path) -> float | None:
    """What a synchronous pilot's steps would take sampling ahead of training (rlvr/overlap.py): per step the longer
    of the sampler's side (sampling, less the sync) and the trainer's (sync, scoring, credit, training); the median
    over the pilot's steps. None when no synchronous step was measured."""
    times = []
    for row in _pilot_rows(root):
        if "async/policy_version" in row or "sample_time_s" not in row:
            continue
        sync = row.get("engine/sync_s", 0.0)
        trainer = sync + row.get("score_time_s", 0.0) + row.get("advantage_time_s", 0.0) + row.get("train_time_s", 0.0)
        times.append(max(row["sample_time_s"] - sync, trainer))
    return median(times) if times else None


def _pilot_rows(root: Path) -> list[dict]:
    """The training rows already in the campaign's run folders."""
    rows = []
    for metrics in root.glob("*/seed=*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if "step_time_s" in row:
                rows.append(row)
    return rows


class ManifestCallback(Callback):
    """Hydra callback of campaign files: plan, folder check and manifest before launch."""

    def __init__(self, step_time_s: float | None = None, parallel: int | None = None,
                 auto_squeeze: dict | None = None) -> None:
        self.step_time_s = step_time_s
        self.parallel = parallel
        if isinstance(auto_squeeze, DictConfig):
            auto_squeeze = OmegaConf.to_container(auto_squeeze, resolve=True)
        self.auto_squeeze = dict(auto_squeeze) if auto_squeeze else None
        """{threshold, ranks?}: written to the manifest, where the jobs read it."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # Hydra sets it only after this callback; sweep.dir needs it
        root = Path(config.hydra.sweep.dir)
        jobs = expand_grid(dict(config.hydra.sweeper.params or {}), list(config.hydra.overrides.task))
        folders = [run_folder(root, job, config) for job in jobs]
        shared = sorted({str(f) for f in folders if folders.count(f) > 1})
        if shared:
            # Hydra turns a callback's exception into a warning and launches anyway: stop here instead
            print(
                f"rlvr: these runs would share a folder: {', '.join(shared)}. A campaign's folders are "
                "<condition>/seed=<seed>: sweep only condition and seed (make other variations conditions)",
                file=sys.stderr,
            )
            raise SystemExit(2)
        threshold = (self.auto_squeeze or {}).get("threshold", 0.95)
        if self.auto_squeeze is not None and not 0 < threshold <= 1:
            print(f"rlvr: auto_squeeze.threshold={threshold} must be in (0, 1]", file=sys.stderr)
            raise SystemExit(2)
        parallel = self.parallel or int(config.hydra.launcher.get("array_parallelism", 0) or 1)
        plan = Plan(jobs, int(config.trainer.max_steps), self.step_time_s or measured_step_time(root), parallel,
                    planned_memory(config))
        print(plan.describe(), flush=True)
        root.mkdir(parents=True, exist_ok=True)
        with locked(root / MANIFEST) as manifest:
            known = {r["folder"]: r for r in manifest.get("runs", [])}
            manifest.update(
                campaign=root.name,
                launched=datetime.now(UTC).isoformat(timespec="seconds"),
                num_runs=len(jobs),
                max_steps=plan.max_steps,
                auto_squeeze=self.auto_squeeze,
                runs=[
                    {
                        **known.get(str(folder), {"state": "pending"}),
                        "condition": value_of(job, "condition"),
                        "seed": value_of(job, "seed"),
                        "overrides": job,
                        "folder": str(folder),
                    }
                    for job, folder in zip(jobs, folders, strict=True)
                ],
            )


def run_folder(root: Path, job: list[str], config: DictConfig) -> Path:
    condition = value_of(job, "condition") or config.hydra.runtime.choices.get("condition") or "none"
    return root / condition / f"seed={value_of(job, 'seed', str(config.seed))}"


@contextmanager
def locked(path: Path):
    """Read-modify-write `path` (a JSON object) under an exclusive lock: jobs of one array may finish at
    the same moment."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}
        yield data
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)


def record(root: Path, folder: Path, state: str, reason: str | None = None) -> None:
    """A job's own line in the campaign manifest (no-op outside a campaign)."""
    if not (root / MANIFEST).exists():
        return
    with locked(root / MANIFEST) as manifest:
        for run in manifest.get("runs", []):
            if Path(run["folder"]).resolve() == folder.resolve():
                run.update(
                    state=state,
                    reason=reason,
                    slurm_job_id=os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
                    slurm_array_task_id=os.environ.get("SLURM_ARRAY_TASK_ID"),
                    updated=datetime.now(UTC).isoformat(timespec="seconds"),
                )
    if state == "finished":
        auto_squeeze(root, folder)


def auto_squeeze(root: Path, folder: Path) -> dict | None:
    """If the campaign asks for it and no run has done it yet, analyse `folder`'s final adapter and record
    `squeeze` in the manifest (and the finished run's logger summary, when it has one). The slot is claimed
    under the lock, the analysis runs outside it. Never raises: the run itself has already finished."""
    with locked(root / MANIFEST) as manifest:
        settings = manifest.get("auto_squeeze")
        if not settings or "squeeze" in manifest:
            return None
        manifest["squeeze"] = {"state": "running", "run": str(folder)}
    result = _squeeze(folder, float(settings.get("threshold", 0.95)), settings.get("ranks"))
    with locked(root / MANIFEST) as manifest:
        manifest["squeeze"] = result
    if result["state"] == "done":
        log.info("squeeze: recommended LoRA rank %d of %d (>= %g%% variance) for %s", result["recommended_rank"],
                 result["source_rank"], 100 * result["threshold"], result["adapter"])
        _log_summary(folder, result)
    else:
        log.warning("squeeze %s: %s", result["state"], result["reason"])
    return result


def _squeeze(folder: Path, threshold: float, ranks: list[int] | None) -> dict:
    try:
        from rlvr.squeeze import SqueezeError, analyze_adapter  # torch: only in a job that has it loaded
    except ImportError as err:
        return {"state": "failed", "run": str(folder), "reason": str(err)}
    try:
        report = analyze_adapter(folder, threshold, ranks)
    except SqueezeError as err:  # e.g. full fine-tuning, or a Tinker run (the adapter is on the service)
        return {"state": "skipped", "run": str(folder), "reason": str(err)}
    except Exception as err:  # noqa: BLE001 - an analysis failure must not turn a finished run into a failed one
        return {"state": "failed", "run": str(folder), "reason": f"{type(err).__name__}: {err}"}
    return {
        "state": "done", "run": str(folder), "adapter": report.adapter, "threshold": threshold,
        "recommended_rank": report.recommended_rank, "every_layer_rank": report.every_layer_rank,
        "source_rank": report.source_rank, "num_layers": report.num_layers,
        "mean_variance": {str(k): round(v, 6) for k, v in zip(report.ranks, report.mean_variance, strict=True)},
    }


def _log_summary(folder: Path, result: dict) -> None:
    """The predecessor's squeeze summary keys (squeeze/recommended_rank, squeeze/source_rank,
    squeeze/num_layers, squeeze/min_variance_retention; plus squeeze/mean_variance/r<k>) on the finished
    run's own logger (`Logger.update_summary`: logger=wandb keeps them, logger=none drops them).
    Optional: failures are logged, not raised."""
    config_file = folder / ".hydra" / "config.yaml"
    if not config_file.is_file():
        return
    try:
        from hydra.utils import instantiate

        config = OmegaConf.load(config_file)
        if not isinstance(config, DictConfig):
            raise TypeError(f"{config_file} holds a list, not a config")
        node = config.get("logger")
        logger = instantiate(node) if node is not None and node.get("_target_") else None
        if logger is not None:
            values = {f"squeeze/{k}": result[k] for k in ("recommended_rank", "source_rank", "num_layers")}
            values["squeeze/min_variance_retention"] = result["threshold"]
            values.update({f"squeeze/mean_variance/r{k}": v for k, v in result["mean_variance"].items()})
            logger.update_summary(folder, values)
    except Exception as err:  # noqa: BLE001 - the summary is a convenience; the manifest has the result
        log.warning("squeeze: could not add the result to the run's logger summary: %s", err)
