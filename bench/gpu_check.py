"""What to run first on a machine with a GPU: a few RL steps of a real-architecture model, in one table.

    .venv/bin/python -m bench.gpu_check                 # CUDA: runs (≤ 10 min); no CUDA: prints the plan, exits 0
    .venv/bin/python -m bench.gpu_check --device cpu --layers 2 --hidden 128 --steps 2   # the same path on a CPU

What it runs
    A model folder written offline: Qwen3-0.6B's architecture (transformers' Qwen3Config: vocabulary 151,936,
    hidden 1,024, 28 layers, 16 query / 8 key-value heads of 128, tied embeddings; `--layers`/`--hidden` shrink it)
    with random weights in bfloat16 (float32 on a CPU), and a word-level tokenizer of the same 151,936 entries (the
    characters of the built-in arithmetic task, then fillers), so nothing is downloaded. Then, as a user would,
    `python train.py` on it (the command is printed): trainer=gpu (its correction=token_tis, the sync check on
    every on-policy step), engine=vllm in this process, backend=local with full fine-tuning,
    backend.packing=true, the arithmetic prompts, `--steps` steps of `--batch` prompts × `--group` completions of
    up to `--max-tokens` tokens, no warm-up, no evaluation, one checkpoint at the end. A random model answers
    nothing, so the reward is the parity of a completion's code points (`parity`): half the completions score 1,
    every group trains.

What it prints (from the run's metrics.jsonl, the first step left out: it compiles and allocates)
    sampling tokens/s     completion tokens / sample_time_s (the weight sync and its check included)
    training tokens/s     prompt + completion tokens / train_time_s
    MFU                   6 · parameters · training tokens/s / the GPU's dense bf16 peak (a table of known GPUs;
                          blank for others), the training pass's share of the hardware
    sync s                engine/sync_s: seconds per weight sync into vLLM (in memory: engine/sync_bytes_written 0)
    mismatch/kl           the k3 estimate of KL(engine ‖ trainer) over the sampled tokens (bf16 vLLM against the
                          trainer: above 0, below 1e-2 on a healthy setup)
    GPU peak MB           gpu_max_allocated_mb: the process's peak of torch allocations, vLLM's weights and KV
                          cache included
Each figure is the median over the steps after the first. The run must finish within `--timeout` seconds
(540 by default, so that the check with its start-up fits in ten minutes); its folder is kept (`--out`), the
random model's is deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALPHABET = "0123456789+-*= "
QWEN3_0_6B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
              "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0}
DENSE_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
                     "L4": 121.0, "A10G": 70.0, "B200": 2250.0, "GH200": 989.0, "RTX 4090": 165.0}
"""Dense (not sparse) bfloat16 tensor-core peaks from the vendors' data sheets, TFLOP/s."""


def parity(completion: str, reference: str) -> float:
    """The check's reward: 1.0 when the completion's code points sum to an even number (half of random text)."""
    return float(sum(map(ord, completion)) % 2 == 0)


def write_model(folder: Path, layers: int, hidden: int | None, dtype: str) -> int:
    """The random-weight model and its tokenizer, saved as `from_pretrained` and vLLM read them; its parameters."""
    import torch
    import transformers

    from rlvr.model.tiny import EOS, PAD, UNK, build_char_tokenizer

    shape = {"num_hidden_layers": layers}
    if hidden:
        shape |= {"hidden_size": hidden, "intermediate_size": 3 * hidden, "num_attention_heads": max(1, hidden // 64),
                  "num_key_value_heads": max(1, hidden // 128), "head_dim": 64}
    config = transformers.Qwen3Config(**(QWEN3_0_6B | shape), pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    chars = build_char_tokenizer(ALPHABET)
    vocab = chars.get_vocab()
    fillers = [f"<t{i}>" for i in range(config.vocab_size - len(vocab))]
    import tokenizers

    words = {w: i for i, w in enumerate(sorted(vocab, key=vocab.get) + fillers)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=words, unk_token=UNK))
    tok.pre_tokenizer = chars.backend_tokenizer.pre_tokenizer
    tok.decoder = chars.backend_tokenizer.decoder
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                         padding_side="left").save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def command(args: argparse.Namespace, model: Path, out: Path) -> list[str]:
    cuda = args.device == "cuda"
    return [
        sys.executable, str(REPO / "train.py"), "model=pretrained", f"model.name_or_path={model}",
        f"model.dtype={'bfloat16' if cuda else 'float32'}", "model.lora=null",
        f"model.attn_implementation={args.attention}",
        "trainer=gpu", "engine=vllm", "backend=local", f"backend.device={args.device}", "backend.packing=true",
        f"backend.max_tokens_per_micro_batch={args.packed_tokens}", f"backend.gradient_checkpointing={cuda}",
        "data=arithmetic", "reward=function", "reward.function=bench.gpu_check.parity",
        f"trainer.max_steps={args.steps}",
        f"trainer.batch_size={args.batch}", f"trainer.group_size={args.group}",
        f"trainer.sampling.max_tokens={args.max_tokens}", "trainer.lr=1e-6", "trainer.evaluate=false",
        "trainer.warmup.steps=0", "trainer.save_every=0", "trainer.log_every=1", "trainer.max_skipped_steps=0",
        f"engine.gpu_memory_utilization={args.gpu_memory_utilization}", "resume=never", f"hydra.run.dir={out}",
    ]


def summary(rows: list[dict], parameters: int, gpu: str) -> dict[str, float | None]:
    later = rows[1:] or rows

    def median(f) -> float:
        return statistics.median(f(r) for r in later)

    train_tps = median(lambda r: r["tokens_per_step"] / max(r["train_time_s"], 1e-9))
    peak = next((v for k, v in DENSE_BF16_TFLOPS.items() if k in gpu), None)
    return {
        "sampling tokens/s": median(lambda r: r["rl/completion_tokens"] / max(r["sample_time_s"], 1e-9)),
        "training tokens/s": train_tps,
        "MFU": 6 * parameters * train_tps / (peak * 1e12) if peak else None,
        "sync s": median(lambda r: r.get("engine/sync_s", float("nan"))),
        "sync bytes written": median(lambda r: r.get("engine/sync_bytes_written", float("nan"))),
        "mismatch/kl": median(lambda r: r.get("mismatch/kl", float("nan"))),
        "GPU peak MB": max((r.get("gpu_max_allocated_mb", 0.0) for r in rows), default=0.0) or None,
    }


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown GPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when there is one")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=None, help="shrink the model (default: Qwen3-0.6B's 1,024)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--packed-tokens", type=int, default=16384, help="backend.max_tokens_per_micro_batch")
    parser.add_argument("--attention", default="sdpa", help="model.attn_implementation (flash_attention_2 if built)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--out", type=Path, default=None, help="the run's folder (default: a temporary one, kept)")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    args.device = args.device or ("cuda" if cuda else "cpu")
    root = Path(tempfile.mkdtemp(prefix="rlvr-gpu-check-"))
    out = args.out or root / "run"
    if args.device == "cuda" and not cuda:
        print("bench.gpu_check: --device cuda, and torch sees no CUDA device")
        return 1
    if args.device == "cpu" and not any(a.startswith("--device") for a in sys.argv[1:]):
        print("bench.gpu_check: no CUDA device here, so nothing runs. On a machine with one it would build a "
              f"Qwen3-0.6B-architecture model with random bf16 weights in {root / 'model'} and run, within "
              f"{args.timeout:.0f} s:\n")
        args.device = "cuda"
        print("  python train.py " + " ".join(command(args, root / "model", out)[2:]))
        print("\nthen print sampling and training tokens/s, MFU, seconds per weight sync, mismatch/kl and the GPU "
              "peak in one table. `--device cpu` runs the same path on this CPU (shrink it: --layers 2 --hidden 128).")
        shutil.rmtree(root, ignore_errors=True)
        return 0
    parameters = write_model(root / "model", args.layers, args.hidden, "bfloat16" if args.device == "cuda" else
                             "float32")
    cmd = command(args, root / "model", out)
    print("$ python train.py " + " ".join(cmd[2:]), flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        print(f"bench.gpu_check: the run passed --timeout {args.timeout:.0f} s; its folder: {out}")
        return 1
    finally:
        shutil.rmtree(root / "model", ignore_errors=True)  # the random model (1.2 GB at full size); the run stays
    if proc.returncode:
        print(proc.stdout[-3000:] + proc.stderr[-6000:])
        print(f"bench.gpu_check: the run failed (exit {proc.returncode}); its folder: {out}")
        return 1
    metrics = sorted(out.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in metrics[0].read_text().splitlines() if line.strip()] if metrics else []
    rows = [r for r in rows if not r.get("skipped")]
    if not rows:
        print(f"bench.gpu_check: the run trained no step; its folder: {out}")
        return 1
    device = gpu_name() if args.device == "cuda" else "CPU"
    print(f"\n{device}, {parameters / 1e6:.0f} M parameters, {len(rows)} steps of {args.batch} × {args.group} "
          f"completions ≤ {args.max_tokens} tokens (medians after the first step); run folder {out}")
    for name, value in summary(rows, parameters, device).items():
        shown = "—" if value is None else f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
        print(f"  {name:22}{shown:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
