"""Peak memory of a long-prompt greedy evaluation through `engine=pytorch`: all rows in one chunk (the engine before
its memory budget, bounded by `max_batch_rows` 1,024 alone) against the chunks the budget makes, side by side.

    .venv/bin/python -m bench.eval_memory                               # 1,000 rows of 600 tokens, 8 new, greedy
    .venv/bin/python -m bench.eval_memory --rows 200 --budgets 64 256 4096   # other budgets too (a sweep)

The policy is `model=tiny` (eager attention, float32, 4 heads) with `max_positions` raised to 1,024 so that the
prompts fit: what an evaluation of `env=textarena` sends it, where the character tokenizer turns the game's English
opening into ~500–700 tokens. Prompts are random characters of its alphabet, `--prompt-tokens` long (all alike, so
every chunk is padded to the same length); greedy decoding of `--max-tokens` new tokens without an EOS id, so
every row decodes them all.

Each setting runs in a fresh subprocess (`--child`), one after the other, so that one's memory cannot hide
another's: it builds the model and the engine, then decodes every row in one `sample` call. Printed per setting:
the chunks the engine planned, the peak RSS of the process (ru_maxrss), the part of it the decoding added (peak
minus the RSS before the call), the engine's own estimate for its largest chunk (`Activations.bytes`), the wall
time of the call, and whether its tokens equal the first setting's (greedy: they must). Then the ratio of peak RSS,
one chunk / the default budget.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import time

from rlvr.seeds import prompt_seeds

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ONE_CHUNK = 10**9
"""`max_batch_mb` large enough that only `max_batch_rows` bounds a chunk: the engine before its budget."""


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def child(settings: dict) -> dict:
    import torch

    from rlvr.engine.pytorch import PyTorchEngine
    from rlvr.model.tiny import TinyLlama
    from rlvr.types import SamplingParams

    torch.set_num_threads(settings["threads"])
    model, tok = TinyLlama("0123456789+=", 128, 512, 2, 4, 1024, "float32", None).load(0)
    engine = PyTorchEngine(model, [], tok.pad_token_id, settings["max_batch_rows"], merge_lora=False,
                           max_batch_mb=settings["max_batch_mb"])
    rng = random.Random(0)
    alphabet = [tok.convert_tokens_to_ids(c) for c in "0123456789+="]
    prompts = [[rng.choice(alphabet) for _ in range(settings["prompt_tokens"])] for _ in range(settings["rows"])]
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=settings["max_tokens"])
    engine.sample(prompts[:1], 1, greedy, seeds=prompt_seeds(0, 1))  # first-call allocations outside the measured call
    spans = engine.chunks(prompts, greedy.max_tokens, engine.budget_bytes(torch.device("cpu")))
    largest = max(stop - start for start, stop in spans)
    before = rss_mb()
    t0 = time.perf_counter()
    rollouts = engine.sample(prompts, 1, greedy, seeds=prompt_seeds(0, len(prompts)))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"chunks": len(spans), "largest": largest, "peak_mb": peak, "added_mb": peak - before,
            "estimate_mb": engine.activations.bytes(largest, settings["prompt_tokens"], greedy.max_tokens) / 2**20,
            "seconds": seconds, "tokens": hashlib.sha256(rollouts.tokens_PG_T.numpy().tobytes()).hexdigest()[:12]}


def measure(settings: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.eval_memory", "--child", json.dumps(settings)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--max-tokens", type=int, default=8, help="new tokens per row (trainer=cpu's eval_max_tokens)")
    parser.add_argument("--max-batch-rows", type=int, default=1024, help="conf/engine/pytorch.yaml's")
    parser.add_argument("--budgets", type=float, nargs="*", default=[], help="more max_batch_mb values to measure")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (threads=auto on 2 cores: 1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    base = {"rows": args.rows, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
            "max_batch_rows": args.max_batch_rows, "threads": args.threads}
    names = {"one chunk (before)": ONE_CHUNK, "budget: auto (after)": None,
             **{f"budget: {b:g} MiB": b for b in args.budgets}}
    print(f"{args.rows} rows x {args.prompt_tokens} prompt tokens, {args.max_tokens} new, greedy, tiny model "
          f"(eager, fp32, max_positions 1024), {args.threads} thread(s); one subprocess per setting")
    print(f"{'setting':<22} {'chunks':>6} {'rows/chunk':>10} {'peak RSS MB':>11} {'decode added':>12} "
          f"{'estimate':>9} {'seconds':>8}  same tokens")
    results = {}
    for name, budget in names.items():
        r = results[name] = measure({**base, "max_batch_mb": budget})
        if "error" in r:
            print(f"{name:<22} failed: {r['error']}")
            continue
        same = r["tokens"] == next(v["tokens"] for v in results.values() if "tokens" in v)
        print(f"{name:<22} {r['chunks']:>6} {r['largest']:>10} {r['peak_mb']:>11.0f} {r['added_mb']:>12.0f} "
              f"{r['estimate_mb']:>9.0f} {r['seconds']:>8.1f}  {'yes' if same else 'NO'}", flush=True)
    before, after = results["one chunk (before)"], results["budget: auto (after)"]
    if "peak_mb" in before and "peak_mb" in after:
        print(f"peak RSS before / after: {before['peak_mb']:.0f} / {after['peak_mb']:.0f} MB = "
              f"{before['peak_mb'] / after['peak_mb']:.1f}x; time {before['seconds']:.1f} / {after['seconds']:.1f} s")


if __name__ == "__main__":
    main()
