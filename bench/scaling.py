"""backend=fsdp's train step on 1 process against 2 (or more), side by side: step time, and memory per rank.

    .venv/bin/python -m bench.scaling                                   # 1 and 2 processes, full FT and LoRA
    .venv/bin/python -m bench.scaling --world-sizes 1,2,4,8 --hidden 2048 --layers 16 --rows 64 --tokens 512

What it measures
    `FSDPBackend.train_step` (rlvr/backend/fsdp.py) on one synthetic step: `--rows` completions of `--tokens`
    tokens (lengths uniform in [tokens/2, tokens], at least one full), each after a prompt of up to `--prompt`
    tokens, random ids, advantage ±1 on every token (so every row trains), old log-probabilities −log V, loss
    −r·A (PolicyLoss(0, 0, 0)), AdamW with conf/backend/local.yaml's and conf/backend/fsdp.yaml's defaults
    (no clipping; the global gradient norm is computed anyway), one micro-batch per rank unless
    `--micro-batch-size`. The policy is the tiny Llama builder of conf/model/tiny.yaml (rlvr/model/tiny.py)
    made bigger with `--hidden`, `--intermediate`, `--layers`, `--heads`, once with full fine-tuning
    (model.lora null) and once with LoRA (rank `--lora-rank`, the seven projections of conf/model/tiny.yaml).
    The batch and the initial weights are functions of `--seed` alone, so every world size trains the same
    rows with the same advantages from the same weights; the first step's loss and gradient norm are printed
    per world size as the check (they agree to float summation order, the backend's contract).

    Time: the median over `--steps` steps after `--warmup` uncounted ones (the first allocates the optimizer
    state) of each step's slowest rank, from a barrier before `train_step` to its return (after a CUDA
    synchronize on GPUs); the speed-up is 1 process's median over W processes'.

    Memory per rank: the bytes this rank holds of parameters (every parameter, frozen ones included),
    gradients (read at the optimizer step, just before `zero_grad` frees them) and optimizer state (AdamW's
    moments and step counters), each the sum of local shards (`DTensor.to_local()`: FSDP2's sharded
    parameters, their gradients and the moments are DTensors whose `numel()` is the global size). Beside it,
    the process's RSS: after imports (torch, transformers: the floor every rank pays), the peak over the
    whole process (model construction included: every rank builds the whole model before `fully_shard`), and
    the peak over the train steps alone (VmHWM reset through /proc/self/clear_refs after construction). On
    GPUs, `torch.cuda.max_memory_allocated()` over the whole process and over the train steps alone.

How
    The parent re-invokes this module under torchrun (`python -m torch.distributed.run --standalone
    --nproc-per-node W -m bench.scaling --worker …`), one fresh launch per world size and mode, so each
    process's peak memory is its configuration's alone; each rank writes a JSON file the parent reads. A world
    of 1 is torchrun with one process: FSDPBackend's world of one (the same code, no communication). Process
    groups: gloo on CPUs, NCCL when CUDA is available (one GPU per rank, `--device auto`). Every rank runs
    `--threads` torch threads (1 by default).

What the figures mean
    On a 2-core CPU shared with other work (where this was written) the bench mainly shows that the path
    works and that the sharded state halves: 2 processes on 2 cores do half the rows each but also all-gather
    every layer's weights in the forward and again in the backward, reduce-scatter the gradients over gloo,
    and contend with whatever else runs, so the speed-up is far from 2× and moves with the load (the table
    prints the 1-minute load average at each launch). The state bytes are exact and do not depend on load:
    parameters, gradients and optimizer state are divided by W (up to a row of padding per tensor). The RSS
    falls by less than the state: each rank also holds torch itself, activations for its rows, one gathered
    layer at a time, and allocator slack. On a GPU machine (NCCL, one GPU per rank) the step time is the real
    scaling of data-parallel FSDP2 at that model and batch size; give it a model and batch big enough to keep
    a GPU busy (e.g. --hidden 2048 --layers 16 --rows 64 --tokens 512 --dtype bfloat16), or the figures
    measure launch and communication latency. Every rank builds the whole model in CPU memory; FSDPBackend
    shards it there and `fully_shard` moves only each unit's shard to the device (rlvr/backend/fsdp.py), so
    the CUDA peaks fall with W; sampling would gather the whole model, which this bench does not do.

    The time and state figures are the slowest and the largest rank's (rank 0 holds the larger shard when
    a dimension does not divide). `local_train_rows` in FSDPBackend's metrics is the step's row count on
    every rank; the table's "rows per rank" is this rank's share of it (`World.share`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn
    from torch.optim import Optimizer

    from rlvr.types import TrainBatch

ROOT = Path(__file__).resolve().parents[1]
MODES = ("full", "lora")
MODE_NAMES = {"full": "full fine-tuning (model.lora null)", "lora": "LoRA"}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MB = 2**20
MEMORY = ("rss_imports", "rss_built", "rss_peak", "rss_peak_steps", "cuda_peak", "cuda_peak_steps")
"""A rank's memory figures (bytes; None where not measured); a launch reports the largest rank's."""


# ------------------------------------------------------------------------------------------ counting


def tensor_bytes(t: Tensor | None) -> int:
    """The bytes this process holds of `t`: its local shard for a DTensor (whose numel() is the global size)."""
    if t is None:
        return 0
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def parameter_bytes(model: nn.Module) -> int:
    """Every parameter, trainable or frozen; tied parameters once (`parameters()` yields each once)."""
    return sum(tensor_bytes(p) for p in model.parameters())


def gradient_bytes(params: list[Tensor]) -> int:
    return sum(tensor_bytes(p.grad) for p in params)


def optimizer_bytes(optimizer: Optimizer) -> int:
    """AdamW's per-parameter state: exp_avg, exp_avg_sq and the step counter."""
    return sum(tensor_bytes(v) for state in optimizer.state.values() for v in state.values() if hasattr(v, "numel"))


def rss_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak since the start or the last reset) of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def reset_peak_rss() -> bool:
    """Set VmHWM to the current RSS (Linux ≥ 4.0); False where /proc does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- batch


def synthetic_batch(rows: int, tokens: int, prompt: int, vocab: int, pad_id: int, seed: int) -> TrainBatch:
    """One step's rollouts and advantages, a function of the arguments alone (the same on every rank and world
    size). Ids are drawn from the non-special tokens (3 … vocab−1); group size 1."""
    import torch

    from rlvr.types import Rollouts, TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(max(1, prompt // 2), prompt + 1, (rows,), generator=g)
    prompt_ids = [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in prompt_lengths]
    lengths = torch.randint(max(1, tokens // 2), tokens + 1, (rows,), generator=g)
    lengths[0] = tokens
    mask = torch.arange(tokens)[None, :] < lengths[:, None]
    ids = torch.randint(3, vocab, (rows, tokens), generator=g).masked_fill(~mask, pad_id)
    logprobs = torch.full((rows, tokens), -math.log(vocab)) * mask
    sign = torch.randint(0, 2, (rows, 1), generator=g).float() * 2 - 1
    rollouts = Rollouts(prompt_ids_P=prompt_ids, group_size=1, tokens_PG_T=ids, logprobs_PG_T=logprobs,
                        mask_PG_T=mask, finished_PG=lengths < tokens, temperature=1.0)
    return TrainBatch(rollouts, sign * mask)


# --------------------------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    """One rank of one measurement: build, step, write `<out>/rank<r>.json`."""
    import torch

    torch.set_num_threads(args.threads)
    import torch.distributed as dist

    from rlvr import distributed
    from rlvr.algorithm.loss import PolicyLoss
    from rlvr.backend.fsdp import FSDPBackend
    from rlvr.backend.local import resolve_device
    from rlvr.distributed import World
    from rlvr.model.tiny import TinyLlama
    from rlvr.types import LoraSpec

    rss_imports = rss_bytes("VmRSS")
    world = distributed.World.from_env()
    cuda = resolve_device(args.device).type == "cuda"
    lora = LoraSpec(args.lora_rank, 2 * args.lora_rank, 0.0, LORA_TARGETS) if args.mode == "lora" else None
    preset = TinyLlama("0123456789+=", args.hidden, args.intermediate or 4 * args.hidden, args.layers, args.heads,
                       args.prompt + args.tokens, args.dtype, lora)
    model, tokenizer = preset.load(args.seed)
    backend = FSDPBackend(model, lora, lora_seed=args.seed, pad_id=tokenizer.pad_token_id, device=args.device,
                          betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip_norm=0.0,
                          micro_batch_size=args.micro_batch_size, gradient_checkpointing=False,
                          reshard_after_forward=True, timeout_s=args.timeout, world=World.from_env())
    batch = synthetic_batch(args.rows, args.tokens, args.prompt, len(tokenizer), tokenizer.pad_token_id, args.seed)
    loss = PolicyLoss(0.0, 0.0, 0.0)

    grads: list[int] = []
    backend.trainee.optimizer.register_step_pre_hook(lambda *_: grads.append(gradient_bytes(backend.trainee.params)))
    peak_build, rss_built = rss_bytes("VmHWM"), rss_bytes("VmRSS")
    rss_reset = reset_peak_rss()
    if cuda:
        cuda_build = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    walls, cpus, stats = [], [], []
    for _ in range(args.warmup + args.steps):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        stats.append(backend.train_step(batch, loss, lr=1e-4))
        if cuda:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)

    peak_steps = rss_bytes("VmHWM")
    result: dict[str, Any] = {
        "rank": world.rank, "world": world.size, "mode": args.mode, "device": str(backend.device),
        "process_group": dist.get_backend(),
        "parameters": sum(p.numel() for p in backend.policy.parameters()),  # DTensor numel: global sizes
        "trainable": backend.trainable_parameters,
        "step_wall_s": walls[args.warmup:], "step_cpu_s": cpus[args.warmup:],
        # local_train_rows is the step's row count on every rank; this rank trains its share of them
        "rows": len(world.share(int(stats[0]["local_train_rows"]))),
        "loss": [s["loss"] for s in stats], "grad_norm": [s["grad_norm"] for s in stats],
        "state_bytes": {"parameters": parameter_bytes(backend.policy), "gradients": max(grads, default=0),
                        "optimizer": optimizer_bytes(backend.trainee.optimizer)},
        "rss_imports": rss_imports,
        "rss_built": rss_built,
        "rss_peak": max(peak_build, peak_steps),
        "rss_peak_steps": peak_steps if rss_reset else None,
    }
    if cuda:
        result["cuda_peak"] = max(cuda_build, torch.cuda.max_memory_allocated())
        result["cuda_peak_steps"] = torch.cuda.max_memory_allocated()
    Path(args.out, f"rank{world.rank}.json").write_text(json.dumps(result))
    distributed.close()


# --------------------------------------------------------------------------------------------- parent


def launch(args: argparse.Namespace, argv: list[str], mode: str, world: int, folder: Path) -> dict[str, Any]:
    """One torchrun launch of `world` processes; the ranks' results, merged."""
    out = folder / f"{mode}-{world}"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "-m", "bench.scaling", *argv, "--worker", f"--mode={mode}", f"--out={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.launch_timeout)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
        raise SystemExit(f"{mode}, {world} process(es): torchrun exited with {done.returncode}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return merge(ranks, load, time.perf_counter() - t0)


def merge(ranks: list[dict[str, Any]], load: float, seconds: float) -> dict[str, Any]:
    """A launch's figures: per step the slowest rank's wall time; memory the largest rank's."""
    first = ranks[0]
    per_step = [max(r["step_wall_s"][i] for r in ranks) for i in range(len(first["step_wall_s"]))]
    largest = {k: max(r["state_bytes"][k] for r in ranks) for k in first["state_bytes"]}

    def top(key: str) -> int | None:
        values = [r.get(key) for r in ranks]
        return None if any(v is None for v in values) else max(values)

    return {
        "world": first["world"], "device": first["device"], "process_group": first["process_group"],
        "parameters": first["parameters"], "trainable": first["trainable"],
        "step_wall_s": statistics.median(per_step), "step_walls": per_step,
        "step_cpu_s": statistics.median(max(r["step_cpu_s"][i] for r in ranks) for i in range(len(per_step))),
        "rows_per_rank": max(r["rows"] for r in ranks),
        "loss": first["loss"], "grad_norm": first["grad_norm"],
        "state_bytes": {**largest, "total": max(sum(r["state_bytes"].values()) for r in ranks)},
        **{k: top(k) for k in MEMORY},
        "load": load, "launch_s": seconds,
    }


def fell(ratio: float) -> str:
    return "fell" if ratio < 1.0 else "did NOT fall"


def print_mode(mode: str, results: list[dict[str, Any]]) -> None:
    one = results[0]
    print(f"\n{MODE_NAMES[mode]}: {one['trainable'] / 1e6:.2f} M trainable of {one['parameters'] / 1e6:.2f} M "
          "parameters")
    label = 40
    walls = [" ".join(f"{s:.2f}" for s in r["step_walls"]) for r in results]
    width = max(15, 2 + max(len(w) for w in walls))

    def row(name: str, cells: list[str]) -> None:
        print(f"{name:<{label}}" + "".join(f"{c:>{width}}" for c in cells))

    row("", [f"{r['world']} process" + ("es" if r["world"] > 1 else "") for r in results])

    def mb(value: int | None) -> str:
        return "-" if value is None else f"{value / MB:.1f}"

    def vs(key: str, sub: str | None = None) -> list[str]:
        get = (lambda r: r[key][sub]) if sub else (lambda r: r[key])
        base = get(one)
        return ["-" if get(r) is None or not base else f"{get(r) / base:.2f}×" for r in results]

    row("median train_step wall, slowest rank (s)", [f"{r['step_wall_s']:.3f}" for r in results])
    row("  each measured step (s)", walls)
    row("  speed-up vs 1st column", [f"{one['step_wall_s'] / r['step_wall_s']:.2f}×" for r in results])
    row("  median CPU time, slowest rank (s)", [f"{r['step_cpu_s']:.3f}" for r in results])
    row("rows per rank", [str(int(r["rows_per_rank"])) for r in results])
    for key in ("parameters", "gradients", "optimizer", "total"):
        row(f"state per rank, {key} (MB)", [mb(r["state_bytes"][key]) for r in results])
    row("  total vs 1st column", vs("state_bytes", "total"))
    row("RSS after imports (MB)", [mb(r["rss_imports"]) for r in results])
    row("RSS after building the backend (MB)", [mb(r["rss_built"]) for r in results])
    row("peak RSS, whole process (MB)", [mb(r["rss_peak"]) for r in results])
    row("  vs 1st column", vs("rss_peak"))
    row("peak RSS, train steps only (MB)", [mb(r["rss_peak_steps"]) for r in results])
    row("  vs 1st column", vs("rss_peak_steps"))
    if one["cuda_peak"] is not None:
        row("cuda max allocated, whole process (MB)", [mb(r["cuda_peak"]) for r in results])
        row("  vs 1st column", vs("cuda_peak"))
        row("cuda max allocated, train steps (MB)", [mb(r["cuda_peak_steps"]) for r in results])
        row("  vs 1st column", vs("cuda_peak_steps"))
    row("1st step loss", [f"{r['loss'][0]:.6f}" for r in results])
    row("1st step grad norm", [f"{r['grad_norm'][0]:.6f}" for r in results])
    row("last step loss (after the updates)", [f"{r['loss'][-1]:.6f}" for r in results])
    row("load average at launch", [f"{r['load']:.2f}" for r in results])
    row("launch wall, with imports (s)", [f"{r['launch_s']:.1f}" for r in results])

    for r in results[1:]:
        w = f"{r['world']} vs {one['world']}"
        grad = abs(r["grad_norm"][0] - one["grad_norm"][0]) / max(abs(one["grad_norm"][0]), 1e-30)
        agree = "agrees" if grad < 1e-4 else "DIFFERS"
        state = r["state_bytes"]["total"] / one["state_bytes"]["total"]
        line = f"{mode}, {w} processes: step time {r['step_wall_s'] / one['step_wall_s']:.2f}×; " \
               f"state per rank {state:.2f}× ({fell(state)})"
        for key, name in (("rss_peak_steps", "peak RSS in the steps"), ("cuda_peak_steps", "cuda peak in the steps")):
            if r[key] is not None and one[key]:
                line += f", {name} {r[key] / one[key]:.2f}× ({fell(r[key] / one[key])})"
        print(f"{line}; 1st grad norm {agree} (relative difference {grad:.1e})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-sizes", default="1,2", help="comma-separated process counts (the first is the baseline)")
    p.add_argument("--modes", default="full,lora", help="comma-separated: full (model.lora null), lora")
    p.add_argument("--hidden", type=int, default=512, help="hidden size of the tiny Llama")
    p.add_argument("--intermediate", type=int, default=0, help="MLP size (0: 4 × hidden)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers (each its own FSDP unit)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (hidden / heads = head dim)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (alpha = 2 × rank) of the lora mode")
    p.add_argument("--rows", type=int, default=16, help="completions in the global batch (all with signal)")
    p.add_argument("--tokens", type=int, default=32, help="longest completion (lengths uniform in [tokens/2, tokens])")
    p.add_argument("--prompt", type=int, default=8, help="longest prompt")
    p.add_argument("--steps", type=int, default=3, help="measured train steps")
    p.add_argument("--warmup", type=int, default=1, help="uncounted train steps first")
    p.add_argument("--micro-batch-size", type=int, default=0, help="backend.micro_batch_size (0: one per rank)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--device", default="auto", help="backend.device: auto (cuda if available), cpu, cuda")
    p.add_argument("--seed", type=int, default=0, help="weights, LoRA and batch")
    p.add_argument("--timeout", type=float, default=300.0, help="backend.timeout_s: a collective's bound")
    p.add_argument("--launch-timeout", type=float, default=1200.0, help="seconds one torchrun launch may take")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    args.modes = args.modes.split(",")
    if any(m not in MODES for m in args.modes):
        p.error(f"--modes={','.join(args.modes)}: expected some of {','.join(MODES)}")
    if min(args.world_sizes) < 1 or args.steps < 1 or args.warmup < 0 or args.rows < 1 or args.tokens < 1:
        p.error("--world-sizes, --steps, --rows and --tokens must be >= 1, --warmup >= 0")
    if args.hidden % args.heads:
        p.error(f"--hidden={args.hidden} must be a multiple of --heads={args.heads}")
    return args


def main() -> None:
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    import torch

    if args.device != "cpu" and torch.cuda.is_available() and max(args.world_sizes) > torch.cuda.device_count():
        raise SystemExit(f"--world-sizes {max(args.world_sizes)} > {torch.cuda.device_count()} GPUs (one per rank)")
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            for world in args.world_sizes:
                r = launch(args, argv, mode, world, Path(tmp))
                results.setdefault(mode, []).append(r)
                print(f"{mode}, {world} process(es): median step {r['step_wall_s']:.3f} s "
                      f"(load {r['load']:.2f}, launch {r['launch_s']:.0f} s)", flush=True)
    one = next(iter(results.values()))[0]
    print(f"\n{os.cpu_count()} cores, torch {torch.__version__}, device {one['device']}, process group "
          f"{one['process_group']}, {args.threads} torch thread(s) per process; tiny Llama hidden {args.hidden}, "
          f"MLP {args.intermediate or 4 * args.hidden}, {args.layers} layers, {args.heads} heads, {args.dtype}; "
          f"global batch {args.rows} rows × ≤{args.prompt} prompt + ≤{args.tokens} completion tokens; "
          f"{args.warmup} uncounted + {args.steps} measured steps")
    for mode, rs in results.items():
        print_mode(mode, rs)


if __name__ == "__main__":
    main()
