"""Reward ties (docs/algorithms.md#reward-ties): groups whose rewards all tie carry no learning signal.

Rewards within 1e-6 of a bucket's first (sorted) value are one bucket. A group is *uniform* when it has
one bucket; the trainer zeroes its advantages so it leaves the loss (the predecessor's "skipped"
group). Step metrics keep the predecessor's names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


TIE_EPS = 1e-6


def _buckets(rewards: list[float]) -> list[int]:
    sizes: list[int] = []
    first = None
    for r in sorted(rewards):
        if first is None or r - first > TIE_EPS:
            first = r
            sizes.append(0)
        sizes[-1] += 1
    return sizes


def uniform_groups(rewards_P_G: Tensor) -> Tensor:
    """bool [P]: every reward of the group within 1e-6 of the group's minimum."""
    return (rewards_P_G.max(-1).values - rewards_P_G.min(-1).values) <= TIE_EPS


def tie_metrics(rewards_P_G: Tensor) -> dict[str, float]:
    G = rewards_P_G.shape[1]
    groups = [_buckets(row) for row in rewards_P_G.tolist()] if G >= 2 else []
    total_pairs = len(groups) * G * (G - 1) / 2
    tied_pairs = sum(s * (s - 1) / 2 for sizes in groups for s in sizes)
    eligible = len(groups)
    ties = sum(len(sizes) < G for sizes in groups)
    uniform = sum(len(sizes) == 1 for sizes in groups)
    return {
        "reward_tie_eligible_groups": float(eligible),
        "reward_tie_groups": float(ties),
        "reward_uniform_groups": float(uniform),
        "reward_tie_group_rate": ties / eligible if eligible else 0.0,
        "reward_uniform_group_rate": uniform / eligible if eligible else 0.0,
        "reward_tie_pair_rate": tied_pairs / total_pairs if total_pairs else 0.0,
        "reward_unique_fraction_mean": sum(len(s) / G for s in groups) / eligible if eligible else 0.0,
    }
