"""Throughput and exactness of the token-level half of the advantage pipeline: MaxRL → a token transform, for
SEPA (pooling; before Delight existed this bench timed it alone) and the Delight arms beside it.

    .venv/bin/python -m bench.transforms            # from the repository root (imports the test references)
    .venv/bin/python -m bench.transforms --shapes 2x4x64 --seconds 0.1 --arms sepa   # a quick look

For each shape P groups × G completions × T tokens it builds a synthetic step (completion lengths uniform
in [T/4, T], surprisal ~ Exponential(mean 0.5), ≈ 5 % planning tokens in 3-token spans, Bernoulli(0.3)
rewards so some groups tie), then times the whole pipeline in float32 — MaxRL episode advantages
(r − μ)/(μ + 1e-6), 0 when μ ≤ 1e-6, and the transform with every metric — and prints tokens/s over the
P·G·T padded positions (the tensor size the trainer hands over) and over real completion tokens. The median
and best of repeated calls are reported, with 1 thread and with torch's default thread count. Arms (ARMS):
`sepa` at λ = 0.5; `delight`, `delight_sepa` and `hard_delight` with their YAML defaults (the λ schedule's gate
opened, so λ = 0.5 at the step timed); and two non-default Delight settings, the adaptive η (with the ordering-
gap correction and the EMA) and mad_scale, whose per-row medians are the dearest selections.

Exactness: the same step in float64 is compared with the straightforward per-sequence pure-Python references
(tests/transform/retrain_reference.py, tests/transform/delight_reference.py) — token advantages and metrics to
1e-9 — on all groups of the small shape and on the first `--check-groups` groups of the large one (the
references need seconds per million tokens; token advantages are per completion and metrics per group, so a
slice of whole groups is a complete check of those groups). Under the adaptive η a token can sit exactly on
the neutral band's edge, where torch's and math's sigmoid round apart: `dg_neutral_frac` is not compared there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.transform.delight import Delight
from rlvr.transform.delight_sepa import DelightSEPA
from rlvr.transform.hard_delight import HardDelight
from rlvr.transform.sepa import SEPA
from rlvr.transform.sepa_controller import LambdaSchedule
from rlvr.types import TokenSignals
from tests.transform import delight_reference
from tests.transform.retrain_reference import reference_step

SHAPES = [(8, 16, 1024), (64, 16, 4096)]
TARGET_TOKENS_PER_S = 30e6  # on the first shape
SCHEDULE = LambdaSchedule(  # conf/lambda_schedule.yaml's, but for the gate
    kind="linear", steps=500, delay_steps=50,
    correct_rate_gate=0.0,  # open from the start so that λ = (300 − 50)/500 = 0.5 at STEP
    ema_decay=0.99, var_threshold=0.2, warmup_sequences=50, fixed_lambda=None,
)
SEPA_KNOBS = dict(beta=0.1, uncertainty="surprisal", schedule=SCHEDULE)
STEP = 300
LAMBDA = 0.5
CONTROLLER = {"schedule": SCHEDULE}
ETA = dict(eta=1.0, eta_mode="fixed", eta_min=0.05, eta_max=5.0, eta_target_neutral_frac=0.5,
           eta_target_ordering_gap=0.0, eta_ema_decay=0.0)  # conf/transform/delight.yaml
ADAPTIVE = {**ETA, "eta_mode": "adaptive", "eta_target_ordering_gap": 0.2, "eta_ema_decay": 0.5}
ARMS: dict[str, Callable[[], Callable]] = {
    "sepa": lambda: SEPA(**SEPA_KNOBS),
    "delight": lambda: Delight(norm="none", **ETA),
    "delight (adaptive η)": lambda: Delight(norm="none", **ADAPTIVE),
    "delight (mad_scale)": lambda: Delight(norm="mad_scale", **ETA),
    "delight_sepa": lambda: DelightSEPA(norm="scale", **ETA, **CONTROLLER),
    "hard_delight": lambda: HardDelight(k_frac=0.2, **CONTROLLER),
}


def maxrl_advantages(rewards_P_G: Tensor, eps: float = 1e-6) -> Tensor:
    """MaxRL (docs/algorithms.md#maxrl), inline so the bench does not depend on rlvr.algorithm."""
    mean_P_1 = rewards_P_G.mean(-1, keepdim=True)
    adv = (rewards_P_G - mean_P_1) / (mean_P_1 + eps)
    return torch.where(mean_P_1 > eps, adv, torch.zeros_like(adv))


def synthetic_step(
    num_groups: int, group_size: int, length: int, seed: int = 0
) -> tuple[Tensor, TokenSignals]:
    """float64 rewards [P, G] and signals; cast with `as_dtype` for float32 runs."""
    gen = torch.Generator().manual_seed(seed)
    rows = num_groups * group_size
    lengths = torch.randint(length // 4, length + 1, (rows,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    surprisal = torch.empty(rows, length, dtype=torch.float64).exponential_(2.0, generator=gen)
    logprobs = torch.where(mask, -surprisal, 0.0)
    starts = torch.rand(rows, length, generator=gen) < 0.05 / 3
    planning = (starts | starts.roll(1, -1) | starts.roll(2, -1)) & mask
    rewards = (torch.rand(num_groups, group_size, generator=gen) < 0.3).to(torch.float64)
    signals = TokenSignals(
        logprobs, mask, group_size, STEP, float((rewards > 0.5).double().mean()), planning_PG_T=planning
    )
    return rewards, signals


def as_dtype(signals: TokenSignals, dtype: torch.dtype) -> TokenSignals:
    return TokenSignals(
        signals.logprobs_PG_T.to(dtype),
        signals.mask_PG_T,
        signals.group_size,
        signals.step,
        signals.correct_rate,
        planning_PG_T=signals.planning_PG_T,
    )


def pipeline(transform: Callable, rewards_P_G: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
    return transform(maxrl_advantages(rewards_P_G).reshape(-1), signals)


def throughput(
    arm: str, num_groups: int, group_size: int, length: int, min_seconds: float
) -> tuple[float, float, int, int]:
    """(median and best seconds per step, padded positions, completion tokens), float32."""
    rewards, signals64 = synthetic_step(num_groups, group_size, length)
    rewards, signals = rewards.float(), as_dtype(signals64, torch.float32)
    transform = ARMS[arm]()
    for _ in range(3):
        pipeline(transform, rewards, signals)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        pipeline(transform, rewards, signals)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), signals.mask_PG_T.numel(), int(signals.mask_PG_T.sum())


def references(arm: str, adv_PG: list[float], logprobs: list[list[float]], planning: list[list[int]],
               group_size: int) -> tuple[list[list[float]], dict[str, float], tuple[str, ...]]:
    """(token advantages per row, metrics, metric names not compared) of `arm` by its per-sequence reference."""
    if arm == "sepa":
        rows, metrics = reference_step("pool", adv_PG, logprobs, planning, group_size, beta=0.1, lam=LAMBDA)
        return rows, metrics, ()
    if arm == "hard_delight":
        rows, metrics = delight_reference.hard_delight_step(adv_PG, logprobs, group_size, k_frac=0.2, lam=LAMBDA)
        return rows, metrics, ()
    eta = {"delight (adaptive η)": delight_reference.Eta(mode="adaptive", gap=0.2, ema=0.5)}.get(
        arm, delight_reference.Eta())
    norm = {"delight (mad_scale)": "mad_scale", "delight_sepa": "scale"}.get(arm, "none")
    rows, metrics = delight_reference.delight_step(adv_PG, logprobs, group_size, norm=norm, eta=eta,
                                                   lam=LAMBDA if arm == "delight_sepa" else None)
    return rows, metrics, ("dg_neutral_frac",) if eta.mode == "adaptive" else ()


def max_error(arm: str, num_groups: int, group_size: int, length: int, check_groups: int
              ) -> tuple[float, float, int, float]:
    """(max |Δ| of token advantages, max relative |Δ| of metrics, tokens checked, seconds the per-sequence
    reference took) against the reference."""
    rewards, signals = synthetic_step(num_groups, group_size, length)
    rows = check_groups * group_size
    rewards, signals = (
        rewards[:check_groups],
        TokenSignals(
            signals.logprobs_PG_T[:rows],
            signals.mask_PG_T[:rows],
            group_size,
            STEP,
            signals.correct_rate,
            planning_PG_T=signals.planning_PG_T[:rows],
        ),
    )
    adv_PG_T, metrics = pipeline(ARMS[arm](), rewards, signals)
    assert metrics.get("sepa_lambda", LAMBDA) == LAMBDA
    lengths = signals.mask_PG_T.sum(-1).tolist()
    logprobs = [signals.logprobs_PG_T[r, :n].tolist() for r, n in enumerate(lengths)]
    planning = [signals.planning_PG_T[r, :n].int().tolist() for r, n in enumerate(lengths)]
    adv_PG = maxrl_advantages(rewards).reshape(-1).tolist()
    t0 = time.perf_counter()
    ref_rows, ref_metrics, skipped = references(arm, adv_PG, logprobs, planning, group_size)
    reference_seconds = time.perf_counter() - t0
    token_error = max(
        (abs(a - b) for r, ref in enumerate(ref_rows) for a, b in zip(adv_PG_T[r, : len(ref)].tolist(), ref)),
        default=0.0,
    )
    padding = adv_PG_T[~signals.mask_PG_T]
    assert padding.numel() == 0 or padding.abs().max().item() == 0.0, "padding leaked"
    assert ref_metrics.keys() <= metrics.keys(), sorted(ref_metrics.keys() - metrics.keys())
    stat_error = max(abs(metrics[k] - v) / max(abs(v), 1e-300) for k, v in ref_metrics.items() if k not in skipped)
    return token_error, stat_error, sum(lengths), reference_seconds


def shape(text: str) -> tuple[int, int, int]:
    """`8x16x1024` → (8, 16, 1024)."""
    try:
        num_groups, group_size, length = (int(n) for n in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected groups x completions x tokens, e.g. 8x16x1024") from None
    return num_groups, group_size, length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check-groups", type=int, default=8, help="groups of the large shape checked exactly"
    )
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS), help="transforms to time")
    parser.add_argument("--shapes", nargs="+", type=shape, default=SHAPES, metavar="PxGxT",
                        help="step shapes, groups × completions × tokens (default: 8x16x1024 64x16x4096)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed calls per arm and thread count, at least")
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, load average {load} before the run; pipeline: MaxRL → transform (λ = {LAMBDA} "
        f"where it has one), float32. With other jobs on the cores, several OpenMP threads stall each other: "
        f"compare 1 thread."
    )
    ok = True
    slow: list[str] = []
    for index, (num_groups, group_size, length) in enumerate(args.shapes):
        for arm in args.arms:
            medians = []
            for threads in sorted({1, default_threads}):
                torch.set_num_threads(threads)
                median, best, padded, tokens = throughput(arm, num_groups, group_size, length, args.seconds)
                medians.append(median)
                if index == 0 and threads == 1 and padded / median < TARGET_TOKENS_PER_S:
                    slow.append(arm)
                print(
                    f"{num_groups:>3} × {group_size} × {length:>5}  {arm:<21} {threads} thread(s): median "
                    f"{median * 1e3:7.2f} ms/step = {padded / median / 1e6:6.1f} M padded tokens/s "
                    f"({tokens / median / 1e6:5.1f} M completion tokens/s); "
                    f"best {best * 1e3:7.2f} ms = {padded / best / 1e6:6.1f} M/s"
                )
            torch.set_num_threads(default_threads)
            check = num_groups if index == 0 else min(args.check_groups, num_groups)
            token_error, stat_error, checked, ref_seconds = max_error(arm, num_groups, group_size, length, check)
            exact = token_error <= 1e-9 and stat_error <= 1e-9
            ok &= exact
            print(
                f"    float64 vs the per-sequence reference on {check} groups ({checked} tokens): "
                f"max |Δ token advantage| {token_error:.1e}, max relative Δ metrics {stat_error:.1e}  "
                f"{'OK' if exact else 'FAIL'}"
            )
            if check == num_groups:  # the reference ran on the whole shape: a like-for-like speed ratio
                print(
                    f"    per-sequence pure-Python reference on the same step: {ref_seconds * 1e3:.0f} ms = "
                    f"{padded / ref_seconds / 1e6:.2f} M padded tokens/s; vectorised is "
                    f"{ref_seconds / min(medians):.0f}× faster than it"
                )
    print(f"target: ≥ {TARGET_TOKENS_PER_S / 1e6:.0f} M padded tokens/s on the first shape with 1 thread "
          f"(the issue's ≥ 50× against the predecessor's 0.6 M tokens/s)"
          + (f"; below it in this run: {', '.join(slow)}" if slow else "; every arm above it in this run"))
    if not ok:
        raise SystemExit("exactness check failed")


if __name__ == "__main__":
    main()
