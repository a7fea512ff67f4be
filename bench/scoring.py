r"""Throughput of `reward=math` (math-verify in the grading pool) on 10,000 MATH-style completions, and its
wall time on the hostile corpus, before and after the guards, budgets and scheduling of issue 12.

    .venv/bin/python -m bench.scoring                 # from the repository root (the hostile "before" takes minutes)
    .venv/bin/python -m bench.scoring --items 2000    # quicker
    .venv/bin/python -m bench.scoring --hostile after # the hostile corpus with the defaults only (none: skip it)

Honest throughput. The items are what a training step hands the verifier: groups of G = 8 completions per
problem (a reference, and completions that box the same value written another way, a wrong value, or no box
at all), over items/8 generated problems (integers, fractions, radicals, intervals, polynomials, tuples).
They are scored in steps of `--step` items by ONE `MathVerify` object per configuration (conf/reward/math.yaml's
values), as the trainer does, in three configurations measured side by side in this run:

- `inline`: `grade()` called in this process's main thread, one item after another (no pool);
- `pool ×1`: the grading pool with one worker;
- `pool ×N`: the grading pool with every core this process may use (the default, `pool_workers: null`).

It prints items/s for each (after the pool's start-up, which is reported on its own), the ratio of
`pool ×N` to `pool ×1` (the scaling over cores) and to `inline` (the cost of the process boundary),
and checks that the workers' pids did not change from the first step to the last (the pool starts once
per run, not per step) and that every configuration gave the same rewards.

Hostile corpus (tests/reward/hostile.py: power towers, integrals, huge sums, factorials, deep nesting,
megabyte boxes, ... against references such as \frac{1}{2}), scored in one call with 2 workers:

- `before`: the grading as it was, reproduced here (`legacy_grade`): math-verify's own 5 s alarms per parse
  and per comparison, no guards, no identical-text shortcut, chunks of 16 consecutive items with the same
  reference sent whole to one worker (`prefetch_items=16`: nothing left to take from it), a 20 s hard bound;
- `after`: `MathVerify` with conf/reward/math.yaml's values.

For each: wall seconds, timeouts, errors, parse failures, workers replaced, and how many items got a reward
other than the one the corpus expects.

Measured with `--items 4000` on a 2-core machine shared with other jobs (load average about 5): honest
pool ×2 141 items/s (the same code before issue 12: 95-109; dealing items one at a time instead of by
reference: 78-99); hostile corpus before 650 s (208 timeouts), after 9.1 s (4 timeouts, no worker killed).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

from rlvr.data.boxed import extract_boxed
from rlvr.reward.math import MathVerify, grade, warm_up
from rlvr.reward.pool import ERROR, OK, PARSE_FAIL, TIMEOUT, GradingPool, available_cores

ROOT = Path(__file__).resolve().parents[1]
GROUP = 8
HOSTILE_WORKERS = 2
LEGACY_TIMEOUT_S, LEGACY_ITEM_TIMEOUT_S, LEGACY_CHUNK = 5, 20.0, 16
"""The settings before issue 12: math-verify's alarms (whole seconds), the hard bound, the chunk size."""


def default_reward(**overrides) -> MathVerify:
    """`MathVerify` with conf/reward/math.yaml's values, and `overrides`."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(ROOT / "conf/reward/math.yaml"), _convert_="all", **overrides)


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
    reward = default_reward(pool_workers=workers)
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


class _LegacyTimeouts(logging.Handler):
    """Counts math-verify's "Timeout during ..." warnings (it returns [] / False on its own timeouts)."""

    count = 0

    def emit(self, record: logging.LogRecord) -> None:
        _LegacyTimeouts.count += record.getMessage().startswith("Timeout during")


def legacy_warm_up() -> None:
    logger = logging.getLogger("math_verify")
    logger.addHandler(_LegacyTimeouts(logging.WARNING))
    logger.propagate = False
    from math_verify import parse  # noqa: F401 - imported before the clock, as the old workers did on item 1


def legacy_grade(completion: str, reference: str) -> tuple[float, str]:
    """The grading before issue 12, for the "before" figure: math-verify's own whole-second alarms, no guards."""
    from math_verify import LatexExtractionConfig, parse, verify

    def parsed(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=[LatexExtractionConfig()],
                     parsing_timeout=LEGACY_TIMEOUT_S)

    before = _LegacyTimeouts.count
    try:
        answer = extract_boxed(completion)
        if not answer:
            return 0.0, PARSE_FAIL
        gold = parsed(reference)
        pred = parsed(answer) if gold else []
        correct = bool(gold and pred and verify(gold, pred, timeout_seconds=LEGACY_TIMEOUT_S))
    except BaseException as err:  # noqa: BLE001 - as the old grade did
        if isinstance(err, KeyboardInterrupt | SystemExit):
            raise
        return 0.0, ERROR
    if correct:
        return 1.0, OK
    if _LegacyTimeouts.count > before:
        return 0.0, TIMEOUT
    return 0.0, (ERROR if not gold else PARSE_FAIL if not pred else OK)


def hostile(before: bool) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from reward.hostile import CORPUS

    completions, references = [h.completion for h in CORPUS], [h.reference for h in CORPUS]
    expected = [h.expected.get("math") for h in CORPUS]
    print(f"\nhostile corpus: {len(CORPUS)} items (tests/reward/hostile.py), {HOSTILE_WORKERS} workers, one call")
    print(f"{'configuration':<10}{'seconds':>9}{'timeouts':>10}{'errors':>8}{'parse fail':>12}{'replaced':>10}"
          f"{'off expected':>14}")
    runs = []  # (name, seconds, values, timeouts, errors, parse failures, workers replaced)
    if before:
        pool = GradingPool(legacy_grade, HOSTILE_WORKERS, LEGACY_ITEM_TIMEOUT_S, 4096, chunk_items=LEGACY_CHUNK,
                           prefetch_items=LEGACY_CHUNK, warm_up=legacy_warm_up)
        try:
            pool.grade([("\\boxed{1}", "1")], [0])  # starts the workers
            t0 = time.perf_counter()
            graded = pool.grade(list(zip(completions, references)), references)
            seconds = time.perf_counter() - t0
            statuses = [status for _, status in graded]
            runs.append(("before", seconds, [v for v, _ in graded], statuses.count(TIMEOUT), statuses.count(ERROR),
                         statuses.count(PARSE_FAIL), pool.replaced))
        finally:
            pool.close()
    reward = default_reward(pool_workers=HOSTILE_WORKERS)
    try:
        reward.score(["\\boxed{1}"], ["1"])  # starts the workers
        t0 = time.perf_counter()
        scores = reward.score(completions, references)
        runs.append(("after", time.perf_counter() - t0, scores.values, scores.timeouts, scores.errors,
                     scores.parse_failures, reward.pool.replaced))
    finally:
        reward.close()
    for name, seconds, values, timeouts, errors, parse_failures, replaced in runs:
        off = sum(e is not None and v != e for v, e in zip(values, expected))
        print(f"{name:<10}{seconds:>9.1f}{timeouts:>10}{errors:>8}{parse_failures:>12}{replaced:>10}{off:>14}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=512, help="items per score() call (a training step's P×G)")
    parser.add_argument("--hostile", choices=["both", "after", "none"], default="both",
                        help="the hostile corpus before and after issue 12, after only, or not at all")
    args = parser.parse_args()
    completions, references = items(args.items)
    cores = available_cores()
    print(f"{len(completions)} items, {len(set(references))} problems, steps of {args.step}, {cores} cores")

    settings = default_reward(pool_workers=1)  # its pool starts only when it scores: here, never
    warm_up()  # imports, as each pool worker does before it takes work
    t0 = time.perf_counter()
    inline = [grade(c, r, *settings.timeouts, settings.guards)[0] for c, r in zip(completions, references)]
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
    if args.hostile != "none":
        hostile(before=args.hostile == "both")


if __name__ == "__main__":
    main()
