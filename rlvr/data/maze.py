"""The maze task of the MaxRL paper (arXiv 2602.02710, appendix "Maze"): find a way from START to GOAL.

A maze is an odd `size` × `size` grid: cells at odd (row, column), walls between them and all around. Prim's
algorithm (randomized, on the cells) opens the walls of a spanning tree, so every maze is perfect: every two cells
are joined by exactly one path that does not double back. START and GOAL: `placement=corners` puts them in the
top-left and bottom-right cells, as the paper's one example does; `placement=random` draws two distinct cells.

Prompts are the paper's tokens separated by spaces (one token each under model=maze's word-level tokenizer):
`GRID_START`, the rows of `WALL`/`PATH`/`START`/`GOAL` each ended by `NEWLINE`, `GRID_END`, `PATH_START`. A
completion is moves (`UP DOWN LEFT RIGHT`) then `DONE`; rlvr/reward/maze.py replays it. The reference is the grid
in one character a cell (`#` wall, `.` path, `S`, `G`), rows joined by `/`.

Seeds: every maze comes from its own generator, `random.Random("maze/<stream>/<seed>/<index>")` (str seeds hash
with SHA-512: the same on every machine and process). Training example i of step s is stream `train`, the run's data
seed, index `s/i`: every step draws new mazes whatever the batch size. The held-out set is the first `held_out`
distinct mazes of stream `held_out` under the fixed `split_seed` (the same for every run seed); the warm-up's
demonstrations are stream `demo` under `split_seed`. A training or demonstration maze equal to a held-out one is
redrawn (index `…/1`, `…/2`, …), so neither ever shows a held-out maze. Different training mazes can still
coincide by chance: docs/maze.md#how-often-a-training-maze-repeats gives the odds for each size.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from rlvr.errors import ConfigError
from rlvr.protocols import Needs
from rlvr.types import Demonstration, Example

GRID_TOKENS = {"#": "WALL", ".": "PATH", "S": "START", "G": "GOAL"}
"""A reference cell's character → its prompt token."""
MOVES = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}
DONE = "DONE"
VOCABULARY = ("GRID_START", "WALL", "PATH", "START", "GOAL", "NEWLINE", "GRID_END", "PATH_START", *MOVES, DONE)
"""The paper's symbolic tokens, in the order model=maze's tokenizer numbers them (after its specials)."""
PLACEMENTS = ("corners", "random")


def prim(size: int, rng: random.Random) -> list[list[str]]:
    """A perfect maze of side `size` (odd, ≥ 5) by randomized Prim's algorithm: from a random cell, repeatedly open
    the wall to an unvisited cell chosen uniformly among the walls between visited and unvisited cells. Rows of
    `#`/`.` characters."""
    n = (size - 1) // 2
    grid = [["#"] * size for _ in range(size)]
    first = (rng.randrange(n), rng.randrange(n))
    seen = {first}
    grid[2 * first[0] + 1][2 * first[1] + 1] = "."
    frontier = [(first, b) for b in _neighbours(first, n)]
    while frontier:
        i = rng.randrange(len(frontier))
        a, b = frontier[i]
        frontier[i] = frontier[-1]
        frontier.pop()
        if b in seen:
            continue
        seen.add(b)
        grid[2 * b[0] + 1][2 * b[1] + 1] = "."
        grid[a[0] + b[0] + 1][a[1] + b[1] + 1] = "."  # the wall between cells a and b
        frontier.extend((b, c) for c in _neighbours(b, n) if c not in seen)
    return grid


def _neighbours(cell: tuple[int, int], n: int) -> Iterator[tuple[int, int]]:
    r, c = cell
    for dr, dc in MOVES.values():
        if 0 <= r + dr < n and 0 <= c + dc < n:
            yield r + dr, c + dc


def parse(reference: str) -> list[str]:
    """The rows of a reference (`#.SG` characters, rows joined by `/`)."""
    return reference.split("/")


def find(rows: list[str], mark: str) -> tuple[int, int]:
    return next((r, row.index(mark)) for r, row in enumerate(rows) if mark in row)


def prompt(reference: str) -> str:
    """The paper's input: GRID_START, each row's cell tokens then NEWLINE, GRID_END, PATH_START."""
    rows = [" ".join(GRID_TOKENS[ch] for ch in row) + " NEWLINE" for row in parse(reference)]
    return " ".join(["GRID_START", *rows, "GRID_END", "PATH_START"])


def shortest_path(reference: str) -> list[str]:
    """The moves of a shortest way from START to GOAL (breadth-first search; in a perfect maze the only one)."""
    rows = parse(reference)
    start, goal = find(rows, "S"), find(rows, "G")
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here == goal:
            break
        for move, (dr, dc) in MOVES.items():
            there = (here[0] + dr, here[1] + dc)
            if rows[there[0]][there[1]] != "#" and there not in came:  # the outer wall keeps `there` on the grid
                came[there] = (here, move)
                queue.append(there)
    if goal not in came:
        raise ValueError(f"maze {reference!r}: GOAL cannot be reached from START")
    moves: list[str] = []
    step = came[goal]
    while step is not None:
        moves.append(step[1])
        step = came[step[0]]
    return moves[::-1]


@dataclass(frozen=True)
class Maze:
    seed: int
    """Training-stream seed (the run's data sub-seed; passed by the runner)."""
    size: int
    """Grid side, outer walls included: odd, ≥ 5 (the paper's table: 17, i.e. 8 × 8 cells)."""
    placement: str
    """`corners` (START top-left cell, GOAL bottom-right, as the paper's example) or `random` (two distinct cells)."""
    held_out: int
    """Distinct held-out mazes evaluated (the paper: 256)."""
    demos: int
    """Shortest-path demonstrations for the warm-up (the paper's SFT: 1,500 steps × 32)."""
    split_seed: int
    """Seeds the held-out and demonstration streams (not the run seed)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def __post_init__(self) -> None:
        if self.size < 5 or self.size % 2 == 0:
            raise ConfigError(f"data.size={self.size}: expected an odd grid side of at least 5 (cells at odd "
                              "coordinates, walls between them and around)")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"data.placement={self.placement!r}: expected one of {', '.join(PLACEMENTS)}")
        if self.held_out < 1:
            raise ConfigError(f"data.held_out={self.held_out}: expected at least 1 held-out maze")
        if self.demos < 0:
            raise ConfigError(f"data.demos={self.demos}: expected 0 or more")

    def generate(self, stream: str, seed: int, index: str) -> str:
        """The maze of one seeded generator, as a reference string (module docstring)."""
        rng = random.Random(f"maze/{stream}/{seed}/{index}")
        grid = prim(self.size, rng)
        last = self.size - 2
        if self.placement == "corners":
            start, goal = (1, 1), (last, last)
        else:
            cells = [(r, c) for r in range(1, self.size, 2) for c in range(1, self.size, 2)]
            start, goal = rng.sample(cells, 2)
        grid[start[0]][start[1]], grid[goal[0]][goal[1]] = "S", "G"
        return "/".join("".join(row) for row in grid)

    @cached_property
    def held_out_mazes(self) -> tuple[str, ...]:
        """The first `held_out` distinct mazes of the held-out stream."""
        found: dict[str, None] = {}
        for i in range(100 * self.held_out):
            found.setdefault(self.generate("held_out", self.split_seed, str(i)))
            if len(found) == self.held_out:
                return tuple(found)
        raise ConfigError(f"data.held_out={self.held_out}: {100 * self.held_out} draws of size {self.size} with "
                          f"placement={self.placement} gave only {len(found)} distinct mazes; choose a larger "
                          "data.size, placement=random or fewer held-out mazes")

    @cached_property
    def _held_out_set(self) -> frozenset[str]:
        return frozenset(self.held_out_mazes)

    def fresh(self, stream: str, seed: int, index: str) -> str:
        """The stream's maze at `index`, redrawn (`index/1`, `index/2`, …) while it equals a held-out maze."""
        maze, attempt = self.generate(stream, seed, index), 0
        while maze in self._held_out_set:
            attempt += 1
            maze = self.generate(stream, seed, f"{index}/{attempt}")
        return maze

    def batch(self, step: int, size: int) -> list[Example]:
        return [self.example(self.fresh("train", self.seed, f"{step}/{i}")) for i in range(size)]

    def eval_examples(self) -> list[Example]:
        return [self.example(m) for m in self.held_out_mazes]

    def demonstrations(self) -> list[Demonstration]:
        out = []
        for i in range(self.demos):
            maze = self.fresh("demo", self.split_seed, str(i))
            out.append(Demonstration(prompt=prompt(maze), completion=" ".join([*shortest_path(maze), DONE])))
        return out

    @staticmethod
    def example(maze: str) -> Example:
        return Example(prompt=prompt(maze), reference=maze)
