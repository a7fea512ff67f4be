"""Step statistics of the uncertainty signal, split into execution and planning tokens
(docs/metrics.md#uncertainty-statistics).

For each prompt group g and token class c ∈ {exec, plan} (plan = planning mask 1, exec = the other
completion tokens; without a planning mask every token is exec):

    v     = min(u, 50) over the class's tokens of all G completions of the group
    mean  = Σv / n,   var = Σ(v − mean)² / n          (population variance)

and the step value is the **unweighted mean over groups** of the per-group values. The `post_*` values
are the same statistics of the signal after SEPA's reshaping (equal to the pre values for transforms
without one). Despite the names these are statistics of the *chosen* signal (predictive variance under
`uncertainty=predictive_variance`), as in retrain.

Metric names (retrain's): `exec_surprisal_mean, exec_surprisal_var, plan_surprisal_mean,
plan_surprisal_var`, their legacy aliases `exec_entropy_mean, exec_entropy_var, plan_entropy_mean,
plan_entropy_var` (same values), and `post_exec_surprisal_mean, post_exec_surprisal_var,
post_plan_surprisal_mean, post_plan_surprisal_var`. `planning_token_fraction` (planning tokens / all
completion tokens of the step) is ours, not retrain's.

Which groups count — deliberate deviations, because the trainer hands transforms every group:
  * retrain computed stats only for groups it did not skip as reward-tied. Here a group counts when any
    of its episode advantages is non-zero. The two differ only for non-tied groups whose advantages are
    all 0 (MaxRL with mean reward ≤ 1e-6, e.g. rewards {−1, +1}), which retrain counted and we do not,
    and for rewards tied only within 1e-6, which retrain skipped.
  * retrain averaged a group with no planning tokens into `plan_*` as 0 (a dataclass default), which
    drags the planning mean toward 0 by the fraction of groups without planning tokens; here a group
    enters a class's average only if it has tokens of that class. A class no counted group has reports 0.
  * No counted group at all (a step without signal, which the trainer skips anyway) → no stats keys,
    like retrain's "only if any group had stats".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.transform.signals import as_weights
from rlvr.transform.uncertainty import MAX_UNCERTAINTY

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_import("torch")

STAT_NAMES = (
    "exec_surprisal_mean",
    "exec_surprisal_var",
    "plan_surprisal_mean",
    "plan_surprisal_var",
    "post_exec_surprisal_mean",
    "post_exec_surprisal_var",
    "post_plan_surprisal_mean",
    "post_plan_surprisal_var",
)
LEGACY_ALIASES = {
    "exec_entropy_mean": "exec_surprisal_mean",
    "exec_entropy_var": "exec_surprisal_var",
    "plan_entropy_mean": "plan_surprisal_mean",
    "plan_entropy_var": "plan_surprisal_var",
}


def groups_with_signal(adv_PG: Tensor, group_size: int) -> Tensor:
    """bool [P]: the group has a non-zero advantage, episode ([P·G]) or token ([P·G, T]) (retrain would not have
    skipped it)."""
    return (adv_PG.reshape(adv_PG.shape[0] // group_size, -1) != 0).any(-1)


def _class_mean_var(v_PG_T: Tensor, sel_PG_T: Tensor, counted_P: Tensor, scratch: Tensor) -> Tensor:
    """[2] (mean over counted groups of the per-group mean, same for the population variance).

    `v_PG_T` is already clipped at 50 and finite; `sel_PG_T` is a 0/1 float mask of its dtype;
    `scratch` is a buffer of v's shape (reused: each fresh [P·G, T] temporary costs page faults)."""
    num_groups = counted_P.numel()
    sel, v, work = (x.reshape(num_groups, -1) for x in (sel_PG_T, v_PG_T, scratch))
    count_P = sel.sum(-1)
    n_P = count_P.clamp(min=1)
    mean_P = torch.mul(v, sel, out=work).sum(-1) / n_P
    var_P = torch.sub(v, mean_P[:, None], out=work).mul_(sel).square_().sum(-1) / n_P  # sel² = sel
    use_P = (counted_P & (count_P > 0)).to(v.dtype)
    return torch.stack([mean_P, var_P]).mul_(use_P).sum(-1) / use_P.sum().clamp(min=1)


def uncertainty_stats(
    u_PG_T: Tensor,
    post_u_PG_T: Tensor,
    exec_PG_T: Tensor,
    planning_PG_T: Tensor | None,
    adv_PG: Tensor,
    group_size: int,
) -> dict[str, float]:
    """The uncertainty stats of the module docstring, of `u_PG_T` (pre) and `post_u_PG_T` (after SEPA's reshaping).

    `exec_PG_T` marks execution tokens (completion tokens outside the planning mask; every completion
    token when `planning_PG_T` is None), `planning_PG_T` the planning tokens among completion tokens;
    bool or 0/1 floats of u's dtype. u and post u must be finite (0 at padding, as
    rlvr.transform.uncertainty gives). No transform here reshapes planning tokens' uncertainty (SEPA
    leaves them as min(u, 50)), so `post_plan_*` equals `plan_*` and is not recomputed."""
    counted_P = groups_with_signal(adv_PG, group_size)
    if not bool(counted_P.any()):
        return {}
    dtype = u_PG_T.dtype
    v = u_PG_T.clamp(max=MAX_UNCERTAINTY)
    scratch = torch.empty_like(v)
    exec_ = as_weights(exec_PG_T, dtype)
    pre_exec = _class_mean_var(v, exec_, counted_P, scratch)
    if planning_PG_T is None:
        pre_plan = torch.zeros(2, dtype=dtype, device=v.device)
    else:
        pre_plan = _class_mean_var(v, as_weights(planning_PG_T, dtype), counted_P, scratch)
    if post_u_PG_T is u_PG_T:
        post_exec = pre_exec
    else:
        post_exec = _class_mean_var(
            torch.clamp(post_u_PG_T, max=MAX_UNCERTAINTY, out=v), exec_, counted_P, scratch
        )
    values = torch.cat([pre_exec, pre_plan, post_exec, pre_plan]).tolist()
    stats = dict(zip(STAT_NAMES, values, strict=True))
    stats.update({alias: stats[name] for alias, name in LEGACY_ALIASES.items()})
    return stats


def planning_token_fraction(mask_PG_T: Tensor, planning_PG_T: Tensor) -> float:
    """Planning tokens / completion tokens over the whole step (0 when the step has no tokens); the
    planning mask must already be restricted to completion tokens. Bool or 0/1 float masks."""
    total = float(mask_PG_T.sum())
    return float(planning_PG_T.sum()) / total if total else 0.0
