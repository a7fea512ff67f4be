"""`rlvr plan [OVERRIDES…]`: what a campaign would launch, before anything is submitted.

Composes `conf/train.yaml` with the overrides exactly as `python train.py` would (Hydra's compose API,
no model, no torch), expands the grid the way the multirun sweeper does, and prints runs, steps and an
estimated wall time (total steps × median step time / runs at once; docs/predecessor.md#campaigns), and with
engine=vllm what vLLM takes of the GPU beside the trainer while sampling and while training (engine.sleep_level);
from a synchronous pilot, the step time sampling ahead of training would give (trainer.off_policy_steps=1).
The step time is `--step-time`, or the median `step_time_s` of runs already in the campaign's folders (a pilot, or an
earlier launch of the same campaign). A packed grid (`hydra/launcher=packed`, or slurm's `pack_size` > 1) also gets its
packs, the base copies a pack holds and its wall time between all sampling shared and none (`packed`). With
`pack_size: null` the packs are sized to this machine's free memory (rlvr/pack/fit.py): that one case builds the
model on the meta device, so it imports torch, transformers and PEFT (no weights are read).

`--pilot PATH` (a folder of pilot runs, at least 2 seeds per condition): the power lines `rlvr compare` prints,
from the pilot's spread of seed-paired differences, for as many seeds as the campaign launches: the smallest
difference the campaign would find, and with `--detect D` the seeds D needs (rlvr/cli/power.py).
"""

from __future__ import annotations

from pathlib import Path

from rlvr.cli.runs import CliError


def pilot_power(pilot: Path, metrics: list[str] | None, seeds: int, detect: float | None) -> list[str]:
    """The power lines of each pair of the pilot's conditions (final values, paired by seed against compare's
    baseline), sized for `seeds` seeds."""
    from rlvr.cli.compare import compare, default_metrics
    from rlvr.cli.power import power_line, power_of
    from rlvr.cli.runs import load_runs

    runs = load_runs(pilot)
    lines = []
    for metric in metrics or default_metrics(runs):
        result = compare(runs, metric)
        lines.append(f"  power from the pilot {pilot} ({metric}, final values, paired by seed):")
        lines += [f"    {r['condition']} − {result['baseline']}: "
                  f"{power_line(power_of(r['diff']['values'], detect, seeds))}"
                  for r in result["conditions"] if "diff" in r]
    return lines


def packed(cfg, jobs: list[list[str]]) -> tuple[list[int] | None, str | None]:
    """The sizes of a packed grid's packs (hydra/launcher=packed, or slurm's pack_size > 1), grouped as the launcher
    groups them (rlvr/launcher/packed.py) from each job's model, engine, backend and threads, and with pack_size
    null sized to the memory free on this machine (rlvr/pack/fit.py: its line, else None); None: not packed."""
    from rlvr.campaign import value_of
    from rlvr.launcher.packed import alone, packs
    from rlvr.pack.fit import base_of, budget, filling, seeded

    launcher = cfg.hydra.launcher
    size = launcher.get("pack_size", 1)
    if "Packed" not in str(launcher.get("_target_", "")) or size == 1:
        return None, None
    shares = cfg.model.get("lora") is not None and not alone(cfg)
    keys = [None if not shares or value_of(job, "model.lora", "") == "null" else
            "|".join(value_of(job, k, "") for k in ("model", "engine", "backend", "threads")) for job in jobs]
    found = budget(cfg) if size is None and shares else None
    bases = [base_of(value_of(job, "seed", "-"), cfg.trainer.warmup.steps, seeded(cfg)) for job in jobs]
    sizes = [len(pack) for pack in packs(keys, size, filling(bases, found) if found else None)]
    return sizes, f"pack size (pack_size null): {found.describe()}" if found else None


def first_values(overrides: list[str]) -> list[str]:
    """The overrides with each sweep (`seed=0,1,2`) at its first value: Hydra composes one job, not a sweep (the
    grid is expanded from the overrides as given)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [f"{p.get_key_element()}={next(iter(p.sweep_string_iterator()))}" if p.is_sweep_override() else o
            for o, p in zip(overrides, parsed, strict=True)]


def run(overrides: list[str], conf: Path, step_time: float | None, parallel: int | None,
        pilot: Path | None = None, metrics: list[str] | None = None, detect: float | None = None) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from rlvr.campaign import (
        Plan,
        expand_grid,
        measured_sample_time,
        measured_step_time,
        overlapped_step_time,
        planned_memory,
        value_of,
    )
    from rlvr.pack.fit import base_of, seeded

    if not (conf / "train.yaml").is_file():
        raise CliError(f"{conf}: no train.yaml there (run from the repository root or pass --conf)")
    with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
        cfg = compose("train", overrides=first_values(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    params = dict(cfg.hydra.sweeper.params or {})
    if not params and not any("," in o for o in overrides):
        raise CliError("no grid: choose a campaign (campaign=smoke) or sweep keys (seed=0,1,2)")
    jobs = expand_grid(params, overrides)
    root = Path(cfg.hydra.sweep.dir)
    parallel = parallel or int(cfg.hydra.launcher.get("array_parallelism", 0) or 1)
    packs, sizing = packed(cfg, jobs)
    if packs is not None and not cfg.hydra.launcher.get("array_parallelism"):
        parallel = 1  # hydra/launcher=packed: one pack after another
    bases = len({base_of(value_of(job, "seed", "-"), cfg.trainer.warmup.steps, seeded(cfg)) for job in jobs})
    plan = Plan(jobs, int(cfg.trainer.max_steps), step_time or measured_step_time(root), parallel, planned_memory(cfg),
                overlapped_step_time(root), packs, measured_sample_time(root),
                min(bases, max(packs)) if packs and max(packs) > 1 else 0)
    text = "\n".join([plan.describe(), *([f"  {sizing}"] if sizing else []),
                      f"  runs land in: {root}/<condition>/seed=<seed>"])
    if pilot is None:
        return text
    seeds = len({value_of(job, "seed", "-") for job in jobs})
    return "\n".join([text, *pilot_power(pilot, metrics, seeds, detect)])
