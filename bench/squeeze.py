"""LoRA-Squeeze analysis time (rlvr/squeeze.py): QR + r×r SVD against the naive full-product SVD.

    .venv/bin/python -m bench.squeeze                 # 200 layers of 4096 × 4096 at rank 128, CPU
    .venv/bin/python -m bench.squeeze --naive-layers 1 --threads 1

Each layer gets random lora_A (r × d) and lora_B (d × r), N(0, 1/d) and N(0, 1) (seeded; generated outside
the timed region). Timed per layer:

* squeeze: `singular_values` (R of the QRs of lora_Aᵀ and lora_B, singular values of the r × r core) +
  V(k) at the default target ranks, as `analyze_layers` does; summed over all layers.
* naive: form ΔW = B·A (d × d) and take its singular values (`torch.linalg.svdvals`, cheaper than a full
  SVD); timed on `--naive-layers` layers and extrapolated linearly to all of them.

On the naive layers the two methods' top-r singular values are compared (relative error), so the speed-up
is between methods that agree.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlvr.squeeze import default_target_ranks, retained_variance, singular_values


def random_layer(d: int, r: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(r, d, generator=g) / d**0.5, torch.randn(d, r, generator=g)


def squeeze_layer(lora_A: torch.Tensor, lora_B: torch.Tensor, ranks: list[int]) -> torch.Tensor:
    S = singular_values(lora_A, lora_B)
    [retained_variance(S, k) for k in ranks]
    return S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--naive-layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    d, r, ranks = args.dim, args.rank, default_target_ranks(args.rank)
    print(f"{args.layers} layers of {d} × {d}, LoRA rank {r}, float32, CPU, {torch.get_num_threads()} threads")

    squeeze_layer(*random_layer(d, r, -1), ranks)  # warm-up: LAPACK workspace, thread pool
    squeeze_s, wall = 0.0, time.perf_counter()
    for i in range(args.layers):
        lora_A, lora_B = random_layer(d, r, i)
        start = time.perf_counter()
        squeeze_layer(lora_A, lora_B, ranks)
        squeeze_s += time.perf_counter() - start
    wall = time.perf_counter() - wall
    print(f"squeeze: {squeeze_s:.2f} s for {args.layers} layers ({1e3 * squeeze_s / args.layers:.1f} ms/layer; "
          f"{wall:.1f} s wall with generating the matrices)")

    naive_s, worst = 0.0, 0.0
    for i in range(args.naive_layers):
        lora_A, lora_B = random_layer(d, r, i)
        start = time.perf_counter()
        full = torch.linalg.svdvals(lora_B @ lora_A)
        naive_s += time.perf_counter() - start
        ours = squeeze_layer(lora_A, lora_B, ranks)
        worst = max(worst, float(((ours - full[:r]).abs() / full[:r]).max()))
    per_layer = naive_s / args.naive_layers
    naive_total = per_layer * args.layers
    print(f"naive:   {per_layer:.2f} s/layer (B·A then svdvals, {args.naive_layers} layers) → "
          f"{naive_total:.0f} s extrapolated to {args.layers} layers")
    print(f"ratio:   naive / squeeze = {naive_total / squeeze_s:.0f}×; top-{r} singular values agree to "
          f"{worst:.1e} (max relative error)")


if __name__ == "__main__":
    main()
