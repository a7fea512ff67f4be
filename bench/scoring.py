r"""Throughput of `reward=math` (math-verify in the grading pool) on 10,000 MATH-style completions.

    .venv/bin/python -m bench.scoring                 # from the repository root
    .venv/bin/python -m bench.scoring --items 2000    # quicker

The items are what a training step hands the verifier: groups of G = 8 completions per problem (a
reference, and completions that box the same value written another way, a wrong value, or no box at all),
over items/8 generated problems (integers, fractions, radicals, intervals, polynomials, tuples). They are scored in
steps of `--step` items by ONE `MathVerify` object per configuration, as the trainer does, in three
configurations measured side by side in this run:

- `inline`: `grade()` called in this process's main thread, one item after another (no pool);
- `pool ×1`: the grading pool with one worker;
- `pool ×N`: the grading pool with every core this process may use (the default, `pool_workers: null`).

It prints items/s for each (after the pool's start-up, which is reported on its own), the ratio of
`pool ×N` to `pool ×1` (the scaling over cores) and to `inline` (the cost of the process boundary),
and checks that the workers' pids did not change from the first step to the last (the pool starts once
per run, not per step) and that every configuration gave the same rewards.
"""

from __future__ import annotations

import argparse
import random
import time

from rlvr.reward.math import MathVerify, grade
from rlvr.reward.pool import available_cores

GROUP = 8
PARSING_TIMEOUT_S, VERIFY_TIMEOUT_S = 5, 5


def problems(n: int, rng: random.Random) -> list[tuple[str, list[str], str]]:
    """(reference, equivalent forms, a wrong answer) for n problems of assorted kinds."""
    out = []
    for i in range(n):
        a, b = rng.randint(1, 40), rng.randint(2, 12)
        kind = i % 6
        if kind == 0:
            out.append((str(a * b), [str(a * b), f"{a * b}.0", f"{a * b}"], str(a * b + 1)))
        elif kind == 1:
            forms = [rf"\dfrac{{{a}}}{{{b}}}", rf"{a}/{b}", rf"\frac{{{2 * a}}}{{{2 * b}}}"]
            out.append((rf"\frac{{{a}}}{{{b}}}", forms, rf"\frac{{{a + 1}}}{{{b}}}"))
        elif kind == 2:
            out.append((rf"{a}\sqrt{{{b}}}", [rf"\sqrt{{{a * a * b}}}", rf"{a} \sqrt{{{b}}}"], rf"{a}\sqrt{{{b + 1}}}"))
        elif kind == 3:
            out.append((rf"[{a}, {a + b})", [rf"[{a},{a + b})", rf"\left[{a}, {a + b}\right)"], rf"({a}, {a + b})"))
        elif kind == 4:
            out.append((rf"x^2+{2 * a}x+{a * a}", [rf"(x+{a})^2", rf"x^2 + {2 * a} x + {a * a}"], rf"(x+{a + 1})^2"))
        else:
            out.append((rf"({a}, {b})", [rf"({a},{b})", rf"\left({a}, {b}\right)"], rf"({b}, {a + b})"))
    return out


def items(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    pool = problems(max(1, n // GROUP), rng)
    completions, references = [], []
    while len(completions) < n:
        for reference, forms, wrong in pool:
            for _ in range(GROUP):
                roll = rng.random()
                answer = rng.choice(forms) if roll < 0.5 else wrong if roll < 0.85 else None
                text = "Let me work through this step by step. " * rng.randint(1, 6)
                completions.append(text + (rf"So the answer is $\boxed{{{answer}}}$." if answer else "I am not sure."))
                references.append(reference)
    return completions[:n], references[:n]


def timed_pool(workers: int, completions: list[str], references: list[str], step: int) -> dict:
    reward = MathVerify(PARSING_TIMEOUT_S, VERIFY_TIMEOUT_S, item_timeout_s=20, pool_workers=workers,
                        worker_memory_mb=4096)
    try:
        t0 = time.perf_counter()
        reward.score(completions[:1], references[:1])  # starts the workers
        startup = time.perf_counter() - t0
        first_pids = sorted(w.process.pid for w in reward.pool._workers)
        values, t0 = [], time.perf_counter()
        for start in range(0, len(completions), step):
            values += reward.score(completions[start:start + step], references[start:start + step]).values
        seconds = time.perf_counter() - t0
        same_workers = sorted(w.process.pid for w in reward.pool._workers) == first_pids
        return {"values": values, "seconds": seconds, "startup": startup, "same_workers": same_workers,
                "replaced": reward.pool.replaced}
    finally:
        reward.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=512, help="items per score() call (a training step's P×G)")
    args = parser.parse_args()
    completions, references = items(args.items)
    cores = available_cores()
    print(f"{len(completions)} items, {len(set(references))} problems, steps of {args.step}, {cores} cores")

    t0 = time.perf_counter()
    inline = [grade(c, r, PARSING_TIMEOUT_S, VERIFY_TIMEOUT_S)[0] for c, r in zip(completions, references)]
    inline_s = time.perf_counter() - t0
    one = timed_pool(1, completions, references, args.step)
    full = timed_pool(cores, completions, references, args.step)

    n = len(completions)
    print(f"{'configuration':<16}{'items/s':>10}{'seconds':>10}{'start-up s':>12}")
    print(f"{'inline':<16}{n / inline_s:>10.0f}{inline_s:>10.2f}{'-':>12}")
    for name, r in (("pool ×1", one), (f"pool ×{cores}", full)):
        print(f"{name:<16}{n / r['seconds']:>10.0f}{r['seconds']:>10.2f}{r['startup']:>12.2f}")
    print(f"pool ×{cores} / pool ×1 = {one['seconds'] / full['seconds']:.2f}× "
          f"(ideal {cores}×); pool ×{cores} / inline = {inline_s / full['seconds']:.2f}×")
    print(f"mean reward {sum(inline) / n:.3f}; same rewards in all three: "
          f"{inline == one['values'] == full['values']}; workers started once per run: "
          f"{one['same_workers'] and full['same_workers']} (replaced: {one['replaced'] + full['replaced']})")


if __name__ == "__main__":
    main()
