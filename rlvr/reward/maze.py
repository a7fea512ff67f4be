"""`maze`: the verifier of the maze task (rlvr/data/maze.py), which replays the moves.

Rule: walk from START, one cell per `UP`/`DOWN`/`LEFT`/`RIGHT` token of the completion (tokens are separated by
whitespace). Reward 1.0 the moment the walk stands on GOAL: the walker has arrived, and what follows is not read
(a `DONE` is expected there, and the warm-up teaches it, but a move after arriving does not undo the arrival).
Reward 0.0 when, before that, a move enters a wall (the outer wall too, so the walk never leaves the grid), a token
is not a move (`DONE` included: stopping short of GOAL), or the completion ends. Any path counts, not only the
shortest: the walk may turn back and revisit cells. A completion with no token at all is a parse failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.data.maze import MOVES, find, parse
from rlvr.protocols import Needs
from rlvr.reward.exact import check_pairs
from rlvr.types import Scores


def replay(completion: str, reference: str) -> float:
    """1.0 iff the completion's moves walk from START to GOAL of the maze `reference` without entering a wall."""
    rows = parse(reference)
    r, c = find(rows, "S")
    for token in completion.split():
        if token not in MOVES:
            return 0.0
        dr, dc = MOVES[token]
        r, c = r + dr, c + dc
        if rows[r][c] == "#":
            return 0.0
        if rows[r][c] == "G":
            return 1.0
    return 0.0


@dataclass(frozen=True)
class MazeReward:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        check_pairs(completions, references)
        return Scores([replay(comp, ref) for comp, ref in zip(completions, references)],
                      parse_failures=sum(not comp.split() for comp in completions))
