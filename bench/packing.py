"""A train step on padded rows against the same step on packed rows (backend.packing), side by side.

    .venv/bin/python -m bench.packing                               # 16 rows of 16-1,024 tokens, CPU
    .venv/bin/python -m bench.packing --rows 64 --hidden 1024 --layers 8 --device cuda --attention flash_attention_2

What it measures
    `LocalBackend.train_step` (rlvr/backend/local.py) on one synthetic step: `--rows` completions whose lengths
    are long-tailed (log-uniform between `--min-tokens` and `--max-tokens`, the longest pinned to `--max-tokens`,
    as RL completions are: most short, a few at the cap), each after a prompt of `--prompt` tokens; random ids,
    advantage ±1 on every token, the engine's log-probabilities −log V, loss −r·A. The policy is the tiny Llama
    of conf/model/tiny.yaml made bigger (`--hidden`, `--layers`, `--heads`), full fine-tuning, attention
    `--attention` (sdpa: what conf/model/pretrained.yaml loads real models with). Two layouts of the same rows:

      padded   `--micro-batch-size` rows a pass, each padded to the step's longest prompt and completion
      packed   rows end to end in passes of at most `--max-tokens-per-micro-batch` tokens (default: the padded
               pass's own size, micro-batch-size × (prompt + max-tokens), so neither layout may hold more tokens
               in a pass than the other)

    Peak memory: what the first step adds above what the process held before it (the model built) — on CPU the
    resident-set high-water mark (VmHWM, reset to the current RSS through /proc/self/clear_refs), on CUDA
    torch.cuda.max_memory_allocated() after reset_peak_memory_stats(); the optimizer's moments (allocated by that
    step, the same in both layouts) included. Time: the median of the `--steps` steps after it (learning rate 0,
    so every step is the same step). Each layout runs in a fresh process so that
    one's freed memory cannot hide the other's peak. The first step's loss and gradient norm are printed for both:
    they agree to float summation order (tests/backend/test_packing.py holds them to 1e-6).

What the figures mean
    Padding costs every layer's projections and MLP on `rows × longest` positions instead of the real tokens,
    so the packed step does a fraction of the padded step's work in those. Attention differs by kernel: under
    eager and sdpa attention transformers turns the packed rows' restarting position ids into a block-diagonal
    mask over the whole pass, so a pass of L tokens still computes L × L scores (fewer than the padded pass's
    rows × longest², but not the Σ length² a variable-length kernel computes); flash_attention_2 on a GPU skips
    the blocks outside the diagonal. On the shared 2-core CPU the times move with the load; the ratios measured in
    one run are the figure to read.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.model.tiny import TinyLlama
from rlvr.types import Rollouts, TrainBatch

ALPHABET = "0123456789+=abcdefghijklmnopqrstuvwxyz"


def lengths(args: argparse.Namespace) -> list[int]:
    """Log-uniform completion lengths in [min_tokens, max_tokens], the first row at max_tokens."""
    gen = torch.Generator().manual_seed(args.seed)
    lo, hi = math.log(args.min_tokens), math.log(args.max_tokens)
    drawn = (lo + (hi - lo) * torch.rand(args.rows, generator=gen)).exp().round().long().tolist()
    return [args.max_tokens, *drawn[1:]]


def batch(args: argparse.Namespace, vocab: int) -> TrainBatch:
    gen = torch.Generator().manual_seed(args.seed)
    n = lengths(args)
    mask = torch.arange(args.max_tokens)[None, :] < torch.tensor(n)[:, None]
    tokens = torch.randint(3, vocab, (args.rows, args.max_tokens), generator=gen).masked_fill(~mask, 0)
    prompts = [torch.randint(3, vocab, (args.prompt,), generator=gen).tolist() for _ in range(args.rows)]
    adv = torch.where(torch.rand(args.rows, 1, generator=gen) < 0.5, -1.0, 1.0) * mask
    ro = Rollouts(prompts, 1, tokens, -math.log(vocab) * mask.float(), mask, torch.ones(args.rows, dtype=torch.bool),
                  1.0)
    return TrainBatch(ro, adv)


def peak_reset(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    return status_kib("VmRSS") * 1024


def peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return status_kib("VmHWM") * 1024


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model, tok = TinyLlama(ALPHABET, args.hidden, 4 * args.hidden, args.layers, args.heads, args.prompt +
                           args.max_tokens, args.dtype, None).load(args.seed)
    model.config._attn_implementation = args.attention
    budget = args.max_tokens_per_micro_batch or args.micro_batch_size * (args.prompt + args.max_tokens)
    backend = LocalBackend(model, None, 0, tok.pad_token_id, args.device, (0.9, 0.95), 1e-8, 0.0, 0.0,
                           args.micro_batch_size, False, args.layout == "packed", budget)
    b, loss = batch(args, len(tok)), PolicyLoss(0.0, 0.0, 0.0)
    before = peak_reset(args.device)
    first = backend.train_step(b, loss, lr=0.0)  # lr 0: every step is the same step
    top, times = peak(args.device) - before, []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        backend.train_step(b, loss, lr=0.0)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    rows = backend.trainee.step_rows(b)
    passes = backend.trainee.micro_batches(rows, range(len(rows.prompts)))
    print(json.dumps({"step_s": statistics.median(times), "peak_bytes": top,
                      "loss": first["loss"], "grad_norm": first["grad_norm"], "passes": len(passes),
                      "real_tokens": sum(rows.sizes)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=0, help="0: micro-batch-size × padded row")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--attention", default="sdpa", help="eager | sdpa | flash_attention_2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=["padded", "packed"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.layout:
        return child(args)
    n = lengths(args)
    print(f"{args.rows} rows, completions {min(n)}-{max(n)} tokens (mean {statistics.mean(n):.0f}) after "
          f"{args.prompt}-token prompts; hidden {args.hidden}, {args.layers} layers, {args.attention}, {args.device}, "
          f"{args.threads} threads; median of {args.steps} steps, each layout in a fresh process")
    results = {}
    for layout in ("padded", "packed"):
        proc = subprocess.run([sys.executable, "-m", "bench.packing", *sys.argv[1:], "--layout", layout],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            sys.exit(f"{layout}: {proc.stderr[-2000:]}")
        results[layout] = json.loads(proc.stdout.strip().splitlines()[-1])
    padded, packed = results["padded"], results["packed"]
    padded_tokens = args.rows * (args.prompt + args.max_tokens)
    print(f"{'':10}{'passes':>8}{'tokens':>10}{'step s':>10}{'peak MiB':>10}{'loss':>12}{'grad norm':>12}")
    for layout, r in results.items():
        tokens = padded_tokens if layout == "padded" else r["real_tokens"]
        print(f"{layout:10}{r['passes']:>8}{tokens:>10}{r['step_s']:>10.3f}{r['peak_bytes'] / 2**20:>10.1f}"
              f"{r['loss']:>12.6f}{r['grad_norm']:>12.6f}")
    print(f"packed/padded: time {packed['step_s'] / padded['step_s']:.2f}x, peak memory "
          f"{packed['peak_bytes'] / max(padded['peak_bytes'], 1):.2f}x, "
          f"tokens {packed['real_tokens'] / padded_tokens:.2f}x")


if __name__ == "__main__":
    main()
