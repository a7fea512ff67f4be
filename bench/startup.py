"""Start-up of the default run: seconds from process start to its first RL step, where they go, and the imports.

    .venv/bin/python -m bench.startup                   # 3 timed runs, 3 bare imports, one run under -X importtime
    .venv/bin/python -m bench.startup --rounds 5 --top 15

Each run is one `python train.py trainer.max_steps=2` child: the default config (tiny model, engine=pytorch,
backend=local, the warm-up loaded from its cache under ~/.cache/rlvr/warmup), writing into a folder of its own under
a temporary directory. One untimed run goes first: it fills the warm-up cache if it is empty (a minute) and warms the
page cache, so every timed run starts as the jobs of a grid do. A run's first RL step starts when the trainer's clock
`t_rl` does (rlvr/trainer.py `_loop`): summary.json is written `rl_seconds` after it, so that moment is the file's
modification time less `rl_seconds`, and the figure is that moment less the one at which this script started the
child. Between the two, train.log's own timestamps split the start-up into phases (`PHASES`).

Beside the runs, fresh `python -c` children import what the run cannot do without (torch; torch, transformers'
Llama modelling and PEFT, whose LoRA the default run trains), with the cyclic garbage collector off as the run
imports them (rlvr/lazy.py): the part of the start-up that no change to rlvr can remove. Last, one run under
`python -X importtime` gives the imports' share of its own start-up (importtime slows every import, so the share
is taken within that one run) and the packages whose modules took longest.
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
from collections import Counter
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["train.py", "trainer.max_steps=2"]
PHASES = (
    ("Hydra: compose, check the config", "building model"),
    ("build, machine check (imports torch)", "loading policy"),
    ("policy (imports transformers)", "warm-up loaded from"),
    ("adapter (imports peft)", "trainable parameters"),
    ("first evaluation", None),
)
"""(phase, the train.log text of the line that ends it); the last ends at the first RL step."""
BARE_IMPORTS = (("import torch", "import gc; gc.disable(); import torch"),
                ("import torch, transformers' Llama, peft",
                 "import gc; gc.disable(); import torch, transformers.models.llama.modeling_llama, peft"))
"""What the default run cannot do without, each imported with the garbage collector off, as the run imports them
(rlvr/lazy.py)."""


def child_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_once(folder: Path, importtime: bool = False) -> tuple[float, list[float], str]:
    """(seconds from process start to the first RL step, [the log's phase ends, seconds from process start], stderr)
    of one default run writing into `folder`."""
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), *COMMAND, f"hydra.run.dir={folder}"]
    started = time.time()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=child_env())
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    summary = folder / "summary.json"
    first_step = summary.stat().st_mtime - json.loads(summary.read_text())["rl_seconds"] - started
    return first_step, phase_ends(folder / "train.log", started, first_step), proc.stderr


def phase_ends(log: Path, started: float, first_step: float) -> list[float]:
    """Seconds from process start to the first train.log line holding each phase's closing text (NaN if none does),
    the first RL step last."""
    stamps: list[tuple[float, str]] = []
    for line in log.read_text().splitlines():
        try:
            stamps.append((datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp() - started, line))
        except ValueError:
            continue
    ends = [next((t for t, line in stamps if text in line), float("nan")) for _, text in PHASES[:-1]]
    return [*ends, first_step]


def bare_import(code: str) -> float:
    """Wall seconds of a fresh `python -c code`."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env=child_env())
    return time.perf_counter() - started


def import_seconds(stderr: str) -> tuple[float, Counter]:
    """(all imports' seconds, {top-level package: its modules' own seconds}) from `-X importtime` output."""
    by_package: Counter[str] = Counter()  # microseconds, made seconds on return
    for line in stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own, _, name = line[len("import time:"):].split("|")
            by_package[name.strip().split(".")[0]] += int(own)
    seconds = Counter({package: micro / 1e6 for package, micro in by_package.items()})
    return sum(seconds.values()), seconds


def measure(args: argparse.Namespace, tmp: Path) -> dict:
    run_once(tmp / "untimed")
    runs: list[tuple[float, list[float]]] = []
    bare: dict[str, list[float]] = {label: [] for label, _ in BARE_IMPORTS}
    for r in range(args.rounds):  # interleaved, so drifting load from other jobs hits runs and imports alike
        runs.append(run_once(tmp / f"run{r}")[:2])
        for label, code in BARE_IMPORTS:
            bare[label].append(bare_import(code))
        print(f"round {r}: first RL step at {runs[-1][0]:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    first_step, _, stderr = run_once(tmp / "importtime", importtime=True)
    return {"runs": runs, "bare": bare, "importtime": (first_step, *import_seconds(stderr))}


def print_table(m: dict, top: int) -> None:
    runs, bare = m["runs"], m["bare"]
    first = statistics.median(s for s, _ in runs)
    print(f"\n`python {' '.join(COMMAND)}`, {len(runs)} runs, {os.cpu_count()} cores: medians (each run's in brackets)")
    print(f"  {'process start -> first RL step':<44} {first:6.2f} s  [{' '.join(f'{s:.2f}' for s, _ in runs)}]")
    for i, (phase, _) in enumerate(PHASES):
        spans = [ends[i] - (ends[i - 1] if i else 0.0) for _, ends in runs]
        print(f"    {phase:<42} {statistics.median(spans):6.2f} s")
    print("  imported alone, fresh processes (what the run must import):")
    for label, seconds in bare.items():
        median = statistics.median(seconds)
        print(f"    {label:<42} {median:6.2f} s  = {median / first:.0%} of the start-up above")
    step, total, by_package = m["importtime"]
    print(f"under -X importtime (one run, slowed by it): first RL step at {step:.2f} s, "
          f"imports {total:.2f} s = {total / step:.0%} of it")
    for package, seconds in by_package.most_common(top):
        print(f"    {package:<42} {seconds:6.2f} s  {seconds / total:4.0%} of imports")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=10, help="packages listed by import time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print_table(measure(args, Path(tmp)), args.top)


if __name__ == "__main__":
    main()
