"""`engine=pytorch`'s shared prefill against a prefill of every row, side by side, at the default's shape.

    .venv/bin/python -m bench.prefill                      # from the repository root
    .venv/bin/python -m bench.prefill --prompts 16 --repeats 41

A chunk's prefill feeds each distinct prompt once and copies its KV cache and first logits to the group's rows
(rlvr/engine/pytorch.py `distinct_rows`). This times one `sample` call of `--prompts` arithmetic prompts × the
default group_size under the default model=tiny LoRA policy (merged copy) and sampling settings, both ways: the
other way is the same engine with `distinct_rows` answering "all distinct", so every row is prefilled. The calls
alternate (load from other jobs hits both alike), the first `--repeats // 8` of each are not counted, and each pair
is checked to sample the same tokens. Printed: each way's median and best milliseconds and the ratio of medians.

Measured here, 2026-12-04, 2-core machine at load ~1, one torch thread, 40 calls each way (medians):
    8 prompts × 8 (the default batch):   shared 22.5 / 23.9 ms, every row 28.7 / 29.1 ms   1.28× / 1.21×
    16 prompts × 8 (bench.episodes'):    shared 41.8 ms, every row 59.0 ms                 1.41×
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import rlvr.engine.pytorch as pytorch_engine
from rlvr.build import build_all
from rlvr.seeds import prompt_seeds
from rlvr.start import local_policy
from tests.composing import compose_config


def every_row(rows: list[list[int]]) -> tuple[None, None]:
    """`distinct_rows` as if no two rows shared a context: each row is prefilled."""
    return None, None


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    c, trainer = build_all(compose_config([]))  # as `python train.py` builds its run
    model, tok = c.preset.load(c.seeds.init)
    _, engine = local_policy(c, model, tok)  # the trainer's backend and engine around it
    engine.connect()
    params, group = trainer.sampling, trainer.group_size
    rng = random.Random(0)
    prompts = [tok.encode(f"{rng.randint(10, 99)}+{rng.randint(10, 99)}=") for _ in range(args.prompts)]
    ways = {"shared": pytorch_engine.distinct_rows, "every row": every_row}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for r in range(args.repeats):
            tokens = []
            for name in (list(ways) if r % 2 else list(ways)[::-1]):
                pytorch_engine.distinct_rows = ways[name]
                t0 = time.perf_counter()
                tokens.append(engine.sample(prompts, group, params, prompt_seeds(r, len(prompts))).tokens_PG_T)
                seconds[name].append(time.perf_counter() - t0)
            assert torch.equal(*tokens), "the two prefills sampled other tokens"
    finally:
        pytorch_engine.distinct_rows = ways["shared"]
    counted = {name: s[args.repeats // 8:] for name, s in seconds.items()}
    print(f"{args.prompts} prompts × {group}, max_tokens {params.max_tokens}, {args.repeats} calls each way, "
          f"torch threads {args.threads}")
    for name, s in counted.items():
        print(f"{name:<10} median {statistics.median(s) * 1e3:6.1f} ms   best {min(s) * 1e3:6.1f} ms")
    ratio = statistics.median(counted["every row"]) / statistics.median(counted["shared"])
    print(f"every row / shared (medians): {ratio:.2f}×")
    return {"ratio": ratio}


if __name__ == "__main__":
    main()
