"""Multi-turn rows written as strings, one character a token: a digit k is an action token of turn k, `o` an
observation token, `.` padding. "00o1o2." is action 0 (two tokens), an observation, action 1, an
observation, action 2, padding."""

import math

import torch

from rlvr.types import TurnSignals

NAN = math.nan


def turn_signals(rows: list[str], group_size: int, turns: list[int] | None = None, **per_turn) -> TurnSignals:
    """`turns` defaults to each row's highest turn digit + 1; `per_turn` holds the optional tensors
    (turn_rewards_PG_K=…, as nested lists with NaN)."""
    assert len({len(r) for r in rows}) == 1, "rows must have one length"
    actions = torch.tensor([[c.isdigit() for c in r] for r in rows])
    turn = torch.tensor([[int(c) if c.isdigit() else -1 for c in r] for r in rows])
    if turns is None:
        turns = [max((int(c) + 1 for c in r if c.isdigit()), default=0) for r in rows]
    tensors = {k: torch.tensor(v, dtype=torch.float32) for k, v in per_turn.items()}
    return TurnSignals(actions_PG_T=actions, turn_PG_T=turn, turns_PG=torch.tensor(turns), group_size=group_size,
                       **tensors)


def expand(rows: list[str], per_turn_PG_K: list[list[float]]) -> torch.Tensor:
    """The expected [P·G, T]: each action token gets its row's value for its turn, every other token 0."""
    return torch.tensor([[per_turn_PG_K[i][int(c)] if c.isdigit() else 0.0 for c in r] for i, r in enumerate(rows)])


def off_action(rows: list[str]) -> torch.Tensor:
    """bool [P·G, T]: the observation and padding tokens."""
    return torch.tensor([[not c.isdigit() for c in r] for r in rows])
