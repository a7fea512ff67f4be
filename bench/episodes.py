"""Episodes against single turns, side by side: rows trained per second by `env=guess` and by the default task.

    .venv/bin/python -m bench.episodes                      # from the repository root; ~1 min on 2 cores
    .venv/bin/python -m bench.episodes --steps 40 --profile

Two trainers in one process, each composed from conf/ as `python train.py` composes it, with 128 rows a step:
  single   `python train.py trainer.batch_size=16` (the built-in arithmetic task, 16 prompts × 8 completions)
  guess    `python train.py env=guess` (16 games × 8 episodes of up to 3 turns)
both with their cached SFT warm-ups (trained the first time: about a minute each), one torch thread, inside the
stop-signal handlers a run installs (rlvr/preemption.py). After `--skip` uncounted steps each, their steps
alternate (single, guess, single, …) so that load from other jobs hits both alike. Per side: rows per second of
`Trainer.step` (the measured steps' rows over their seconds), by the wall clock and by the process's CPU time (on a
shared machine the CPU time is the steadier: one thread, so it is the step's own work), the median step's
sampling and scoring time from the step's row, and the ratio guess / single of each (issue 26's goal: ≥ 0.9).
`--profile` also prints the top of a cProfile of the guess side's measured steps. The load average before and
after is printed.

Measured on the shared 2-core machine, 2026-12-04, default arguments (40 steps a side, ~50 s), load average ~1.3,
the two versions one after the other:
  before (62e481b: every turn re-encoded, a task and a timer per environment call, per-row bookkeeping)
    single 1,073 rows/s, guess 550 rows/s: 0.51× (CPU time 0.51×); guess's median step 0.215 s, of which
    sampling 0.103 s and the environment 0.011 s (single: 0.117 s, sampling 0.043 s)
  after (each episode's KV cache kept between turns, calls that never suspend run without a task or timer, one
  tolist and one tensor per turn and per field)
    single 1,124 rows/s, guess 840 rows/s: 0.75× (CPU time 0.75×); guess's median step 0.154 s, sampling 0.054 s,
    the environment 0.003 s (single: 0.114 s, sampling 0.040 s)
  At load ~7 an hour earlier: 0.53× before, 0.74× after. Short of issue 26's 0.9×. What is left: sampling 0.014 s
  a step more than single's (three turns are six forwards of the model; 128 generators a turn, one per episode,
  where single draws from 16 groups) and the rest of the step 0.023 s more: training, which the rollout loop does
  not touch (the guess rows carry ~500 action tokens a step with a non-zero advantage against single's ~210, whose
  groups tie more often: the step rows' `rl/nonzero_advantage_action_tokens`). Equal sampling and environment
  time would give ~0.83×.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"single": ["trainer.batch_size=16"], "guess": ["env=guess"]}
"""Each side's overrides of conf/train.yaml: 128 rows a step each (16 × trainer.group_size 8)."""
ROWS = 128


@dataclass
class Side:
    """One trainer, started, and what its measured steps took."""

    name: str
    trainer: Any
    live: Any
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)

    def step(self, step: int, measured: bool) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        row = self.trainer.step(self.live, step)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if measured:
            self.walls.append(wall)
            self.cpus.append(cpu)
            self.rows.append(row)

    def rows_per_s(self, cpu: bool = False) -> float:
        return ROWS * len(self.walls) / sum(self.cpus if cpu else self.walls)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.rows)


def start(name: str, overrides: list[str], seed: int, folder: Path, stop: Any = None) -> Side:
    """A trainer composed from conf/ with `overrides`, its policy loaded and warmed up, ready to step."""
    from hydra import compose, initialize_config_dir

    from rlvr.outputs import RunDir
    from rlvr.run import build_all

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"seed={seed}", "threads=1"])
    c, trainer = build_all(cfg)
    live = trainer.start(c, RunDir(folder / name), stop)
    live.sampler = trainer._sampler(live, 0)
    live.sampler.start(0, [])
    return Side(name, trainer, live)


def table(sides: list[Side]) -> str:
    lines = [f"  {'side':<8} {'rows/s':>8} {'rows/cpu-s':>11} {'s/step':>8} {'sampling':>9} {'scoring':>8}"]
    for s in sides:
        lines.append(f"  {s.name:<8} {s.rows_per_s():>8.1f} {s.rows_per_s(cpu=True):>11.1f} "
                     f"{statistics.median(s.walls):>8.4f} {s.median('sample_time_s'):>9.4f} "
                     f"{s.median('score_time_s'):>8.4f}")
    single, guess = sides
    lines.append(f"  rows/s guess / single: {guess.rows_per_s() / single.rows_per_s():.2f}× (wall), "
                 f"{guess.rows_per_s(cpu=True) / single.rows_per_s(cpu=True):.2f}× (CPU)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="measured steps per side")
    parser.add_argument("--skip", type=int, default=3, help="uncounted steps per side first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the guess side's measured steps")
    args = parser.parse_args()
    import torch

    from rlvr.preemption import StopSignals

    torch.set_num_threads(1)
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-episodes-") as tmp, StopSignals() as stop:
        sides = [start(name, overrides, args.seed, Path(tmp), stop) for name, overrides in SIDES.items()]
        for step in range(args.skip + args.steps):
            for side in sides:
                measured = step >= args.skip
                if profiler is not None and measured and side.name == "guess":
                    profiler.enable()
                side.step(step, measured)
                if profiler is not None:
                    profiler.disable()
    print(f"\n{args.steps} steps a side, alternating ({args.skip} uncounted first), {ROWS} rows a step, 1 thread")
    print(table(sides))
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if profiler is not None:
        import pstats

        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
