"""Order statistics of ragged rows without sorting: the r_i-th smallest (or largest) of row i's valid entries,
r_i varying by row, as one selection over the padded [R, T] tensor.

Sorting is too slow for the credit pipeline's budget (≥ 30 M padded tokens/s on one thread, ~4.4 ms for a
[128, 1024] step: sorting it takes ~6 ms, `torch.kthvalue` ~1.5 ms, numpy's introselect `np.partition` ~0.15 ms
— measured with torch 2.13 / numpy 2.3 on one core; CPU tensors go through numpy, others through
`torch.kthvalue`). Both take one rank for every row, so each row's invalid slots are filled with sentinels to
shift its rank to a common K:

    K   = max_i r_i
    c_i = K − r_i invalid slots (the first ones by position) hold −BIG, the other invalid slots +BIG
          (for the largest: +BIG and −BIG)
    K-th smallest (largest) of the filled row i = the r_i-th smallest (largest) of its valid entries

which needs c_i ≤ (invalid slots of row i) = T − n_i. That holds whenever r(n) grows by at most 1 per valid
entry and rows that do not ask (r_i = 0) are ignored: every rank used here (⌊n/2⌋, max(1, ⌊n·f⌋),
⌊q(n − 1)⌋ + 1, ⌈n/2⌉; f, q ∈ [0, 1]) is such. A row that does not fit raises instead of answering wrong.

Ties are resolved by position where a *set* is selected (`lowest`, `highest`): among entries equal to the
threshold, the earliest positions are taken first — a stable sort's order.

Entries must be finite (invalid ones too: they are multiplied by 0) and within ±BIG = finfo(dtype).max / 4 (so
±BIG and 2·BIG are exact). Masks are 0/1 floats of the values' dtype (rlvr.transform.signals.as_weights).
`work` is two scratch tensors of the values' shape and dtype, overwritten (allocated when not given: on CPU
each fresh [P·G, T] tensor costs page faults, so callers that select more than once pass their own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

numpy = lazy_import("numpy")
torch = lazy_import("torch")

Work = tuple["Tensor", "Tensor"]


def on_numpy(tensor: Tensor) -> bool:
    """Whether the selection goes through numpy (a CPU tensor) rather than `torch.kthvalue` (GPU tensors)."""
    return tensor.device.type == "cpu" and not tensor.requires_grad


def scratch(like: Tensor) -> Work:
    return torch.empty_like(like), torch.empty_like(like)


@overload
def kth(values_R_T: Tensor, valid_R_T: Tensor, rank_R: Tensor, *, largest: bool = False,
        work: Work | None = None, with_next: Literal[False] = False) -> Tensor: ...


@overload
def kth(values_R_T: Tensor, valid_R_T: Tensor, rank_R: Tensor, *, largest: bool = False,
        work: Work | None = None, with_next: Literal[True]) -> tuple[Tensor, Tensor]: ...


def kth(values_R_T: Tensor, valid_R_T: Tensor, rank_R: Tensor, *, largest: bool = False,
        work: Work | None = None, with_next: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """[R]: the rank_R[i]-th smallest (largest) of row i's valid entries, 1-based; arbitrary for rank 0.
    `with_next` (smallest only): also the (rank + 1)-th smallest, arbitrary where rank + 1 > n_i.

    `rank_R` (integer) must lie in [0, n_i] (n_i = valid entries of row i). work[0] may be `values_R_T` itself
    (which is then overwritten)."""
    rows, length = values_R_T.shape
    n_R = valid_R_T.sum(-1)
    if rows == 0 or length == 0 or int(rank_R.max()) == 0:
        zeros = values_R_T.new_zeros(rows)
        return (zeros, zeros) if with_next else zeros
    if bool(((rank_R < 0) | (rank_R > n_R)).any()):
        raise ValueError("order_stats.kth: a rank lies outside [0, valid entries] of its row")
    k = int(rank_R.max())
    shift_R_1 = (k - rank_R).to(values_R_T.dtype)[:, None]
    if bool(((rank_R > 0) & (shift_R_1[:, 0] > length - n_R)).any()):
        raise ValueError(f"order_stats.kth: ranks that differ by more than their rows' padding (K={k}) cannot share "
                         "one selection")
    filled, shifted = work if work is not None else scratch(values_R_T)
    big = torch.finfo(values_R_T.dtype).max / 4
    edge, other = (big, -big) if largest else (-big, big)
    torch.neg(valid_R_T, out=shifted).add_(1.0)  # the invalid slots
    torch.mul(values_R_T, valid_R_T, out=filled).add_(shifted, alpha=other)
    # invalid slot j of row i (in position order) is shifted to `edge` if j < shift_i
    shifted.cumsum_(-1).le_(shift_R_1).sub_(valid_R_T).clamp_(min=0.0)
    filled.add_(shifted, alpha=edge - other)
    index = length - k if largest else k - 1
    if on_numpy(filled):  # numpy's introselect: ~10× torch.kthvalue
        array = filled.numpy()
        array.partition(index, axis=-1)
        at_R = torch.from_numpy(array[:, index].copy())
        if not with_next:
            return at_R
        tail = array[:, index + 1:]  # all ≥ the selected one after a partition
        return at_R, torch.from_numpy(tail.min(axis=-1)) if tail.shape[1] else at_R.clone()
    at_R = torch.kthvalue(filled, index + 1, dim=-1).values
    if not with_next:
        return at_R
    return at_R, torch.kthvalue(filled, index + 2, dim=-1).values if index + 1 < length else at_R.clone()


def lowest(values_R_T: Tensor, valid_R_T: Tensor, count_R: Tensor, work: Work | None = None) -> Tensor:
    """0/1 mask of each row's `count_R[i]` smallest valid entries (ties: earliest positions first), in work[0]."""
    return _select(values_R_T, valid_R_T, count_R, largest=False, work=work)


def highest(values_R_T: Tensor, valid_R_T: Tensor, count_R: Tensor, work: Work | None = None) -> Tensor:
    """0/1 mask of each row's `count_R[i]` largest valid entries (ties: earliest positions first), in work[0]."""
    return _select(values_R_T, valid_R_T, count_R, largest=True, work=work)


def _select(values_R_T: Tensor, valid_R_T: Tensor, count_R: Tensor, *, largest: bool, work: Work | None) -> Tensor:
    work = work if work is not None else scratch(values_R_T)
    threshold_R_1 = kth(values_R_T, valid_R_T, count_R, largest=largest, work=work)[:, None]
    strict, equal = work
    (torch.gt if largest else torch.lt)(values_R_T, threshold_R_1, out=strict).mul_(valid_R_T)
    torch.eq(values_R_T, threshold_R_1, out=equal).mul_(valid_R_T)
    dtype = values_R_T.dtype
    need_R_1 = count_R.to(dtype)[:, None] - strict.sum(-1, keepdim=True)
    if bool((equal.sum(-1, keepdim=True) > need_R_1).any()):  # more ties than places somewhere: earliest first
        equal.mul_(torch.cumsum(equal, -1).le_(need_R_1))
    return strict.add_(equal).mul_((count_R > 0).to(dtype)[:, None])
