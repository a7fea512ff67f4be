"""A straightforward per-group, per-sequence, pure-Python reference of the Delight transforms (spec §3.9 and the
choices rlvr/transform/delight*.py and hard_delight.py document: ordering-gap halves, ties, groups counted,
token advantages per sign). Sorting and Python's statistics module stand in for the vectorised selections, so
the tests check rlvr.transform against an independent transliteration. Not imported by library code.

Rows are given as their real tokens only (no padding). An advantage per row is a float (episode advantage) or a
list (one per real token: multi-turn turn credit).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MAX = 50.0
LN_1_5 = math.log(1.5)


def sigmoid(x: float) -> float:
    if x > 20.0:
        return 1.0
    if x < -20.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


def normalize(s: list[float], norm: str) -> list[float]:
    def scale() -> list[float]:
        n = len(s)
        if n < 2:
            return list(s)
        mean = sum(s) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in s) / n)
        return list(s) if std < 1e-8 else [x / std for x in s]

    if norm == "none":
        return list(s)
    if norm == "scale" or not s:
        return scale()
    med = statistics.median(s)
    mad = 1.4826 * statistics.median([abs(x - med) for x in s])
    return scale() if mad < 1e-8 else [x / mad for x in s]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    fraction = position - lower
    if fraction == 0:
        return ordered[lower]
    return ordered[lower] + fraction * (ordered[lower + 1] - ordered[lower])


def token_advantages(adv: float | list[float], n: int) -> list[float]:
    return [adv] * n if isinstance(adv, float | int) else list(adv)


def units_of(advs: list[float]) -> list[tuple[int, list[int]]]:
    """(sign, token positions) of each unit of a row: its tokens with A_t > 0, those with A_t < 0."""
    units = []
    for sign in (1, -1):
        positions = [t for t, a in enumerate(advs) if a * sign > 0]
        if positions:
            units.append((sign, positions))
    return units


def unit_gap(sign: int, positions: list[int], s: list[float], gates: list[float]) -> float | None:
    if len(positions) < 2:
        return None
    ordered = sorted(positions, key=lambda t: sign * s[t])  # stable: earlier positions first among ties
    half = len(ordered) // 2
    lower, upper = ordered[:half], ordered[half:]
    return sum(gates[t] for t in upper) / len(upper) - sum(gates[t] for t in lower) / len(lower)


@dataclass
class Eta:
    eta: float = 1.0
    mode: str = "fixed"
    eta_min: float = 0.05
    eta_max: float = 5.0
    neutral: float = 0.5
    gap: float = 0.0
    ema: float = 0.0
    prev: float | None = None

    def clamp(self, x: float) -> float:
        return min(max(x, self.eta_min), self.eta_max)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def uncertainty_stats(groups: list[list[list[float]]]) -> dict[str, float]:
    """The uncertainty statistics (docs/metrics.md#uncertainty-statistics) of the counted groups, each given as its
    rows' surprisals min(−logprob, 50) before any normalisation: every token exec (no planning mask), post = pre,
    plan 0; per group the mean and population variance, then the mean over the groups that have tokens."""
    if not groups:
        return {}
    present = [[x for row in group for x in row] for group in groups]
    present = [values for values in present if values]
    mean = _mean([statistics.fmean(values) for values in present]) or 0.0
    var = _mean([statistics.pvariance(values) for values in present]) or 0.0
    out = {"exec_surprisal_mean": mean, "exec_surprisal_var": var, "plan_surprisal_mean": 0.0,
           "plan_surprisal_var": 0.0}
    out |= {f"post_{k}": v for k, v in out.items()}
    out |= {k.replace("surprisal", "entropy"): out[k] for k in list(out) if not k.startswith("post_")}
    return out


def delight_step(adv_PG: list, logprobs_PG: list[list[float]], group_size: int, *, norm: str, eta: Eta,
                 lam: float | None) -> tuple[list[list[float]], dict[str, float]]:
    """(new token advantages per row, metrics); advances eta.prev."""
    rows_out: list[list[float]] = []
    per_group: list[dict[str, float]] = []
    counted_surprisals: list[list[list[float]]] = []
    for start in range(0, len(adv_PG), group_size):
        rows = range(start, start + group_size)
        raw_rows = [[min(-lp, MAX) for lp in logprobs_PG[i]] for i in rows]
        s_rows = [normalize(raw, norm) for raw in raw_rows]
        a_rows = [token_advantages(adv_PG[i], len(logprobs_PG[i])) for i in rows]
        counted = any(a != 0 for advs in a_rows for a in advs) or any(
            not isinstance(adv_PG[i], list) and adv_PG[i] != 0 for i in rows)

        def gates_at(eta_value: float, s_rows=s_rows, a_rows=a_rows) -> list[list[float]]:
            return [[sigmoid(a * x / eta_value) for a, x in zip(advs, s, strict=True)]
                    for advs, s in zip(a_rows, s_rows, strict=True)]

        def mean_gap(gate_rows: list[list[float]], s_rows=s_rows, a_rows=a_rows) -> float | None:
            gaps = [unit_gap(sign, pos, s, gates) for advs, s, gates in zip(a_rows, s_rows, gate_rows, strict=True)
                    for sign, pos in units_of(advs)]
            return _mean([g for g in gaps if g is not None])

        raw = None
        if eta.mode == "fixed":
            eta_g = raw = max(eta.eta, 1e-8)
        else:
            mags = [abs(a * x) for advs, s in zip(a_rows, s_rows, strict=True) for a, x in zip(advs, s, strict=True)
                    if a != 0]
            if mags:
                raw = quantile(mags, eta.neutral) / LN_1_5
                eta_g = eta.clamp(raw)
                if eta.gap > 0:
                    gap = mean_gap(gates_at(eta_g))
                    if gap is not None and gap < eta.gap:
                        eta_g = eta.clamp(eta_g * max(gap / eta.gap, 0.25))
                if 0 < eta.ema < 1 and eta.prev is not None:
                    eta_g = eta.clamp(eta.ema * eta.prev + (1 - eta.ema) * eta_g)
            else:
                eta_g = eta.clamp(eta.prev if eta.prev is not None else eta.eta)
        gate_rows = gates_at(eta_g)
        new_rows = [[a * (g if lam is None else (1 - lam) + lam * g) for a, g in zip(advs, gates, strict=True)]
                    for advs, gates in zip(a_rows, gate_rows, strict=True)]
        rows_out.extend(new_rows)
        if not counted:
            continue
        counted_surprisals.append(raw_rows)
        gated = [(g, a) for advs, gates in zip(a_rows, gate_rows, strict=True)
                 for a, g in zip(advs, gates, strict=True) if a != 0]
        values = [g for g, _ in gated]
        m: dict[str, float | None] = {}
        if values:
            m.update(dg_gate_mean=_mean(values), dg_gate_std=statistics.pstdev(values), dg_gate_min=min(values),
                     dg_gate_max=max(values),
                     dg_breakthrough_frac=sum(g > 0.8 for g in values) / len(values),
                     dg_suppressed_frac=sum(g < 0.2 for g in values) / len(values),
                     dg_neutral_frac=sum(0.4 <= g <= 0.6 for g in values) / len(values))
        m["dg_gate_mean_pos"] = _mean([g for g, a in gated if a > 0])
        m["dg_gate_mean_neg"] = _mean([g for g, a in gated if a < 0])
        unit_gaps = [(sign, unit_gap(sign, pos, s, gates))
                     for advs, s, gates in zip(a_rows, s_rows, gate_rows, strict=True) for sign, pos in units_of(advs)]
        m["dg_gate_ordering_gap"] = _mean([g for _, g in unit_gaps if g is not None])
        m["dg_gate_ordering_gap_pos"] = _mean([g for sign, g in unit_gaps if g is not None and sign > 0])
        m["dg_gate_ordering_gap_neg"] = _mean([g for sign, g in unit_gaps if g is not None and sign < 0])
        m["dg_lambda"] = 1.0 if lam is None else lam
        flat_new = [x for row in new_rows for x in row]
        bias = sum(flat_new) - sum(a for advs in a_rows for a in advs)
        m["dg_net_advantage_bias"] = bias
        if flat_new:
            m["dg_net_advantage_bias_per_token"] = bias / len(flat_new)
            m["dg_token_adv_std"] = statistics.pstdev(flat_new)
        m["dg_within_rollout_adv_var"] = _mean([statistics.pvariance(row) for row in new_rows if row])
        m["dg_eta"] = eta_g
        m["dg_eta_raw"] = raw
        per_group.append({k: v for k, v in m.items() if v is not None})
    metrics = {key: _mean([g[key] for g in per_group if key in g]) for key in {k for g in per_group for k in g}}
    if per_group:
        metrics.update(dg_eta_adaptive=float(eta.mode == "adaptive"), dg_eta_target_neutral_frac=eta.neutral,
                       dg_eta_target_ordering_gap=eta.gap, dg_eta_min=eta.eta_min, dg_eta_max=eta.eta_max,
                       dg_eta_ema_decay=eta.ema)
        if eta.prev is not None:
            metrics["dg_eta_prev"] = eta.prev
        eta.prev = metrics["dg_eta"]
    return rows_out, metrics | uncertainty_stats(counted_surprisals)


def hard_delight_step(adv_PG: list, logprobs_PG: list[list[float]], group_size: int, *, k_frac: float,
                      lam: float) -> tuple[list[list[float]], dict[str, float]]:
    rows_out: list[list[float]] = []
    per_group: list[dict[str, float]] = []
    counted_surprisals: list[list[list[float]]] = []
    for start in range(0, len(adv_PG), group_size):
        kept_count = gated_count = 0
        bias = 0.0
        raw_rows = []
        for i in range(start, start + group_size):
            s = [min(-lp, MAX) for lp in logprobs_PG[i]]
            raw_rows.append(s)
            advs = token_advantages(adv_PG[i], len(s))
            kept: set[int] = set()
            for sign, positions in units_of(advs):
                k = max(1, int(len(positions) * k_frac))
                kept |= set(sorted(positions, key=lambda t, sign=sign: sign * s[t], reverse=True)[:k])
                gated_count += len(positions)
            new = [a * ((1 - lam) + lam * (1.0 if t in kept else 0.0)) for t, a in enumerate(advs)]
            kept_count += len(kept)
            bias += sum(new) - sum(advs)
            rows_out.append(new)
        advs_group = [adv_PG[i] for i in range(start, start + group_size)]
        if any((a != 0) if not isinstance(a, list) else any(x != 0 for x in a) for a in advs_group):
            group = {"hard_dg_k_frac": k_frac, "hard_dg_lambda": lam, "hard_dg_net_bias": bias}
            if gated_count:
                group["hard_dg_active_frac"] = kept_count / gated_count
            per_group.append(group)
            counted_surprisals.append(raw_rows)
    metrics = {key: _mean([g[key] for g in per_group if key in g]) for key in {k for g in per_group for k in g}}
    return rows_out, metrics | uncertainty_stats(counted_surprisals)
