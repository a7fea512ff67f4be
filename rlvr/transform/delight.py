"""`transform=delight`: each token's credit gated by how surprising the token was, in the direction of its
advantage (retrain's Delight gating; docs/algorithms.md#delight).

For a completion with advantage A (or a token with its own A_t: multi-turn turn credit, rlvr/turn_credit/)
and sampled-token surprisals s_t = min(−logprob_t, 50) over its n real tokens:

    s̃_t  = s_t                                     norm = none
         = s_t / std(s)                            norm = scale (population std, no centring;
                                                                 n < 2 or std < 1e-8 → s̃ = s)
         = s_t / (1.4826 · median|s − median(s)|)  norm = mad_scale (falls back to scale below 1e-8)
    gate_t = σ(A_t·s̃_t / η)                        σ(x) = 1 for x > 20, 0 for x < −20, 1/(1 + e^−x) otherwise
    A'_t = A_t · gate_t                            delight
    A'_t = A_t · ((1 − λ) + λ·gate_t)              delight_sepa (rlvr/transform/delight_sepa.py)

e.g. A = 1, s = [0.1, 2.0], η = 1, norm none: gate = [σ(0.1), σ(2)] = [0.52498, 0.88080], A' = gate;
A = −1: gate = [σ(−0.1), σ(−2)] = [0.47502, 0.11920], A' = −gate. Positive credit goes to the surprising
tokens (a "breakthrough"), blame to the unsurprising ones; A = 0 gives zeros; 0 ≤ gate ≤ 1, so the sign of
A_t is kept and |A'_t| ≤ |A_t|; padding is exactly 0. The medians are the usual ones (the mean of the two
middle values for an even n). η is fixed or adaptive per prompt group (rlvr.transform.delight_eta).

Metrics (retrain's names), per prompt group over its tokens with A_t ≠ 0 ("gated"), then the mean over the
groups with a non-zero advantage that have the quantity (as uncertainty stats count groups,
rlvr.transform.uncertainty_stats): `dg_gate_mean, dg_gate_std` (population), `dg_gate_min, dg_gate_max`,
`dg_breakthrough_frac` (gate > 0.8), `dg_suppressed_frac` (< 0.2), `dg_neutral_frac` ([0.4, 0.6]),
`dg_gate_mean_pos, dg_gate_mean_neg` (tokens with A_t > 0 / < 0), `dg_gate_ordering_gap` and its `_pos`,
`_neg` parts (below), `dg_lambda` (the λ used; 1 for delight), `dg_net_advantage_bias` (Σ_t A'_t − Σ_t A_t over
the group: Σ A_i·n_i for episode advantages), `dg_net_advantage_bias_per_token` (that over the group's real
tokens), `dg_token_adv_std` (population std of A' over the group's real tokens), `dg_within_rollout_adv_var`
(the population variance of A' within a completion, averaged over the group's non-empty completions), the
η metrics of rlvr.transform.delight_eta, and the uncertainty statistics (rlvr.transform.uncertainty_stats) of
s = min(−logprob, 50) before any normalisation, every token exec (Delight reads no planning mask), post = pre.

Ordering gap: per completion with A ≠ 0 and n ≥ 2 — with token advantages, per completion and sign of A_t —
rank its tokens by sign(A)·s̃ (by s̃ for A > 0, by −s̃ for A < 0); the lower half is the ⌊n/2⌋ lowest
(ties: earlier positions first, a stable sort's order), the upper half the other ⌈n/2⌉ (an odd n's middle
token counts with the upper half); gap = mean gate of the upper half − mean gate of the lower half. For
A > 0 that is "top half by surprisal minus bottom half", for A < 0 the same negated, as retrain's sign
correction: with one advantage per completion the gate is monotone in sign(A)·s̃, so the gap is ≥ 0.
`_pos`/`_neg` average the completions (units) with A > 0 / A < 0, both sign-corrected. Ranks are taken
without sorting (rlvr.transform.order_stats).

Knobs: `norm` (none | scale | mad_scale; retrain default none for delight, scale for delight_sepa), and η's
(`eta, eta_mode, eta_min, eta_max, eta_target_neutral_frac, eta_target_ordering_gap, eta_ema_decay`).
`state_dict()`: {"transform": "delight", "eta_prev": …}.

Deliberate departures from retrain, which ran Delight one prompt group at a time: here a step is one call over
[P·G, T] with the same per-group η and per-group metrics (a group counts when one of its advantages is
non-zero — retrain processed every group it did not skip as tied, including non-tied groups whose MaxRL
advantages are all 0); token advantages from a multi-turn turn credit are gated token by token with their own
A_t (retrain had one advantage per completion); an odd n's middle token counts with the upper half of the
ordering gap, where retrain's code took ⌊n/2⌋ tokens for each half and left the middle one out — with one
advantage per completion the middle token's gate is the lowest of the upper half, so the gap here is at most
retrain's, and with eta_target_ordering_gap > 0 the adaptive η at most retrain's (ties change no gap: tied s̃,
tied gates); retrain's boolean alias `delight_normalize` is not accepted; the adaptive η is kept inside
[eta_min, eta_max] after its EMA (rlvr.transform.delight_eta); retrain left the post_* uncertainty statistics of
its Delight transforms at 0, here they equal the pre values. The gate reads sampled-token surprisal only (no
`uncertainty` knob), as retrain's did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.transform import knobs
from rlvr.transform.delight_eta import DelightEta
from rlvr.transform.order_stats import Work, kth, lowest, scratch
from rlvr.transform.signals import as_weights, check_step, per_token
from rlvr.transform.uncertainty import token_uncertainty
from rlvr.transform.uncertainty_stats import groups_with_signal, uncertainty_stats
from rlvr.types import TokenSignals

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

NORMS = ("none", "scale", "mad_scale")
SATURATION = 20.0
"""|x| beyond which σ(x) is taken as exactly 1 or 0 (retrain's sigmoid)."""
MAD_CONSISTENCY = 1.4826
"""MAD → standard deviation for a normal distribution."""
SATURATION_SCALE = 1e6
SCALE_EPS = 1e-8
BREAKTHROUGH, SUPPRESSED, NEUTRAL_LOW, NEUTRAL_HIGH = 0.8, 0.2, 0.4, 0.6

# On CPU every fresh [P·G, T] tensor costs page faults (~0.2 ms for 128 × 1024 float32, more than most
# arithmetic on it), so the hot path below works in a few buffers with `out=` and in-place operations.


def row_median(values_R_T: Tensor, valid_R_T: Tensor, work: Work) -> Tensor:
    """[R] median of each row's valid entries (mean of the two middle ones for an even count; arbitrary if none).
    work[0] may be `values_R_T` (then overwritten)."""
    n_R = valid_R_T.sum(-1).long()
    lower_R, upper_R = kth(values_R_T, valid_R_T, (n_R + 1) // 2, work=work, with_next=True)
    return torch.where(n_R % 2 == 1, lower_R, (lower_R + upper_R) / 2)


def delight_surprisal(s: Tensor, weights: Tensor, norm: str, work: Work) -> Tensor:
    """s̃ [P·G, T] from the surprisals s = min(−logprob, 50) (0 at padding; divided in place unless norm is none),
    `weights` the completion mask as 0/1 floats of s's dtype."""
    if norm == "none":
        return s
    n_R = weights.sum(-1)
    mean_R = s.sum(-1) / n_R.clamp(min=1)
    deviation = torch.mul(weights, mean_R[:, None], out=work[0])
    std_R = torch.sub(s, deviation, out=deviation).square_().sum(-1).div_(n_R.clamp(min=1)).sqrt_()
    divisor_R = torch.where((n_R >= 2) & (std_R >= SCALE_EPS), std_R, 1.0)
    if norm == "mad_scale":
        median_R = row_median(s, weights, work)
        spread = torch.sub(s, median_R[:, None], out=work[0]).abs_().mul_(weights)
        mad_R = MAD_CONSISTENCY * row_median(spread, weights, work)
        divisor_R = torch.where(mad_R >= SCALE_EPS, mad_R, divisor_R)
    return s.div_(divisor_R[:, None])


def delight_gate(logit: Tensor, work_R_T: Tensor | None = None) -> Tensor:
    """σ(logit) in place, exactly 1 above +20 and 0 below −20 (`work_R_T`: scratch, allocated if needed)."""
    if float(logit.amax()) > SATURATION or float(logit.amin()) < -SATURATION:
        # beyond ±20 the logit is scaled by 1 + 1e6 (≥ 2e7 in size), where σ is exactly 1 or 0 in float32 and
        # float64; inside, by exactly 1
        far = torch.abs(logit, out=work_R_T).gt_(SATURATION)
        logit.mul_(far.mul_(SATURATION_SCALE).add_(1.0))
    return logit.sigmoid_()


@dataclass(frozen=True)
class Units:
    """What a rank is taken within: a completion with A ≠ 0, or with token advantages one completion's tokens of
    one sign of A_t (row r's A_t > 0 tokens are unit r, its A_t < 0 tokens unit R + r)."""

    key_U_T: Tensor
    """sign(A)·s: ranking by it ranks by surprisal for A > 0 and reversed for A < 0."""
    valid_U_T: Tensor
    """0/1: the unit's tokens (real, A_t ≠ 0 of the unit's sign). Episode advantages: the completion mask, a
    completion with A = 0 being left out by its count of 0."""
    count_U: Tensor
    """The unit's tokens."""
    sign_U: Tensor
    """+1 / −1 (0 for an episode advantage of 0)."""
    copies: int
    """U = copies·R: 1 for episode advantages, 2 for token advantages."""

    def spread(self, x_R_T: Tensor) -> Tensor:
        """A [R, T] token quantity laid out per unit, [U, T]."""
        return x_R_T if self.copies == 1 else torch.cat([x_R_T, x_R_T])

    def gated(self, out: Tensor | None = None) -> Tensor:
        """0/1 [R, T]: real tokens with A_t ≠ 0 (in `out` when given)."""
        if self.copies == 1:
            return torch.mul(self.valid_U_T, self.sign_U.abs()[:, None], out=out)
        return torch.sum(self.valid_U_T.reshape(2, -1, self.valid_U_T.shape[-1]), 0, out=out)

    def row_sums(self, x_R_T: Tensor) -> Tensor:
        """[R] Σ_t x over each row's gated tokens; x 0/1 or float, 0 at padding."""
        if self.copies == 1:  # a row is gated entirely or not at all: no token pass
            return x_R_T.sum(-1).mul_(self.sign_U.abs())
        return self.unit_sums(x_R_T).reshape(2, -1).sum(0)

    def unit_sums(self, x_R_T: Tensor) -> Tensor:
        """[U] Σ_t x over each unit's tokens; x 0 at padding."""
        if self.copies == 1:
            return self.row_sums(x_R_T)
        return (self.spread(x_R_T) * self.valid_U_T).sum(-1)


def units_of(adv_R_X: Tensor, s_R_T: Tensor, weights_R_T: Tensor) -> Units:
    """The units of `adv_R_X` ([R, 1] episode or [R, T] token advantages) over the real tokens `weights_R_T`."""
    if adv_R_X.shape[1] == 1:
        sign_R = torch.sign(adv_R_X[:, 0])
        return Units(s_R_T * sign_R[:, None], weights_R_T, weights_R_T.sum(-1) * sign_R.abs(), sign_R, 1)
    positive = weights_R_T * as_weights(adv_R_X > 0, s_R_T.dtype)
    negative = weights_R_T * as_weights(adv_R_X < 0, s_R_T.dtype)
    valid = torch.cat([positive, negative])
    ones_R = torch.ones(s_R_T.shape[0], dtype=s_R_T.dtype, device=s_R_T.device)
    return Units(torch.cat([s_R_T, -s_R_T]), valid, valid.sum(-1), torch.cat([ones_R, -ones_R]), 2)


def lower_halves(units: Units, work: Work) -> Tensor:
    """0/1 [U, T] (in work[0]): each unit's ⌊n/2⌋ tokens lowest in sign(A)·s (ties: earlier positions first)."""
    return lowest(units.key_U_T, units.valid_U_T, units.count_U.div(2).floor().long(), work=work)


def unit_gaps(units: Units, lower_U_T: Tensor, gate_w: Tensor, scratch_U_T: Tensor | None = None
              ) -> tuple[Tensor, Tensor]:
    """(sign-corrected gap [U], 0/1 [U] the unit has n ≥ 2): mean gate of its upper half − of its lower half.
    `gate_w` is the gate, 0 at padding."""
    n_U = units.count_U
    half_U = n_U.div(2).floor()
    lower_sum_U = torch.mul(units.spread(gate_w), lower_U_T, out=scratch_U_T).sum(-1)
    upper_sum_U = units.unit_sums(gate_w) - lower_sum_U
    gap_U = upper_sum_U / (n_U - half_U).clamp(min=1) - lower_sum_U / half_U.clamp(min=1)
    return gap_U, (n_U >= 2).to(gap_U.dtype)


def by_group(x_X_K: Tensor, num_groups: int, group_size: int) -> Tensor:
    """Row- ([R, …]) or unit-level ([U, …]) quantities summed per prompt group: [P, …] (float64)."""
    return x_X_K.to(torch.float64).reshape(-1, num_groups, group_size, *x_X_K.shape[1:]).sum((0, 2))


def group_gap(units: Units, lower_U_T: Tensor, gate_w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(mean gap of each group's units with n ≥ 2 [P] float64, bool [P] the group has one)."""
    gap_U, known_U = unit_gaps(units, lower_U_T, gate_w)
    num_groups = gate_w.shape[0] // group_size
    sums_P_2 = by_group(torch.stack([gap_U * known_U, known_U], -1), num_groups, group_size)
    return sums_P_2[:, 0] / sums_P_2[:, 1].clamp(min=1), sums_P_2[:, 1] > 0


class GroupMeans:
    """Per-group metric values → the step's: the mean over the counted groups that have each value."""

    def __init__(self, counted_P: Tensor) -> None:
        self.counted_P = counted_P
        self.names: list[str] = []
        self.values: list[Tensor] = []
        self.has: list[Tensor] = []

    def add(self, name: str, value_P: Tensor, has_P: Tensor | None = None) -> None:
        self.names.append(name)
        self.values.append(value_P.to(torch.float64))
        self.has.append(self.counted_P if has_P is None else has_P & self.counted_P)

    def result(self) -> dict[str, float]:
        if not self.names:
            return {}
        has_M_P = torch.stack(self.has)
        values_M_P = torch.where(has_M_P, torch.stack(self.values), 0.0)  # a group without the value counts 0
        count_M = has_M_P.sum(-1)
        means = (values_M_P.sum(-1) / count_M.clamp(min=1)).tolist()
        return {name: mean for name, mean, n in zip(self.names, means, count_M.tolist(), strict=True) if n > 0}


def gate_metrics(out: GroupMeans, units: Units, lower_U_T: Tensor, gate_w: Tensor, weights: Tensor,
                 group_size: int, work_R_T: Tensor) -> None:
    """dg_gate_*, the band fractions and the ordering gaps, from the gate (0 at padding) of the gated tokens.
    `work_R_T` is scratch."""
    num_groups = out.counted_P.numel()
    dtype = gate_w.dtype
    n_U = units.count_U
    gate_U = units.unit_sums(gate_w)
    gap_U, known_U = unit_gaps(units, lower_U_T, gate_w, work_R_T if units.copies == 1 else None)
    pos_U, neg_U = (units.sign_U > 0).to(dtype), (units.sign_U < 0).to(dtype)
    unit_P = by_group(torch.stack([n_U, gate_U, n_U * pos_U, gate_U * pos_U, n_U * neg_U, gate_U * neg_U,
                                   gap_U * known_U, known_U, gap_U * known_U * pos_U, known_U * pos_U,
                                   gap_U * known_U * neg_U, known_U * neg_U], -1), num_groups, group_size)
    count_P = unit_P[:, 0]
    has_P = count_P > 0
    n_P = count_P.clamp(min=1)
    mean_P = unit_P[:, 1] / n_P
    deviation = torch.mul(weights, mean_P.to(dtype).repeat_interleave(group_size)[:, None], out=work_R_T)
    rows = [units.row_sums(torch.sub(gate_w, deviation, out=deviation).square_())]  # Σ (g − μ)² over gated
    # bands, counted with comparisons that are False at padding (gate 0): suppressed = n − #(g ≥ 0.2)
    for compare, bound in ((torch.gt, BREAKTHROUGH), (torch.ge, SUPPRESSED), (torch.ge, NEUTRAL_LOW),
                           (torch.gt, NEUTRAL_HIGH)):
        rows.append(units.row_sums(compare(gate_w, bound, out=work_R_T)))
    row_P = by_group(torch.stack(rows, -1), num_groups, group_size)
    out.add("dg_gate_mean", mean_P, has_P)
    out.add("dg_gate_std", (row_P[:, 0] / n_P).sqrt(), has_P)
    minimum_P, maximum_P = gate_extremes(units, gate_w, weights, num_groups, work_R_T)
    out.add("dg_gate_min", minimum_P, has_P)
    out.add("dg_gate_max", maximum_P, has_P)
    out.add("dg_breakthrough_frac", row_P[:, 1] / n_P, has_P)
    out.add("dg_suppressed_frac", (count_P - row_P[:, 2]) / n_P, has_P)
    out.add("dg_neutral_frac", (row_P[:, 3] - row_P[:, 4]) / n_P, has_P)
    out.add("dg_gate_mean_pos", unit_P[:, 3] / unit_P[:, 2].clamp(min=1), unit_P[:, 2] > 0)
    out.add("dg_gate_mean_neg", unit_P[:, 5] / unit_P[:, 4].clamp(min=1), unit_P[:, 4] > 0)
    for name, column in (("dg_gate_ordering_gap", 6), ("dg_gate_ordering_gap_pos", 8),
                         ("dg_gate_ordering_gap_neg", 10)):
        out.add(name, unit_P[:, column] / unit_P[:, column + 1].clamp(min=1), unit_P[:, column + 1] > 0)


def gate_extremes(units: Units, gate_w: Tensor, weights: Tensor, num_groups: int, work_R_T: Tensor
                  ) -> tuple[Tensor, Tensor]:
    """([P] min, [P] max) of the gate over each group's gated tokens (arbitrary for a group without any)."""
    gated = weights if units.copies == 1 else units.gated()  # episode advantages: rows are gated whole
    # gates lie in [0, 1]: +2 moves the other tokens out of the minimum; the maximum's others are 0 (gates ≥ 0)
    row_min_R = torch.neg(gated, out=work_R_T).add_(1.0).mul_(2.0).add_(gate_w).amin(-1)
    row_max_R = (gate_w if units.copies == 1 else torch.mul(gate_w, gated, out=work_R_T)).amax(-1)
    has_R = units.row_sums(gated) > 0
    minimum_P = torch.where(has_R, row_min_R, 2.0).reshape(num_groups, -1).amin(-1)
    maximum_P = torch.where(has_R, row_max_R, -1.0).reshape(num_groups, -1).amax(-1)
    return minimum_P, maximum_P


def advantage_metrics(out: GroupMeans, units: Units, new: Tensor, adv: Tensor, weights: Tensor,
                      group_size: int, work_R_T: Tensor) -> None:
    """dg_net_advantage_bias(_per_token), dg_token_adv_std, dg_within_rollout_adv_var of the new advantages."""
    num_groups = out.counted_P.numel()
    dtype = new.dtype
    n_R = weights.sum(-1)
    new_R = new.sum(-1)
    old_R = adv[:, 0] * n_R if units.copies == 1 else torch.mul(adv, weights, out=work_R_T).sum(-1)
    sums_P = by_group(torch.stack([new_R, old_R, n_R], -1), num_groups, group_size)
    tokens_P = sums_P[:, 2]
    mean_P = sums_P[:, 0] / tokens_P.clamp(min=1)
    centre = torch.mul(weights, mean_P.to(dtype).repeat_interleave(group_size)[:, None], out=work_R_T)
    group_sq_R = torch.sub(new, centre, out=centre).square_().sum(-1)
    centre = torch.mul(weights, (new_R / n_R.clamp(min=1))[:, None], out=work_R_T)
    row_var_R = torch.sub(new, centre, out=centre).square_().sum(-1) / n_R.clamp(min=1)
    var_P = by_group(torch.stack([group_sq_R, row_var_R, (n_R > 0).to(dtype)], -1), num_groups, group_size)
    bias_P = sums_P[:, 0] - sums_P[:, 1]
    out.add("dg_net_advantage_bias", bias_P)
    out.add("dg_net_advantage_bias_per_token", bias_P / tokens_P.clamp(min=1), tokens_P > 0)
    out.add("dg_token_adv_std", (var_P[:, 0] / tokens_P.clamp(min=1)).sqrt(), tokens_P > 0)
    out.add("dg_within_rollout_adv_var", var_P[:, 1] / var_P[:, 2].clamp(min=1), var_P[:, 2] > 0)


def gate_of(adv: Tensor, s: Tensor, weights: Tensor, eta_P: Tensor, group_size: int, out: Tensor | None = None,
            work_R_T: Tensor | None = None) -> Tensor:
    """σ(A·s̃/η)·w: the gate at η (per group), 0 at padding (in `out` when given; `work_R_T`: scratch)."""
    eta_R_1 = eta_P.to(s.dtype).repeat_interleave(group_size)[:, None]
    return delight_gate(torch.mul(adv, s, out=out).div_(eta_R_1), work_R_T).mul_(weights)


def delight_advantages(adv_PG: Tensor, signals: TokenSignals, *, norm: str, eta: DelightEta,
                       lam: float | None) -> tuple[Tensor, dict[str, float]]:
    """A·σ(A·s̃/η) (lam None) or A·((1 − λ) + λ·σ(A·s̃/η)) on [P·G, T], and the metrics of the module docstring.
    Advances `eta`'s state (η_prev) by one step."""
    check_step(adv_PG, signals)
    group_size = signals.group_size
    work = scratch(signals.logprobs_PG_T)
    weights = as_weights(signals.mask_PG_T, signals.logprobs_PG_T.dtype)
    s = token_uncertainty("surprisal", signals, weights)
    stats = uncertainty_stats(s, s, weights, None, adv_PG, group_size)  # of s itself, before any normalisation
    s = delight_surprisal(s, weights, norm, work)
    adv = per_token(adv_PG, s.dtype)
    num_groups = weights.shape[0] // group_size
    units = units_of(adv, s, weights)
    episode = units.copies == 1
    lower = lower_halves(units, work if episode else scratch(units.key_U_T))
    # episode advantages: from here the key's buffer holds |A·s̃|, then the gate; work[1] is scratch
    free = units.key_U_T if episode else None
    eta_P, raw_P, raw_known_P = eta.resolve(
        num_groups,
        lambda: (torch.mul(adv, s, out=free).abs_().reshape(num_groups, -1),
                 units.gated(out=work[1] if episode else None).reshape(num_groups, -1)),
        lambda eta_P: group_gap(units, lower, gate_of(adv, s, weights, eta_P, group_size, free, work[1]),
                                group_size),
    )
    gate_w = gate_of(adv, s, weights, eta_P, group_size, free, work[1])
    if lam is None:  # s is not needed any more: the new advantages take its buffer
        new = torch.mul(gate_w, adv, out=s)
    else:
        new = torch.mul(weights, 1.0 - lam, out=s).add_(gate_w, alpha=lam).mul_(adv)
    counted_P = groups_with_signal(adv_PG, group_size)
    if not bool(counted_P.any()):
        return new, {}
    out = GroupMeans(counted_P)
    gate_metrics(out, units, lower, gate_w, weights, group_size, work[1])
    out.add("dg_lambda", torch.full((num_groups,), 1.0 if lam is None else lam, dtype=torch.float64))
    advantage_metrics(out, units, new, adv, weights, group_size, work[1])
    out.add("dg_eta", eta_P)
    out.add("dg_eta_raw", raw_P, raw_known_P)
    metrics = out.result()
    metrics.update(eta.metrics(metrics["dg_eta"], metrics.get("dg_eta_raw")))
    eta.observe(metrics["dg_eta"])
    metrics.update(stats)
    return new, metrics


def check_state(state: dict[str, Any], name: str) -> None:
    """A checkpoint's transform state must be this transform's: refuse another's, naming both."""
    found = state.get("transform") if isinstance(state, dict) else None
    if found != name:
        raise ValueError(
            f"cannot load the transform state {state!r} into transform={name}: it was written by "
            f"{f'transform={found}' if found else 'another transform'} (resume with the transform the checkpoint "
            "was trained with)"
        )


class Delight:
    """`Delight(norm, eta, eta_mode, eta_min, eta_max, eta_target_neutral_frac, eta_target_ordering_gap,
    eta_ema_decay)`: see the module docstring."""

    name = "delight"

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __init__(self, *, norm: str, eta: float, eta_mode: str, eta_min: float, eta_max: float,
                 eta_target_neutral_frac: float, eta_target_ordering_gap: float, eta_ema_decay: float) -> None:
        self.norm = knobs.choice("norm", norm, NORMS)
        self.eta = DelightEta(eta=eta, eta_mode=eta_mode, eta_min=eta_min, eta_max=eta_max,
                              eta_target_neutral_frac=eta_target_neutral_frac,
                              eta_target_ordering_gap=eta_target_ordering_gap, eta_ema_decay=eta_ema_decay)

    def __call__(self, adv_PG: Tensor, signals: TokenSignals) -> tuple[Tensor, dict[str, float]]:
        return delight_advantages(adv_PG, signals, norm=self.norm, eta=self.eta, lam=None)

    def state_dict(self) -> dict[str, Any]:
        return {"transform": self.name, **self.eta.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.name)
        self.eta.load_state_dict(state)
