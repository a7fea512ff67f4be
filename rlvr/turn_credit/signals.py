"""What a turn-credit option reads (`TurnSignals`), the shape checks every option runs first, and the one
operation they share: spreading one value per turn onto that turn's action tokens.

Layout. Rows are prompt-major (row p·G + g is episode g of prompt p); each row is one episode's tokens,
right-padded to T. `actions_PG_T` marks the tokens the policy sampled; `turn_PG_T` gives each of them its turn
index k = 0, 1, …; on every other token (prompt, observation, padding) `turn_PG_T` is never read, so it may
hold −1 (as rlvr/rollout/episodes.py writes) or anything else. An episode that took n = `turns_PG[r]` actions has
turns 0 … n−1; per-turn tensors have K ≥ max n columns and are read at k < n only (NaN beyond, by
convention). A turn whose action has no token (an empty completion) exists, gets its value, and spreads it
onto nothing.

Checks fail before any arithmetic, naming the tensor and the numbers: every action token's turn must lie in
[0, turns_PG[r]), so a row whose indices and turn count disagree is caught rather than credited wrongly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from torch import Tensor

    from rlvr.types import TurnSignals

torch = lazy_import("torch")


def check_turns(adv_P_G: Tensor, rewards_P_G: Tensor, turns: TurnSignals) -> None:
    """The shapes of the episode tensors against the rows, and every action token's turn against its row's
    turn count."""
    actions, turn = turns.actions_PG_T, turns.turn_PG_T
    if actions.dim() != 2 or actions.dtype != torch.bool:
        raise ValueError(f"actions_PG_T must be bool [P·G, T], got {actions.dtype} {tuple(actions.shape)}")
    if tuple(turn.shape) != tuple(actions.shape) or turn.dtype.is_floating_point:
        raise ValueError(f"turn_PG_T must be integer {tuple(actions.shape)} like actions_PG_T, "
                         f"got {turn.dtype} {tuple(turn.shape)}")
    rows, G = actions.shape[0], turns.group_size
    if G < 1 or rows % G:
        raise ValueError(f"{rows} rows are not divisible by group_size={G}")
    for name, t in (("adv_P_G", adv_P_G), ("rewards_P_G", rewards_P_G)):
        if tuple(t.shape) != (rows // G, G):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({rows // G}, {G}) for {rows} rows")
    n = turns.turns_PG
    if tuple(n.shape) != (rows,) or n.dtype.is_floating_point or bool((n < 0).any()):
        raise ValueError(f"turns_PG must be {rows} integers >= 0, got {n.dtype} {tuple(n.shape)}")
    bad = actions & ((turn < 0) | (turn >= n[:, None]))
    if bool(bad.any()):
        r, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"row {r}: action token {j} has turn {int(turn[r, j])}, outside [0, {int(n[r])}) "
                         f"(turns_PG[{r}] = {int(n[r])})")


def per_turn(name: str, values: Tensor | None, turns: TurnSignals, option: str, dims: int = 2) -> Tensor:
    """`values` ([P·G, K] or [P·G, K, B]) checked against the rows and the turn counts."""
    rows = turns.actions_PG_T.shape[0]
    if values is None:
        raise ValueError(f"turn_credit={option} needs turns.{name}, but none was given")
    need_k = max(1, int(turns.turns_PG.max())) if rows else 1
    if values.dim() != dims or values.shape[0] != rows or values.shape[1] < need_k:
        raise ValueError(f"{name} has shape {tuple(values.shape)}, expected {dims} dims with {rows} rows and "
                         f"K >= {need_k} (the most turns an episode took)")
    if not values.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point (NaN marks absent values), got {values.dtype}")
    return values


def played_PG_K(turns: TurnSignals, K: int) -> Tensor:
    """bool [P·G, K]: turn k exists in row r (k < turns_PG[r])."""
    return torch.arange(K, device=turns.turns_PG.device)[None, :] < turns.turns_PG[:, None]


def spread(values_PG_K: Tensor, turns: TurnSignals) -> Tensor:
    """[P·G, T]: each action token gets its turn's value, every other token exactly 0. Values at turns a row
    did not play are never read."""
    K = values_PG_K.shape[1]
    index = turns.turn_PG_T.long().clamp(0, K - 1)  # off-action tokens read column 0, discarded below
    per_token = values_PG_K.gather(1, index)
    return torch.where(turns.actions_PG_T, per_token, torch.zeros((), dtype=values_PG_K.dtype))


def episode_tokens(adv_P_G: Tensor, turns: TurnSignals) -> Tensor:
    """[P·G, T]: each row's episode advantage on its action tokens, 0 elsewhere: `transform=none`'s
    broadcast with the action mask."""
    return adv_P_G.reshape(-1)[:, None] * turns.actions_PG_T
