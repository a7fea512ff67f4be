"""Sampling ahead of training against the synchronous loop, side by side (trainer.off_policy_steps, rlvr/overlap.py).

    .venv/bin/python -m bench.overlap                        # from the repository root; ~10 min on 2 cores
    .venv/bin/python -m bench.overlap --steps 100 --tasks default
    .venv/bin/python -m bench.overlap --steps 2 trainer.warmup.steps=0 --tasks default   # more overrides of every run

Per task, the same command with trainer.off_policy_steps=0 and =1 (the decoupled correction on both, so only the
overlap differs), one after the other, in alternating order per task so that load from other jobs hits both
alike:
  default  `python train.py` (the built-in arithmetic task, its cached SFT warm-up, threads=auto: 1 of 2 cores)
  guess    `python train.py env=guess` (16 games × 8 episodes a step, its warm-up)
Per run: the RL loop's wall per step (the run's RL seconds less its evaluations', over its steps), the held-out
accuracy at the end, and the mean idle fractions (async/trainer_idle_frac, async/sampler_idle_frac). The ratio
k=1 / k=0 of wall per step is the figure (the issue's goal: ≤ 0.7; 0.5 is the ceiling when sampling and training
take equal time). The load average before and after is printed: these are a shared machine's numbers.

Measured on the shared 2-core machine, 2026-12-03, default arguments (300 steps each), engine=pytorch sampling in
its forked worker process (rlvr/engine/sampler_process.py), twice: load average 0.36 before the first run (1.07
after), 0.99 before the second (just after a test suite; 1.21 after):
  default  k=0 0.0705 / 0.0791 s a step, k=1 0.0448 / 0.0534 s: 0.64× / 0.68× (goal ≤ 0.7); held-out accuracy
           0.923 (k=0) and 0.918 (k=1) both times (goal ≥ 0.85). The synchronous step's halves are about equal
           (sampling 0.033–0.037 s, the rest 0.034–0.037 s), so full overlap would give 0.51×.
  guess    k=0 0.271 / 0.273 s, k=1 0.187 / 0.191 s: 0.69× / 0.70×; accuracy 0.445 for k=0 and k=1 both times.
           Full overlap would give 0.53×: the episodes' turns are played in the sampler thread (the environment is
           Python, under the trainer's GIL) and each turn's decoding is a call to the worker.
  Idle fractions (k=1): trainer 0.06 (default) and 0.12–0.15 (guess), sampler 0.27 and 0.05–0.07.
Before the worker process (the sampler a thread decoding under the trainer's GIL), the same script gave 0.83× and
0.75× on the default task and 0.70× and 0.64× on guess (load average 1.8 and 1.3).
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
TASKS = {"default": [], "guess": ["env=guess"]}
DECOUPLED = ["correction=token_tis", "algorithm.loss.correction.pi_old=decoupled"]


def run(task: list[str], k: int, steps: int, folder: Path, overrides: list[str]) -> dict:
    argv = [sys.executable, "train.py", *task, *DECOUPLED, f"trainer.off_policy_steps={k}",
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
        "k": k,
        "step_s": (summary["rl_seconds"] - eval_s) / len(steps_rows),
        "accuracy": summary["eval_accuracy_final"],
        "trainer_idle": statistics.fmean(r.get("async/trainer_idle_frac", 0.0) for r in steps_rows),
        "sampler_idle": statistics.fmean(r.get("async/sampler_idle_frac", 0.0) for r in steps_rows),
        "sample_s": statistics.median(r["sample_time_s"] for r in steps_rows),
        "rest_s": statistics.median(r["step_time_s"] - r["sample_time_s"] for r in steps_rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    parser.add_argument("overrides", nargs="*", help="more key=value overrides of every run (trainer.warmup.steps=0)")
    args = parser.parse_args()
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-overlap-") as tmp:
        for i, name in enumerate(args.tasks):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            t0 = time.perf_counter()
            results = {k: run(TASKS[name], k, args.steps, Path(tmp) / f"{name}-k{k}", args.overrides) for k in order}
            print(f"\n{name} ({args.steps} steps; order k={order[0]}, k={order[1]}; {time.perf_counter() - t0:.0f} s)")
            print(f"  {'k':>2} {'s/step':>8} {'accuracy':>9} {'trainer idle':>13} {'sampler idle':>13}")
            for k in (0, 1):
                r = results[k]
                print(f"  {k:>2} {r['step_s']:>8.4f} {r['accuracy']:>9.3f} {r['trainer_idle']:>13.2f} "
                      f"{r['sampler_idle']:>13.2f}")
            sync = results[0]
            ceiling = max(sync["sample_s"], sync["rest_s"]) / (sync["sample_s"] + sync["rest_s"])
            print(f"  wall per step k=1 / k=0: {results[1]['step_s'] / results[0]['step_s']:.2f}× (k=0's medians: "
                  f"sampling {sync['sample_s']:.4f} s, the rest {sync['rest_s']:.4f} s; were they to overlap "
                  f"fully: {ceiling:.2f}×)")
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
