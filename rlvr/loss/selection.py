"""kl_cov's and clip_cov's token pick (formulas in rlvr/algorithm/loss.py), made once over the whole step before any
micro-batch's loss (every micro-batch, pass and process together), so that the micro-batch size never changes the
objective; the loss then reads it as `LossInputs.selected`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import
from rlvr.loss.contract import LossSettings

if TYPE_CHECKING:
    from torch import Generator, Tensor


torch = lazy_import("torch")


def select_tokens(settings: LossSettings, new_lp_N_T: Tensor, old_lp_N_T: Tensor, adv_N_T: Tensor, mask_N_T: Tensor,
                  generator: Generator | None = None) -> Tensor:
    """bool [N, T]: the tokens kl_cov penalises or clip_cov zeroes, chosen among `mask_N_T`'s (the valid tokens of
    the WHOLE step) by the covariance score; all False in standard. `generator` (CPU) draws clip_cov's pick; the
    candidates are taken in row-major order, so the pick is a function of the step's tensors and the generator's
    state only."""
    selected = torch.zeros_like(mask_N_T, dtype=torch.bool)
    valid = int(mask_N_T.sum())
    if not settings.selects_tokens or valid == 0:
        return selected
    new, adv = new_lp_N_T.detach()[mask_N_T], adv_N_T[mask_N_T]  # valid tokens, row-major
    cov = (adv - adv.mean()) * (new - new.mean())
    if settings.mode == "kl_cov":
        chosen = cov.topk(max(1, int(valid * min(settings.kl_cov_percent, 100) / 100))).indices
    else:
        ratio, (lo, hi) = torch.exp(new - old_lp_N_T[mask_N_T]), settings.clip_cov_bounds()
        clipped_branch = -ratio.clamp(1 - lo, 1 + hi) * adv > -ratio * adv
        inside = (cov > settings.clip_cov_min) & (cov < settings.clip_cov_max) & ~clipped_branch
        candidates = inside.nonzero().squeeze(-1)
        n = min(max(int(settings.clip_cov_ratio * valid), 1), len(candidates))
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:n].to(candidates.device)]
    selected.view(-1)[mask_N_T.flatten().nonzero().squeeze(-1)[chosen]] = True
    return selected
