"""A straightforward per-sequence, pure-Python reference of the token-level transforms and SEPA controller.

It transliterates retrain's list-based functions (the formulas of docs/algorithms.md, from uncertainty
through entropy_mask) one completion at a time, so the vectorised rlvr.transform code can be checked
against it (tests, and bench/transforms.py at 1e-9 in float64). The only non-retrain semantics are the
documented step aggregation of the stats (groups with a non-zero advantage; per class only groups having
tokens of that class) in `reference_step`.
Not imported by library code.
"""

from __future__ import annotations

import math
import sys

import torch

MAX = 50.0


# --- uncertainty (docs/algorithms.md#uncertainty) -------------------------------------------------------


def uncertainty(kind: str, logprobs: list[float], entropies: list[float] | None) -> list[float]:
    if kind == "surprisal":
        return [min(-lp, MAX) for lp in logprobs]
    if kind == "predictive_variance":
        out = []
        for lp in logprobs:
            p = max(0.0, min(1.0, math.exp(max(lp, -MAX))))
            out.append(p * (1.0 - p))
        return out
    assert kind == "shannon_entropy" and entropies is not None
    return [min(h, MAX) for h in entropies]


# --- credit: gtpo, hicra, sepa, entropy_mask (docs/algorithms.md) ---------------------------------------


def gtpo(advantage: float, u: list[float], beta: float) -> list[float]:
    n = len(u)
    if n == 0:
        return []
    if beta == 0.0:
        return [advantage] * n
    u = [min(x, MAX) for x in u]
    mean_h = sum(u) / n
    if mean_h < 1e-7:
        return [advantage] * n
    return [advantage * max(0.0, 1.0 + beta * (h / (mean_h + 1e-8) - 1.0)) for h in u]


def hicra(token_advs: list[float], plan: list[int], alpha: float) -> list[float]:
    if alpha == 0.0:
        return list(token_advs)
    return [a + alpha * abs(a) if m else a for a, m in zip(token_advs, plan, strict=True)]


def sepa_reshape(u: list[float], plan: list[int], lam: float, variant: str) -> list[float]:
    lam = max(0.0, min(1.0, lam))
    if lam == 0.0:
        return list(u)
    u = [min(e, MAX) for e in u]
    exec_vals = [e for e, m in zip(u, plan, strict=True) if m == 0]
    if not exec_vals:
        return list(u)
    mu = sum(exec_vals) / len(exec_vals)
    if variant == "pool":
        return [e if m else lam * mu + (1.0 - lam) * e for e, m in zip(u, plan, strict=True)]
    if variant == "amp":
        return [e if m else (1.0 + lam) * e - lam * mu for e, m in zip(u, plan, strict=True)]
    assert variant == "amp_c"
    return [e if m else max(0.0, (1.0 + lam) * e - lam * mu) for e, m in zip(u, plan, strict=True)]


def entropy_mask_threshold(flat: list[float], rho: float) -> float:
    if rho >= 1.0:
        return -math.inf
    n = len(flat)
    if n == 0:
        return 0.0
    return sorted(flat, reverse=True)[max(1, int(n * rho)) - 1]


def class_stats(values: list[float]) -> tuple[float, float] | None:
    """(mean, population variance) of min(v, 50), None when empty."""
    if not values:
        return None
    values = [min(v, MAX) for v in values]
    n = len(values)
    mean = sum(values) / n
    return mean, sum((v - mean) ** 2 for v in values) / n


# --- one step, group by group ---------------------------------------------------------------------------


def reference_step(
    mode: str,
    adv_PG: list[float],
    logprobs_PG: list[list[float]],
    planning_PG: list[list[int]],
    group_size: int,
    *,
    beta: float,
    uncertainty_kind: str = "surprisal",
    alpha: float = 0.0,
    lam: float = 0.0,
    rho: float = 0.0,
    entropies_PG: list[list[float]] | None = None,
) -> tuple[list[list[float]], dict[str, float]]:
    """mode ∈ gtpo | hicra | pool | amp | amp_c | entropy_mask → (per-row token advantages, metrics)."""
    uses_planning = mode in ("hicra", "pool", "amp", "amp_c")
    rows_out: list[list[float]] = []
    per_group: list[dict[str, float]] = []
    group_stats: list[dict[str, tuple[float, float] | None]] = []
    for start in range(0, len(adv_PG), group_size):
        pre_exec, pre_plan, post_exec, post_plan, raw, group_rows = [], [], [], [], [], []
        for i in range(start, start + group_size):
            ents = entropies_PG[i] if entropies_PG is not None else None
            u = uncertainty(uncertainty_kind, logprobs_PG[i], ents)
            plan = planning_PG[i] if uses_planning else [0] * len(u)
            raw.append(u)
            post = sepa_reshape(u, plan, lam, mode) if mode in ("pool", "amp", "amp_c") else u
            for e, e_post, m in zip(u, post, plan, strict=True):
                (pre_plan if m else pre_exec).append(e)
                (post_plan if m else post_exec).append(e_post)
            advs = gtpo(adv_PG[i], post, beta)
            if mode == "hicra":
                advs = hicra(advs, plan, alpha)
            group_rows.append(advs)
        extra: dict[str, float] = {}
        if mode == "entropy_mask" and rho > 0.0:
            flat = [e for seq in raw for e in seq]
            threshold = entropy_mask_threshold(flat, rho)
            group_rows = [
                [a if e >= threshold else 0.0 for a, e in zip(advs, u, strict=True)]
                for advs, u in zip(group_rows, raw, strict=True)
            ]
            masked = sum(1 for e in flat if e < threshold)
            extra = {
                "entropy_mask_threshold": threshold,
                "entropy_mask_fraction": masked / len(flat) if flat else 0.0,
            }
        rows_out.extend(group_rows)
        if any(a != 0.0 for a in adv_PG[start : start + group_size]):
            per_group.append(extra)
            group_stats.append(
                {
                    "exec_surprisal": class_stats(pre_exec),
                    "plan_surprisal": class_stats(pre_plan),
                    "post_exec_surprisal": class_stats(post_exec),
                    "post_plan_surprisal": class_stats(post_plan),
                }
            )
    return rows_out, _aggregate(group_stats, per_group)


def _aggregate(group_stats: list[dict], per_group: list[dict[str, float]]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if not group_stats:
        return metrics
    for name in ("exec_surprisal", "plan_surprisal", "post_exec_surprisal", "post_plan_surprisal"):
        present = [g[name] for g in group_stats if g[name] is not None]
        metrics[f"{name}_mean"] = sum(m for m, _ in present) / len(present) if present else 0.0
        metrics[f"{name}_var"] = sum(v for _, v in present) / len(present) if present else 0.0
    for key in {k for g in per_group for k in g}:
        values = [g[key] for g in per_group if key in g]
        metrics[key] = sum(values) / len(values)
    return metrics


# --- the SEPA controller's auto state, one sequence at a time (docs/algorithms.md#sepa-controller) ------


class SequentialAutoState:
    """retrain's update_auto_state, called once per sequence."""

    def __init__(self, ema_decay: float, warmup: int) -> None:
        self.ema_decay, self.warmup = ema_decay, warmup
        self.var_ema: float | None = None
        self.var_0: float | None = None
        self.warmup_seen = 0

    def update(self, exec_surprisals: list[float]) -> None:
        valid = [e for e in exec_surprisals if math.isfinite(e) and 0.0 <= e <= math.sqrt(sys.float_info.max)]
        if not valid:
            return
        n = len(valid)
        mean = math.fsum(valid) / n
        var_batch = math.fsum((e - mean) ** 2 for e in valid) / n
        if not math.isfinite(var_batch):
            return
        if self.var_ema is None:
            self.var_ema = var_batch
        else:
            self.var_ema = self.ema_decay * self.var_ema + (1.0 - self.ema_decay) * var_batch
        if self.var_0 is None:
            self.warmup_seen += 1
            if self.warmup_seen >= self.warmup:
                self.var_0 = max(self.var_ema, 1e-8)


# --- building padded tensors from per-row lists ----------------------------------------------------------


def pad(rows: list[list[float]], length: int, dtype: torch.dtype, fill: float = 0.0) -> torch.Tensor:
    out = torch.full((len(rows), length), fill, dtype=dtype)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def mask_of(rows: list[list], length: int) -> torch.Tensor:
    return torch.arange(length)[None, :] < torch.tensor([len(r) for r in rows])[:, None]


def unpad(adv_PG_T: torch.Tensor, rows: list[list]) -> list[list[float]]:
    return [adv_PG_T[r, : len(row)].tolist() for r, row in enumerate(rows)]
