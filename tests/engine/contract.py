"""The Rollouts contract every engine keeps (rlvr/engine/pytorch.py's docstring), checked on real output."""

from __future__ import annotations

import torch

from rlvr.types import Rollouts


def check_rollouts(ro: Rollouts, rows: int, max_tokens: int, pad_id: int, eos_id: int) -> None:
    """Shapes and dtypes; each row's mask is a prefix, then pad_id; EOS is the last real token iff the row is
    finished, and nowhere before; an unfinished row used every token; log-probabilities are 0 on padding."""
    assert ro.tokens_PG_T.shape == ro.logprobs_PG_T.shape == ro.mask_PG_T.shape
    assert ro.tokens_PG_T.shape[0] == rows and ro.tokens_PG_T.shape[1] <= max_tokens
    assert ro.tokens_PG_T.dtype == torch.long and ro.logprobs_PG_T.dtype == torch.float32
    for tokens, mask, finished in zip(ro.tokens_PG_T.tolist(), ro.mask_PG_T.tolist(), ro.finished_PG.tolist()):
        n = sum(mask)
        assert mask == [True] * n + [False] * (len(mask) - n)  # a prefix, then padding
        assert all(t == pad_id for t in tokens[n:])
        assert (tokens[n - 1] == eos_id) == finished  # EOS is the last real token iff finished
        assert eos_id not in tokens[: n - 1]
        assert finished or n == max_tokens
    assert (ro.logprobs_PG_T[~ro.mask_PG_T] == 0).all()
    if ro.entropy_PG_T is not None:
        assert ro.entropy_PG_T.shape == ro.tokens_PG_T.shape and (ro.entropy_PG_T[~ro.mask_PG_T] == 0).all()
