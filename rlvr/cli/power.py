"""Power of a seed-paired comparison: the smallest difference n seed pairs detect, and the seeds a difference needs.

`rlvr compare` tests a condition against its baseline with the paired two-sided t-test at α = 0.05 over the
n per-seed differences (their mean over sd/√n against t(0.975, n−1)). If the differences are normal with mean Δ and
sd σ, the statistic is noncentral t with n − 1 degrees of freedom and noncentrality λ = Δ√n/σ, so the chance the
test finds the difference is

    power(λ, ν) = P(T_ν,λ > c) + P(T_ν,λ < −c),   c = t(0.975, ν),   ν = n − 1.

With T = (Z + λ)/X, X = √(χ²_ν/ν), each tail is E_X[Φ(·)] (P(T > c) = E[Φ(λ − cX)], P(T < −c) = E[Φ(−λ − cX)]),
integrated here over X's density on a fine grid (Simpson's rule; scipy.stats.nct agrees to 2e-5, the precision of
the t(0.975) table below; tests/cli/test_cli_power.py). That is exact, where the textbook
MDE ≈ (t(0.975, ν) + t(0.8, ν))·σ/√n is low by 14% at n = 2, 5% at n = 3 and 1% at n = 5. The minimum
detectable difference (MDE) is the Δ > 0 with power 0.8 (bisection: power rises with λ); the seeds a difference d
needs are the smallest n ≥ 2 whose power at d reaches 0.8. Both take σ as known, the sd of the (pilot's) paired
differences standing in for it: from 3–5 seeds that sd is itself rough (its 95% interval spans about 0.6σ–2.9σ at
n = 5), so the numbers are a scale, not a promise.
docs/metrics.md#power.
"""

from __future__ import annotations

import math

import numpy as np

POWER = 0.8
LEVEL = "95% confidence, 80% power"
_GRID = 2001  # points of the Simpson grid over X (odd)
MAX_SEEDS = 100_000

# t(0.975, df) for df = 1..30 (to 4 decimals); beyond, the Cornish–Fisher expansion below (error < 1e-5)
T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788,
         2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
         2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
Z_975 = 1.959963984540054


def t_975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (df ≥ 1)."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def _phi(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF, elementwise."""
    return 0.5 * np.array([math.erfc(-v / math.sqrt(2)) for v in x.ravel()]).reshape(x.shape)


def power(lam: float, df: int) -> float:
    """Chance that the two-sided 5% t-test with `df` degrees of freedom rejects at noncentrality `lam`."""
    if df < 1:
        raise ValueError(f"power needs df ≥ 1, got {df}")
    c = t_975(df)
    # X = √(χ²_df/df): density 2(df/2)^(df/2)·x^(df−1)·exp(−df·x²/2)/Γ(df/2), sd ≈ 1/√(2·df), mass within 1 ± 10/√df
    x = np.linspace(max(0.0, 1.0 - 10.0 / math.sqrt(df)), 1.0 + 12.0 / math.sqrt(df), _GRID)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_x = np.where(x > 0, (df - 1) * np.log(x), 0.0 if df == 1 else -np.inf)
    density = np.exp(log_x - df * x**2 / 2 + df / 2 * math.log(df / 2) + math.log(2) - math.lgamma(df / 2))
    tails = _phi(lam - c * x) + _phi(-lam - c * x)
    weights = np.ones(_GRID)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    return float(np.sum(weights * density * tails) * (x[1] - x[0]) / 3)


def mde(n: int, sd: float) -> float:
    """The smallest |Δ| that n seed pairs with paired-difference sd `sd` find with 80% power (n ≥ 2, sd > 0)."""
    low, high = 0.0, 1.0
    while power(high, n - 1) < POWER:
        high *= 2
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if power(mid, n - 1) < POWER else (low, mid)
    return high * sd / math.sqrt(n)


def seeds_needed(detect: float, sd: float) -> int | None:
    """The smallest n ≥ 2 whose test finds |Δ| = `detect` with 80% power, sd taken as known; None past MAX_SEEDS."""

    def enough(n: int) -> bool:
        return power(abs(detect) * math.sqrt(n) / sd, n - 1) >= POWER

    high = 2
    while not enough(high):
        if high >= MAX_SEEDS:
            return None
        high = min(2 * high, MAX_SEEDS)
    low = high // 2  # not enough (or below 2)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return max(high, 2)


def power_of(diffs: list[float], detect: float | None, seeds: int | None = None) -> dict:
    """From a pair's per-seed differences: their sd, the MDE of `seeds` seed pairs (default: as many as there are
    differences; `rlvr plan` passes the campaign's) and the seeds `detect` needs, or in `missing` why not."""
    pairs, n = len(diffs), seeds or len(diffs)
    sd = float(np.std(diffs, ddof=1)) if pairs >= 2 else 0.0
    out: dict = {"n": n, "pairs": pairs, "sd": sd if pairs >= 2 else None, "mde": None, "detect": detect,
                 "seeds_needed": None, "missing": None}
    if pairs < 2:
        out["missing"] = f"{pairs} paired seed{'' if pairs == 1 else 's'}; their sd needs at least 2"
    elif sd < 1e-12:  # equal up to rounding
        out["missing"] = f"the {pairs} paired differences are all equal (sd 0): no spread to size a test by"
    elif n < 2:
        out["missing"] = f"{n} seed; a paired t-test needs at least 2"
    else:
        out["mde"] = mde(n, sd)
        if detect is not None:
            out["seeds_needed"] = seeds_needed(detect, sd)
    return out


def power_line(est: dict) -> str:
    """`power: with 5 seeds this grid detects |Δ| ≥ 0.071 (95% confidence, 80% power); 0.05 needs 9 seeds`."""
    if est["missing"]:
        return f"power: unknown ({est['missing']})"
    line = f"power: with {est['n']} seeds this grid detects |Δ| ≥ {est['mde']:#.3g} ({LEVEL})"
    if est["detect"] is not None:
        needed = est["seeds_needed"]
        line += (f"; {est['detect']:g} needs {needed} seeds" if needed is not None
                 else f"; {est['detect']:g} needs more than {MAX_SEEDS} seeds")
    return line + f"; sd of the paired differences {est['sd']:#.3g}, taken as known"
