"""A grid packed against the same grid run one job after another, side by side: wall time and peak memory.

    .venv/bin/python -m bench.grid                          # 2 conditions × 3 seeds of the default task, 300 steps
    .venv/bin/python -m bench.grid --steps 50 --conditions grpo,maxrl --seeds 0,1,2
    .venv/bin/python -m bench.grid --steps 100 engine=vllm  # sampled by vLLM: a pack holds one per base

Three commands, each a fresh `python train.py` child timed from start to exit, its peak resident memory read from
the kernel (the child's ru_maxrss, which for the multirun is its one process):
  single   one run of the grid (its first condition and seed) alone, the unit the ratios divide by;
  basic    the grid with Hydra's basic launcher: `--multirun`, the runs one after another in one process;
  packed   the grid with `hydra/launcher=packed`: its runs as the cells of one process (rlvr/pack/).
The warm-ups are read from the cache (trained into it first, by a run of each seed with one RL step, not timed),
as they are for a researcher's second grid. Then each packed run's metrics.jsonl is compared with the basic
launcher's run of the same job, every field but the timing ones: the bench says how many rows differ (0 expected).
The target: packed wall ≤ 0.35× basic, packed peak memory ≤ 2× single. Last, what bounds the gain on this machine:
the seconds of one forward and backward pass of the default run's policy (the tiny model with its LoRA adapter, one
torch thread) over one run's rows of a step (8 prompts × 8 completions of 15 tokens) and over the grid's (× runs):
when the second is the first × runs, a step's training is arithmetic that batching runs together cannot save.

On a GPU (`--gpu`): the same three commands on a model folder written offline with Qwen3-0.6B's architecture and
random weights (bench/gpu_check.py `write_model`: nothing is downloaded), LoRA r=32, engine=pytorch on CUDA, the
arithmetic prompts with gpu_check's parity reward (a random model answers nothing), no warm-up, `--steps` steps
(default 50 there), `--max-tokens` tokens a completion. The peak memory is then the host's; torch's GPU peak per run
is each run's `gpu_max_allocated_mb` row field.

    .venv/bin/python -m bench.grid --gpu                    # ~10 min on one H100
    .venv/bin/python -m bench.grid --gpu engine=vllm        # vLLM's multi-LoRA batching: one vLLM, six adapters

(a pretrained model without a warm-up is one base for every seed: the packed grid's cells share one vLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"(_s$|_share$|_seconds$|per_second|_time$|^time/|^async/.*_frac$|throughput|memory|_mb$|_gb$"
                    r"|rss|wall)")


def child(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of one child process running `command`."""
    t0 = time.perf_counter()
    pid = subprocess.Popen([sys.executable, *command], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(pid.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(command)} exited with {status}:\n{pid.stderr.read().decode()[-3000:]}")
    return wall, usage.ru_maxrss / 1024


def differing_rows(a: Path, b: Path) -> int:
    """Rows of two metrics.jsonl that differ in a field other than timing ones (or in count)."""
    rows_a = [json.loads(line) for line in a.read_text().splitlines()]
    rows_b = [json.loads(line) for line in b.read_text().splitlines()]
    differ = abs(len(rows_a) - len(rows_b))
    for x, y in zip(rows_a, rows_b, strict=False):
        keys = {k for k in x.keys() | y.keys() if not TIMING.search(k)}
        differ += any(x.get(k) != y.get(k) for k in keys)
    return differ


def gpu_overrides(folder: Path, args: argparse.Namespace) -> list[str]:
    """`--gpu`: the random-weight Qwen3-0.6B written to `folder`, and the overrides that train it with LoRA on CUDA."""
    from bench.gpu_check import write_model

    write_model(folder, layers=28, hidden=None, dtype="bfloat16")
    return ["model=pretrained", f"model.name_or_path={folder}", "model.dtype=bfloat16", "backend.device=cuda",
            "reward=function", "reward.function=bench.gpu_check.parity", "trainer.warmup.steps=0",
            f"trainer.sampling.max_tokens={args.max_tokens}", f"trainer.eval_max_tokens={args.max_tokens}",
            "data.eval_size=64", "trainer.eval_every=0", "trainer.lr=1e-5", "trainer.max_skipped_steps=0"]


def training_scaling(runs: int) -> tuple[float, float]:
    """Seconds of a forward and backward pass of the default policy over 64 rows and over 64 × `runs` rows."""
    import torch

    from rlvr.backend.local import prepare
    from rlvr.model.tiny import TinyLlama
    from rlvr.types import LoraSpec

    torch.set_num_threads(1)
    lora = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "gate_proj", "up_proj", "down_proj"])
    preset = TinyLlama(alphabet="0123456789+=", hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4,
                       max_positions=32, dtype="float32", lora=lora)
    model = prepare(preset.load(0)[0], lora, 1, gradient_checkpointing=False)
    seconds = []
    for rows in (64, 64 * runs):
        ids = torch.randint(3, 15, (rows, 15))
        for passes in (3, 10):  # the first, untimed: allocation
            t0 = time.perf_counter()
            for _ in range(passes):
                model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()
        seconds.append((time.perf_counter() - t0) / 10)
    return seconds[0], seconds[1]


def measure(out: Path, common: list[str], grid: list[str], first: list[str], rounds: int) -> tuple[dict, int, int]:
    """Each command's (wall, peak MiB) round after round (single, basic, packed, single, …: drifting load hits them
    alike); the rows that differ between the last round's packed and basic runs, and how many runs."""
    found: dict[str, list[tuple[float, float]]] = {"single": [], "basic": [], "packed": []}
    for r in range(rounds):
        found["single"].append(child(["train.py", *common, *first, f"hydra.run.dir={out / f'single{r}'}"]))
        found["basic"].append(child(["train.py", "--multirun", *common, *grid, f"hydra.sweep.dir={out / f'basic{r}'}"]))
        found["packed"].append(child(["train.py", "--multirun", *common, *grid, "hydra/launcher=packed",
                                      f"hydra.sweep.dir={out / f'packed{r}'}"]))
    last = rounds - 1
    jobs = sorted(p.name for p in (out / f"basic{last}").iterdir() if (p / "metrics.jsonl").exists())
    differ = sum(differing_rows(out / f"basic{last}" / j / "metrics.jsonl", out / f"packed{last}" / j / "metrics.jsonl")
                 for j in jobs)
    return found, differ, len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", default="grpo,maxrl")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=None, help="default: 300 (the default run's), 50 with --gpu")
    parser.add_argument("--rounds", type=int, default=1, help="each command this many times, interleaved; medians")
    parser.add_argument("--gpu", action="store_true", help="Qwen3-0.6B's architecture on CUDA (module docstring)")
    parser.add_argument("--max-tokens", type=int, default=256, help="with --gpu: trainer.sampling.max_tokens")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run (e.g. trainer.lr=...)")
    args = parser.parse_args()
    args.steps = args.steps or (50 if args.gpu else 300)
    model_dir = tempfile.TemporaryDirectory(prefix="bench-grid-model-") if args.gpu else None
    common = [f"trainer.max_steps={args.steps}", *(gpu_overrides(Path(model_dir.name), args) if model_dir else []),
              *args.overrides]
    grid = [f"condition={args.conditions}", f"seed={args.seeds}"]
    first = [f"condition={args.conditions.split(',')[0]}", f"seed={args.seeds.split(',')[0]}"]
    with tempfile.TemporaryDirectory(prefix="bench-grid-") as tmp:
        if not args.gpu:  # fills the warm-up cache, untimed
            child(["train.py", "--multirun", f"seed={args.seeds}", "trainer.max_steps=1", "trainer.evaluate=false",
                   f"hydra.sweep.dir={Path(tmp) / 'warm'}"])
        found, differ, runs = measure(Path(tmp), common, grid, first, args.rounds)
    cells = len(args.conditions.split(",")) * len(args.seeds.split(","))
    print(f"grid: {args.conditions} × seeds {args.seeds} = {cells} runs × {args.steps} steps, {args.rounds} "
          f"round(s) {' '.join(args.overrides)}".rstrip())
    print(f"{'':8} {'wall s':>8} {'peak MiB':>9}   (medians; each round's walls)")
    wall = {k: statistics.median(w for w, _ in v) for k, v in found.items()}
    peak = {k: statistics.median(m for _, m in v) for k, v in found.items()}
    for name, rounds in found.items():
        print(f"{name:8} {wall[name]:8.1f} {peak[name]:9.0f}   {', '.join(f'{w:.1f}' for w, _ in rounds)}")
    ratios = ", ".join(f"{p[0] / b[0]:.2f}" for p, b in zip(found["packed"], found["basic"], strict=True))
    print(f"packed / basic wall: {wall['packed'] / wall['basic']:.2f}× (target ≤ 0.35×; each round: {ratios})")
    print(f"packed / single peak memory: {peak['packed'] / peak['single']:.2f}× (target ≤ 2×)")
    print(f"rows differing between packed and basic runs (timing fields aside): {differ} in {runs} runs")
    one, together = training_scaling(cells)
    print(f"forward + backward of the default policy: 64 rows {one * 1000:.0f} ms, {64 * cells} rows "
          f"{together * 1000:.0f} ms ({together / one:.1f}× for {cells}× the rows)")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
