"""Rollouts from per-completion rows, for the engines that sample elsewhere (vLLM, a server, Tinker).

Row p·G + g is completion g of prompt p: its token ids and their log-probabilities. Tokens are
right-padded with `pad_id`, the mask is a prefix, log-probabilities are 0 on padding, and a row is
`finished` when its last token is one of `eos_ids` (the pytorch engine's contract).
"""

from __future__ import annotations

from collections.abc import Sequence

from rlvr.lazy import lazy_import
from rlvr.types import Rollouts

torch = lazy_import("torch")


def rollouts_from_rows(
    prompt_ids_P: list[list[int]],
    group_size: int,
    rows: Sequence[tuple[Sequence[int], Sequence[float]]],
    pad_id: int,
    eos_ids: Sequence[int],
    temperature: float,
) -> Rollouts:
    N, T = len(rows), max((len(ids) for ids, _ in rows), default=0)
    tokens = torch.full((N, T), pad_id, dtype=torch.long)
    logprobs = torch.zeros((N, T), dtype=torch.float32)
    mask = torch.zeros((N, T), dtype=torch.bool)
    finished = torch.zeros(N, dtype=torch.bool)
    for r, (ids, lps) in enumerate(rows):
        n = len(ids)
        if len(lps) != n:
            raise ValueError(f"row {r}: {n} tokens but {len(lps)} log-probabilities")
        tokens[r, :n] = torch.tensor(list(ids), dtype=torch.long)
        logprobs[r, :n] = torch.tensor(list(lps), dtype=torch.float32)
        mask[r, :n] = True
        finished[r] = n > 0 and ids[-1] in eos_ids
    return Rollouts(
        prompt_ids_P=prompt_ids_P, group_size=group_size, tokens_PG_T=tokens, logprobs_PG_T=logprobs,
        mask_PG_T=mask, finished_PG=finished, temperature=temperature,
    )
