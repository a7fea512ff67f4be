"""Sampling ahead of training against the synchronous loop, side by side (trainer.off_policy_steps, rlvr/overlap.py).

    .venv/bin/python -m bench.overlap                        # from the repository root; ~10 min on 2 cores
    .venv/bin/python -m bench.overlap --tasks long_tail --ks 0 1 2 4 --partial   # each k also with partial rollouts
    .venv/bin/python -m bench.overlap --steps 2 trainer.warmup.steps=0 --tasks default   # more overrides of every run

Per task, the same command at each trainer.off_policy_steps in `--ks` (default 0 and 1; the decoupled correction on
every run, so only the overlap differs), and with `--partial` each k ≥ 1 again with trainer.partial_rollouts=true
(rlvr/rollout/partial.py), one after the other, in alternating order per task so that load from other jobs hits them
alike:
  default    `python train.py` (the built-in arithmetic task, its cached SFT warm-up, threads=auto: 1 of 2 cores)
  guess      `python train.py env=guess` (16 games × 8 episodes a step, its warm-up)
  long_tail  `python train.py data=repeat` (rlvr/data/repeat.py): completions of ~2.5 tokens, a tenth of the prompts
             asking for 25–27: a step waits for its longest completion. A warm-up of 150 steps (not 800): it writes
             the long answers already, and leaves RL something to train every step (after 800 every group ties).
             Its training rows are packed end to end in every arm, k=0's too (backend.packing=true), as a long tail
             asks: padded, a batch holding one long completion trains its 64 rows at that length
             (`backend.packing=false` among the overrides measures it padded)
Per run: the RL loop's wall per step (the run's RL seconds less its evaluations', over its steps) and its ratio to
k=0's, the held-out accuracy at the end, and the mean idle fractions (async/trainer_idle_frac,
async/sampler_idle_frac). The load average before and after is printed: these are a shared machine's numbers.
What it measured, and when: docs/measured/overlap.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"default": [], "guess": ["env=guess"],
         "long_tail": ["data=repeat", "trainer.sampling.max_tokens=27", "trainer.eval_max_tokens=27",
                       "trainer.warmup.steps=150", "backend.packing=true"]}
DECOUPLED = ["correction=token_tis", "algorithm.loss.correction.pi_old=decoupled"]


def run(task: list[str], k: int, partial: bool, steps: int, folder: Path, overrides: list[str]) -> dict:
    argv = [sys.executable, "train.py", *task, *DECOUPLED, f"trainer.off_policy_steps={k}",
            f"trainer.partial_rollouts={str(partial).lower()}",
            f"trainer.max_steps={steps}", *overrides, f"hydra.run.dir={folder}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    steps_rows = [r for r in rows if "loss" in r]
    eval_s = sum(r["eval_time_s"] for r in evals[1:])  # the first is before the RL clock starts
    return {
        "k": k, "partial": partial,
        "step_s": (summary["rl_seconds"] - eval_s) / len(steps_rows),
        "accuracy": summary["eval_accuracy_final"],
        "trainer_idle": statistics.fmean(r.get("async/trainer_idle_frac", 0.0) for r in steps_rows),
        "sampler_idle": statistics.fmean(r.get("async/sampler_idle_frac", 0.0) for r in steps_rows),
        "sample_s": statistics.median(r["sample_time_s"] for r in steps_rows),
        "rest_s": statistics.median(r["step_time_s"] - r["sample_time_s"] for r in steps_rows),
        "length": statistics.fmean(r["mean_completion_length"] for r in steps_rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["default", "guess"])
    parser.add_argument("--ks", nargs="+", type=int, default=[0, 1], help="trainer.off_policy_steps values (0 first)")
    parser.add_argument("--partial", action="store_true", help="each k >= 1 also with trainer.partial_rollouts=true")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides of every run (trainer.warmup.steps=0)")
    args = parser.parse_args()
    if args.ks[0] != 0:
        parser.error("--ks: the first must be 0, the synchronous step the others are compared with")
    arms = [(k, False) for k in args.ks] + [(k, True) for k in args.ks if k and args.partial]
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-overlap-") as tmp:
        for i, name in enumerate(args.tasks):
            order = arms if i % 2 == 0 else arms[::-1]
            t0 = time.perf_counter()
            results = {arm: run(TASKS[name], *arm, args.steps, Path(tmp) / f"{name}-k{arm[0]}{'p' * arm[1]}",
                                args.overrides) for arm in order}
            print(f"\n{name} ({args.steps} steps; order {', '.join(label(*arm) for arm in order)}; "
                  f"{time.perf_counter() - t0:.0f} s)")
            print(f"  {'arm':>9} {'s/step':>8} {'vs k=0':>7} {'accuracy':>9} {'trainer idle':>13} {'sampler idle':>13}")
            sync = results[(0, False)]
            for arm in arms:
                r = results[arm]
                print(f"  {label(*arm):>9} {r['step_s']:>8.4f} {r['step_s'] / sync['step_s']:>6.2f}× "
                      f"{r['accuracy']:>9.3f} {r['trainer_idle']:>13.2f} {r['sampler_idle']:>13.2f}")
            ceiling = max(sync["sample_s"], sync["rest_s"]) / (sync["sample_s"] + sync["rest_s"])
            print(f"  k=0's medians: sampling {sync['sample_s']:.4f} s, the rest {sync['rest_s']:.4f} s; were they to "
                  f"overlap fully: {ceiling:.2f}×; completions {sync['length']:.1f} tokens on average")
            for k in args.ks[1:] if args.partial else []:
                print(f"  k={k}: partial rollouts {results[(k, True)]['step_s'] / results[(k, False)]['step_s']:.2f}× "
                      "the step without")
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def label(k: int, partial: bool) -> str:
    return f"k={k}" + (" partial" if partial else "")


if __name__ == "__main__":
    main()
