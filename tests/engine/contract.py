"""The Rollouts contract every engine keeps (rlvr/engine/pytorch.py's docstring), checked on real output."""

from __future__ import annotations

import torch

from rlvr.types import Continued, Rollouts, SamplingParams, Segment


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


BUDGETS = (4, 8, 12)
"""Per row of `partial_segment`: the tokens it may sample in all."""


def partial_segment(prompts: list[list[int]], tokens: list[list[int]], need: int, forced: list[bool],
                    rows: tuple[int, ...] | list[int] = (0, 1, 2), top_p: float = 1.0) -> Segment:
    """Rows `rows` of `prompts` (each a group of one, seeded 11, 22, 33) continued from `tokens` (partial rollouts,
    `Engine.continue_rows`), row n allowed BUDGETS[n] tokens in all, sampled at temperature 1."""
    budgets = [BUDGETS[n] - len(tokens[n]) for n in rows]
    return Segment(contexts=[prompts[n] + tokens[n] for n in rows], budgets=budgets,
                   offsets=[len(tokens[n]) for n in rows], seeds=[(11, 22, 33)[n] for n in rows],
                   groups=list(range(len(rows))), quotas=[b if f else 0 for b, f in zip(budgets, forced, strict=True)],
                   need=need, params=SamplingParams(temperature=1.0, top_p=top_p, max_tokens=max(BUDGETS)))


PREFIXES = [[5, 6], [7], [3, 4, 5]]
"""Tokens so far of `partial_segment`'s rows, as an update might have cut them."""


def check_continued(policy, prompts: list[list[int]], prefixes: list[list[int]], rest: Continued, rows: list[int],
                    eos_id: int, tol: float) -> None:
    """Rows `rows`, cut after `prefixes` and continued to their ends by `rest`: each ends at its budget or an EOS,
    and every continued token's log-probability is the policy's given the prompt, the prefix and the tokens before
    it (the prefix prefilled under the engine's weights)."""
    from engine.parity import policy_logprobs

    assert all(rest.ended)
    for i, n in enumerate(rows):
        assert len(prefixes[n] + rest.tokens[i]) == BUDGETS[n] or rest.tokens[i][-1] == eos_id
        expected = policy_logprobs(policy, prompts[n] + prefixes[n], rest.tokens[i], 1.0)
        assert (expected - torch.tensor(rest.logprobs[i])).abs().max() < tol
