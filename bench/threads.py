"""Wall time of a shortened default run at each torch thread count, on an idle and on a busy machine, side by side.

    .venv/bin/python -m bench.threads                       # threads 1, 2 and auto; 0 and 2 busy processes
    .venv/bin/python -m bench.threads --threads 1,2 --busy 0,2,4 --rounds 3

Each measurement is one `python train.py` child (the default config: tiny model, warm-up, RL, evaluations) with
`threads=<k>` and a shortened schedule (`--warmup-steps`, `--steps`, a 200-pair held-out set, no warm-up
cache), timed from start to exit. "Busy" starts that many CPU-bound processes (a Python spin loop each,
standing for other users' jobs) before the child and stops them after it. The settings run interleaved,
round after round (1, 2, auto, 1, 2, auto, …), so drifting load from the rest of the machine hits them
alike; the table gives each setting's median and its ratio to threads=1 under the same load, and the
1-minute load average seen at each start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def timed_run(threads: str, args: argparse.Namespace, folder: Path) -> float:
    command = [
        sys.executable, "train.py", f"threads={threads}", f"trainer.warmup.steps={args.warmup_steps}",
        f"trainer.max_steps={args.steps}", "trainer.eval_every=0", "trainer.save_every=0", "data.eval_size=200",
        "trainer.warmup.cache_dir=null", f"hydra.run.dir={folder}",
    ]
    t0 = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - t0


def measure(args: argparse.Namespace) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """(busy, threads) -> [(seconds, load average at start), …]."""
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for busy in args.busy:
            burners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
            try:
                time.sleep(2 if busy else 0)  # let the load average see them
                for r in range(args.rounds):
                    for threads in args.threads:
                        load = os.getloadavg()[0]
                        seconds = timed_run(threads, args, Path(tmp) / f"b{busy}-t{threads}-r{r}")
                        results.setdefault((busy, threads), []).append((seconds, load))
                        print(f"busy={busy} threads={threads} round {r}: {seconds:.1f} s (load {load:.1f})", flush=True)
            finally:
                for p in burners:
                    p.kill()
                    p.wait()
    return results


def print_table(results: dict, args: argparse.Namespace) -> None:
    print(f"\n{os.cpu_count()} cores; {args.warmup_steps} warm-up + {args.steps} RL steps per run; "
          f"medians of {args.rounds} rounds")
    print(f"{'busy':>4}  {'threads':>7}  {'median s':>8}  {'vs threads=1':>12}  {'load at start':>13}")
    for busy in args.busy:
        one = statistics.median(s for s, _ in results[(busy, "1")]) if (busy, "1") in results else None
        for threads in args.threads:
            runs = results[(busy, threads)]
            median = statistics.median(s for s, _ in runs)
            ratio = f"{median / one:.2f}×" if one else "-"
            loads = ", ".join(f"{load:.1f}" for _, load in runs)
            print(f"{busy:>4}  {threads:>7}  {median:>8.1f}  {ratio:>12}  {loads:>13}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2,auto", help="comma-separated `threads=` values")
    parser.add_argument("--busy", default="0,2", help="comma-separated counts of CPU-bound processes beside the run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    args.threads = args.threads.split(",")
    args.busy = [int(b) for b in args.busy.split(",")]
    print_table(measure(args), args)


if __name__ == "__main__":
    main()
