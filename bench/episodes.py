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

Besides the ratio of rows per second: each side's median training time and tokens with a non-zero advantage
(`rl/nonzero_advantage_action_tokens`); the median step's seconds in the engine model's forward passes, part of its
sampling (`Forwards`: hooks on the module the engine samples from, the merged copy that the trainer never runs);
the ratio of the rollout alone (the median step's sampling + scoring); and the ratio of rows per second were
guess's rollout as long as single's (each side's measured seconds with guess's sampling + scoring swapped for
single's): what training and the rest of the step leave reachable by making the episode loop cheaper.

Measured on the shared 2-core machine, 2026-12-04, default arguments (40 steps a side, ~1 min a run):
  62e481b (every turn re-encoded, a task and a timer per environment call, per-row bookkeeping), load ~1.3
    single 1,073 rows/s, guess 550 rows/s: 0.51×
  b15cac5 (each episode's KV cache kept between turns, calls that never suspend run without a task or timer, one
  tolist and one tensor per turn and per field) against a90d763 (the sampling noise of model=tiny's 15-token
  vocabulary drawn for a turn's steps at once, no semaphore without env.max_concurrent, actions decoded and first
  observations encoded once per distinct one, the startup heap frozen out of the garbage collector's full passes),
  three runs each, alternating, load 0.6–1.0:
    before  rows/s 0.74× 0.74× 0.75×    rollout alone 0.73× 0.73× 0.77×
    after   rows/s 0.78× 0.79× 0.80×    rollout alone 0.80× 0.82× 0.84×
  e.g. after: single 1,475 rows/s (step 0.086 s: sampling 0.030, training 0.054), guess 1,179 rows/s (step 0.108 s:
  sampling 0.035, scoring 0.0015, training 0.069).
  Short of issue 26's 0.9×. Most of what is left is training: the guess side trains ~118 rows a step of 9 positions
  (~1,060 positions, 512 tokens with an advantage) where single's tied groups leave ~80 rows of 10 (~800, 280
  tokens), and the step's matrix products grow with the positions (training 0.069 s against 0.054). Equal training
  time would put the ratio at ~0.92×. The rollout's remainder is Python spread thin over 128 episodes' turns: the
  environment guard's checks, the seeds of each turn, a generator per episode, the bookkeeping of rows; its model
  forwards take no longer than single's (six small ones against one prefill of seven tokens and three decodes).
  At a8b1214 with the forward passes timed, three runs, load 0.3–0.6:
    rows/s 0.77× 0.80× 0.78×    rollout alone 0.78× 0.79× 0.80×    were guess's rollout single's: 0.84× 0.85× 0.84×
  e.g. single 1,417 rows/s (sampling 0.032 s, of it forwards 0.027; training 0.055), guess 1,100 rows/s (sampling
  0.038 s, of it forwards 0.025; scoring 0.0016; training 0.070). Guess's model forwards take less than single's;
  its loop costs ~9 ms a step more than single's (~25 µs an episode's turn), and with no more than single's the
  ratio would still be 0.84–0.85×: the training of the rows reward-to-go credit leaves an advantage keeps it under
  0.9×.
  At f253476 (a chunk's prefill feeds each group's prompt once: bench/prefill.py), two runs, load 0.7:
    rows/s 0.73× 0.70×    rollout alone 0.54× 0.54×    were guess's rollout single's: 0.85× 0.82×
  e.g. single 1,567 rows/s (sampling 0.021 s, of it forwards 0.016; training 0.058), guess 1,140 rows/s (sampling
  0.037 s, of it forwards 0.023; scoring 0.0016; training 0.068). Single's sampling lost its 128-row prefill (16
  prompts fed once); guess's first turn prefills one token, so the ratio fell while both sides got no slower.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"single": ["trainer.batch_size=16"], "guess": ["env=guess"]}
"""Each side's overrides of conf/train.yaml: 128 rows a step each (16 × trainer.group_size 8)."""
ROWS = 128


class Forwards:
    """The seconds the engine's model spends in its forward passes (the sampling's decoding, without what the loop
    around it does), summed until reset: a pre-hook and a hook on the engine's module. With `merge_lora` (the
    default) that is the merged copy the engine samples from, which the trainer never runs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.started = 0.0

    def attach(self, module: Any) -> None:
        module.register_forward_pre_hook(self.pre)
        module.register_forward_hook(self.post)

    def pre(self, *_: Any) -> None:
        self.started = time.perf_counter()

    def post(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self.started


@dataclass
class Side:
    """One trainer, started, and what its measured steps took."""

    name: str
    trainer: Any
    live: Any
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    forwards: Forwards = field(default_factory=Forwards)
    forward_s: list[float] = field(default_factory=list)
    """Each measured step's seconds in the engine's model forwards (`Forwards`)."""

    def step(self, step: int, measured: bool) -> None:
        self.forwards.seconds = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        row = self.trainer.step(self.live, step).row
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if measured:
            self.walls.append(wall)
            self.cpus.append(cpu)
            self.rows.append(row)
            self.forward_s.append(self.forwards.seconds)

    def rows_per_s(self, cpu: bool = False) -> float:
        return ROWS * len(self.walls) / sum(self.cpus if cpu else self.walls)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.rows)


def start(name: str, overrides: list[str], seed: int, folder: Path, steps: ExitStack, stop: Any = None) -> Side:
    """A trainer composed from conf/ with `overrides`, its policy loaded and warmed up, ready to step (`fit`'s
    `Trainer.stepping`, entered on `steps`) from step 0."""
    from hydra import compose, initialize_config_dir

    from rlvr.build import build_all
    from rlvr.outputs import RunDir
    from rlvr.start import start

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"seed={seed}", "threads=1"])
    c, trainer = build_all(cfg)
    live = start(c, trainer.warmup, trainer.keep_last, RunDir(folder / name), stop)
    live = steps.enter_context(trainer.stepping(live))
    side, engine = Side(name, trainer, live), cast(Any, live.engine)  # engine=pytorch: it has a module
    if engine.module is live.backend.policy:
        raise SystemExit("the engine samples from the trained module itself (engine.merge_lora=false?): its forward "
                         "passes would count the training's too")
    side.forwards.attach(engine.module)
    return side


def table(sides: list[Side]) -> str:
    lines = [f"  {'side':<8} {'rows/s':>8} {'rows/cpu-s':>11} {'s/step':>8} {'sampling':>9} {'(forwards)':>10} "
             f"{'scoring':>8} {'training':>9} {'trained tokens':>15}"]
    for s in sides:
        lines.append(f"  {s.name:<8} {s.rows_per_s():>8.1f} {s.rows_per_s(cpu=True):>11.1f} "
                     f"{statistics.median(s.walls):>8.4f} {s.median('sample_time_s'):>9.4f} "
                     f"{statistics.median(s.forward_s):>10.4f} {s.median('score_time_s'):>8.4f} "
                     f"{s.median('train_time_s'):>9.4f} {s.median('rl/nonzero_advantage_action_tokens'):>15.0f}")
    single, guess = sides
    lines.append(f"  rows/s guess / single: {guess.rows_per_s() / single.rows_per_s():.2f}× (wall), "
                 f"{guess.rows_per_s(cpu=True) / single.rows_per_s(cpu=True):.2f}× (CPU)")
    lines.append(f"  rows/s of the rollout alone (the median step's sampling + scoring), guess / single: "
                 f"{rollout(single) / rollout(guess):.2f}×")
    swapped = sum(guess.walls) - rollout_total(guess) + rollout_total(single)
    lines.append(f"  rows/s guess / single were guess's rollout as long as single's (each step's sampling + scoring "
                 f"swapped for single's): {sum(single.walls) / swapped:.2f}×")
    return "\n".join(lines)


def rollout(side: Side) -> float:
    """The median step's sampling and scoring seconds."""
    return side.median("sample_time_s") + side.median("score_time_s")


def rollout_total(side: Side) -> float:
    """The measured steps' sampling and scoring seconds, summed."""
    return sum(r["sample_time_s"] + r["score_time_s"] for r in side.rows)


def main(argv: list[str] | None = None) -> list[Side]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="measured steps per side")
    parser.add_argument("--skip", type=int, default=3, help="uncounted steps per side first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the guess side's measured steps")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides of both sides (trainer.warmup.steps=0)")
    args = parser.parse_args(argv)
    import torch

    from rlvr.preemption import StopSignals
    from rlvr.trainer import freeze_startup_heap

    torch.set_num_threads(1)
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-episodes-") as tmp, StopSignals() as stop, ExitStack() as steps:
        sides = [start(name, [*overrides, *args.overrides], args.seed, Path(tmp), steps, stop)
                 for name, overrides in SIDES.items()]
        freeze_startup_heap()  # as `Trainer.fit` does before its first step
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
    return sides


if __name__ == "__main__":
    main()
