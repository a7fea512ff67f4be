import random

import pytest

from rlvr.data.maze import VOCABULARY, Maze, prim, prompt, shortest_path
from rlvr.errors import ConfigError
from rlvr.reward.maze import replay


def task(seed=0, **kw):
    args = dict(seed=seed, size=9, placement="corners", held_out=32, demos=16, split_seed=0) | kw
    return Maze(**args)


def cells_and_openings(grid):
    """Cells (odd coordinates) and opened walls between two cells: a spanning tree has cells = openings + 1."""
    size = len(grid)
    cells = {(r, c) for r in range(1, size, 2) for c in range(1, size, 2) if grid[r][c] != "#"}
    openings = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)
                if (r + c) % 2 == 1 and grid[r][c] != "#"]
    return cells, openings


@pytest.mark.parametrize("size", [5, 7, 17])
def test_prim_makes_a_perfect_maze(size):
    for s in range(20):
        grid = prim(size, random.Random(s))
        cells, openings = cells_and_openings(grid)
        n = (size - 1) // 2
        assert len(cells) == n * n  # every cell open
        assert len(openings) == len(cells) - 1  # a tree's edge count …
        seen, todo = {(1, 1)}, [(1, 1)]  # … and connected: so no cycle
        while todo:
            r, c = todo.pop()
            for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                if grid[r + dr][c + dc] != "#" and (r + 2 * dr, c + 2 * dc) not in seen:
                    seen.add((r + 2 * dr, c + 2 * dc))
                    todo.append((r + 2 * dr, c + 2 * dc))
        assert seen == cells
        assert all(grid[0][c] == grid[-1][c] == "#" for c in range(size))  # the outer wall
        assert all(grid[r][0] == grid[r][-1] == "#" for r in range(size))
        assert all(grid[r][c] == "#" for r in range(0, size, 2) for c in range(0, size, 2))  # wall corners


def test_seeds_reproduce_and_every_step_draws_new_mazes():
    assert task(seed=0).batch(3, 4) == task(seed=0).batch(3, 4)
    assert task(seed=0).batch(3, 4) != task(seed=1).batch(3, 4)
    train = {e.reference for step in range(50) for e in task().batch(step, 8)}
    assert len(train) > 390  # 400 draws from ~10^5 corner mazes of side 9: a handful of chance repeats at most
    assert task().batch(3, 8)[:4] == task().batch(3, 4)  # a step's mazes do not depend on the batch size


def test_held_out_is_fixed_distinct_and_never_trained_on_nor_demonstrated():
    t0, t1 = task(seed=0), task(seed=1, size=5, placement="random", held_out=40)
    held = {e.reference for e in t0.eval_examples()}
    assert held == {e.reference for e in task(seed=7).eval_examples()} and len(held) == 32
    small = {e.reference for e in t1.eval_examples()}
    assert len(small) == 40
    # side 5 with random placement has 4 trees × 12 placements = 48 mazes: 40 held out leaves 8, so training
    # and the warm-up redraw most draws; none of them is held out
    train = {e.reference for step in range(20) for e in t1.batch(step, 8)}
    demos = {d.prompt for d in Maze(1, 5, "random", 40, 50, 0).demonstrations()}
    assert not train & small and len(train) <= 8
    assert not demos & {prompt(m) for m in small}
    assert not {e.reference for step in range(50) for e in t0.batch(step, 8)} & held


def test_too_few_distinct_mazes_for_the_held_out_set_is_a_config_error():
    with pytest.raises(ConfigError, match="data.held_out=256.*only 4 distinct"):
        task(size=5, held_out=256).eval_examples()  # corners at side 5: the 4 spanning trees of 2 × 2 cells


@pytest.mark.parametrize("bad, key", [(dict(size=8), "data.size=8"), (dict(size=3), "data.size=3"),
                                      (dict(placement="edges"), "data.placement"), (dict(held_out=0), "held_out")])
def test_bad_settings_name_the_key(bad, key):
    with pytest.raises(ConfigError, match=key):
        task(**bad)


def test_prompt_is_the_papers_token_layout():
    maze = "#######/#S#...#/#.#.###/#.....#/#.###.#/#.#..G#/#######"  # the paper's 7 × 7 example
    words = prompt(maze).split()
    assert words[0] == "GRID_START" and words[-2:] == ["GRID_END", "PATH_START"]
    assert len(words) == 1 + 7 * 8 + 2 and words.count("NEWLINE") == 7
    assert words[1:9] == ["WALL"] * 7 + ["NEWLINE"] and words[9:12] == ["WALL", "START", "WALL"]
    assert set(words) <= set(VOCABULARY)


def test_demonstrations_are_shortest_paths_the_verifier_accepts():
    for d in task(placement="random").demonstrations():
        *moves, done = d.completion.split()
        assert done == "DONE"
        ref = _grid(d.prompt)
        assert prompt(ref) == d.prompt
        assert replay(d.completion, ref) == 1.0
        assert replay(" ".join(moves[:-1]), ref) == 0.0  # one move short does not arrive
    # in the example maze the shortest way is 8 moves (a perfect maze has one way without doubling back)
    example = "#######/#S#...#/#.#.###/#.....#/#.###.#/#.#..G#/#######"
    assert shortest_path(example) == ["DOWN", "DOWN", "RIGHT", "RIGHT", "RIGHT", "RIGHT", "DOWN", "DOWN"]


def _grid(prompt_text):
    """The reference of a prompt (its tokens back to characters)."""
    chars = {"WALL": "#", "PATH": ".", "START": "S", "GOAL": "G"}
    rows = " ".join(prompt_text.split()[1:-2]).split(" NEWLINE")
    return "/".join("".join(chars[w] for w in row.split()) for row in rows if row.strip())
