"""Peak memory and time of the language-model head, plain against chunked (rlvr/backend/lm_head.py), forward + backward.

    .venv/bin/python -m bench.lm_head                        # V = 151,936 (Qwen), H = 256, K = 512 tokens, CPU
    .venv/bin/python -m bench.lm_head --tokens 8192 --hidden 1024 --device cuda

Random weights W [V, H] and final hidden states h [K, H] (both requiring grad, as in full fine-tuning; `--frozen-head`
for LoRA's frozen head), random targets and random upstream gradients; one pass is the loss
Σ g₁·log p(target) (+ Σ g₂·entropy) under softmax(h·Wᵀ / T), then its backward to h and W. Two heads:

* plain: every logit at once — the head's logits [K, V] (in the weight's dtype, as nn.Linear gives them), then
  log_softmax in float32 and a gather; the entropy from the full softmax. Autograd keeps several [K, V] tensors.
* chunked: `token_logprobs`, `--chunk` tokens at a time (default: 2²⁶ float32 logits per chunk, 441 tokens at this V).

Each of the four variants (plain / chunked × log p / log p + entropy) runs in a fresh Python process, so that one's
freed memory cannot hide another's peak. Peak memory is what the pass adds above what the process held before it:
on CPU the kernel's resident-set high-water mark (VmHWM in /proc/self/status), reset to the current RSS just before
the pass by writing 5 to /proc/self/clear_refs — real pages touched, allocator caches and all; on CUDA
torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), minus the memory allocated before the pass. The
inputs exist before the pass and do not count; the weight's gradient and the outputs count in both heads alike.
Time: the best of the measured pass and `--repeats` more (after a warm-up pass on 8 tokens). The ratios
chunked/plain are printed side by side; the two heads' values and gradients are compared on the first
`--check-tokens` tokens (max |Δ| / max(1, max |plain|)).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from rlvr.backend.lm_head import default_chunk_tokens, token_logprobs

GiB = 2**30


def plain(hidden_K_H: Tensor, weight_V_H: Tensor, targets_K: Tensor, temperature: float, with_entropy: bool):
    logits = hidden_K_H @ weight_V_H.T  # the model's lm_head, in the weight's dtype
    logp_K_V = torch.log_softmax(logits.float() / max(temperature, 1e-7), dim=-1)
    logp = logp_K_V.gather(-1, targets_K[:, None]).squeeze(-1)
    return logp, (-(logp_K_V.exp() * logp_K_V).sum(-1) if with_entropy else None)


def chunked(hidden_K_H: Tensor, weight_V_H: Tensor, targets_K: Tensor, temperature: float, with_entropy: bool,
            chunk: int | None = None):
    return token_logprobs(hidden_K_H, weight_V_H, targets_K, temperature, with_entropy=with_entropy,
                          chunk_tokens=chunk)


def inputs(args: argparse.Namespace, tokens: int):
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    hidden = torch.randn(tokens, args.hidden, generator=gen).to(args.device, dtype).requires_grad_(True)
    weight = (torch.randn(args.vocab, args.hidden, generator=gen) / args.hidden**0.5).to(args.device, dtype)
    weight.requires_grad_(not args.frozen_head)
    targets = torch.randint(0, args.vocab, (tokens,), generator=gen).to(args.device)
    upstream = torch.randn(2, tokens, generator=gen).to(args.device)
    return hidden, weight, targets, upstream


def one_pass(head: str, with_entropy: bool, args: argparse.Namespace, hidden: Tensor, weight: Tensor,
             targets: Tensor, upstream: Tensor) -> tuple[Tensor, Tensor | None]:
    hidden.grad = weight.grad = None
    if head == "plain":
        logp, entropy = plain(hidden, weight, targets, args.temperature, with_entropy)
    else:
        logp, entropy = chunked(hidden, weight, targets, args.temperature, with_entropy, args.chunk)
    loss = (upstream[0] * logp).sum() + ((upstream[1] * entropy).sum() if entropy is not None else 0.0)
    loss.backward()
    return logp.detach(), None if entropy is None else entropy.detach()


def status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))  # type: ignore[union-attr]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def child(args: argparse.Namespace) -> None:
    """One variant in this fresh process: prints {"peak_bytes", "seconds"} as JSON."""
    head, with_entropy = args.child, args.entropy
    one_pass(head, with_entropy, args, *inputs(args, 8))  # threads, kernels, allocator: not in the figures
    tensors = inputs(args, args.tokens)
    cuda = args.device.startswith("cuda")
    sync(args.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = status_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    one_pass(head, with_entropy, args, *tensors)
    sync(args.device)
    times = [time.perf_counter() - t0]
    peak = torch.cuda.max_memory_allocated() if cuda else status_kib("VmHWM") * 1024
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        one_pass(head, with_entropy, args, *tensors)
        sync(args.device)
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(json.dumps({"peak_bytes": peak - before, "seconds": best}))


def run_child(args: argparse.Namespace, head: str, with_entropy: bool) -> dict[str, float]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k not in ("child", "entropy", "frozen_head", "check_tokens") and v is not None]
    flags += ["--frozen-head"] * args.frozen_head + ["--entropy"] * with_entropy
    out = subprocess.run([sys.executable, "-m", "bench.lm_head", f"--child={head}", *flags],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def max_differences(args: argparse.Namespace) -> dict[str, float]:
    """max |chunked − plain| / max(1, max |plain|) of log p, entropy and the gradients on the first `--check-tokens`
    tokens, at a chunk that does not divide them."""
    tokens = min(args.tokens, args.check_tokens)
    h, w, t, up = inputs(args, tokens)
    got, want = {}, {}
    for head, into in (("plain", want), ("chunked", got)):
        a = argparse.Namespace(**{**vars(args), "chunk": max(1, tokens // 3 + 1)})
        into["log p"], into["entropy"] = one_pass(head, True, a, h, w, t, up)
        into["∂/∂h"] = h.grad.clone()
        if w.grad is not None:
            into["∂/∂W"] = w.grad.clone()
    return {k: float((got[k].float() - want[k].float()).abs().max() / want[k].float().abs().max().clamp(min=1.0))
            for k in want}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512, help="K, flat token positions")
    parser.add_argument("--chunk", type=int, default=None, help="tokens per chunk (default: 2^26 logits' worth)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--dtype", default="float32", help="of the hidden states and the weight (math is float32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes after the measured one")
    parser.add_argument("--frozen-head", action="store_true", help="the weight needs no gradient (LoRA)")
    parser.add_argument("--check-tokens", type=int, default=128)
    parser.add_argument("--child", choices=("plain", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--entropy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    chunk = args.chunk or default_chunk_tokens(args.vocab)
    threads = torch.get_num_threads() if args.device == "cpu" else args.device
    print(f"V = {args.vocab:,}, H = {args.hidden}, K = {args.tokens:,} tokens, chunk = {chunk} tokens "
          f"({chunk * args.vocab * 4 / 2**20:.0f} MiB of float32 logits), T = {args.temperature}, {args.dtype}, "
          f"{args.device} ({threads} threads), weight {'frozen' if args.frozen_head else 'trained'}; "
          f"forward + backward; every logit would be {args.tokens * args.vocab * 4 / GiB:.2f} GiB in float32")
    print("peak: " + ("torch.cuda.max_memory_allocated() above the memory allocated before the pass"
                      if args.device.startswith("cuda") else
                      "VmHWM above VmRSS before the pass (reset through /proc/self/clear_refs), a fresh process "
                      "per variant"))
    print()
    print(f"{'':18}{'plain':>20}{'chunked':>20}{'chunked / plain':>22}")
    print(f"{'':18}{'time':>9}{'peak':>11}{'time':>9}{'peak':>11}{'time':>11}{'peak':>11}")
    for with_entropy in (False, True):
        p = run_child(args, "plain", with_entropy)
        c = run_child(args, "chunked", with_entropy)
        name = "log p + entropy" if with_entropy else "log p"
        print(f"{name:18}{p['seconds']:8.2f}s{p['peak_bytes'] / GiB:7.2f} GiB{c['seconds']:8.2f}s"
              f"{c['peak_bytes'] / GiB:7.2f} GiB{c['seconds'] / p['seconds']:11.2f}"
              f"{c['peak_bytes'] / p['peak_bytes']:11.3f}", flush=True)
    diffs = max_differences(args)
    print()
    print(f"max |chunked − plain| / max(1, max |plain|) on {min(args.tokens, args.check_tokens)} tokens: "
          + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))


if __name__ == "__main__":
    main()
