from rlvr.reward.maze import MazeReward, replay

# The MaxRL paper's 7 × 7 example: START at (1, 1), GOAL at (5, 5); the only way there without doubling back is
# DOWN DOWN RIGHT RIGHT RIGHT RIGHT DOWN DOWN.
MAZE = "#######/#S#...#/#.#.###/#.....#/#.###.#/#.#..G#/#######"
SHORTEST = "DOWN DOWN RIGHT RIGHT RIGHT RIGHT DOWN DOWN"


def test_the_shortest_path_then_done_scores_one():
    assert replay(SHORTEST + " DONE", MAZE) == 1.0
    assert replay(SHORTEST, MAZE) == 1.0  # arriving is what counts; DONE is not required


def test_a_longer_path_scores_one():
    # a detour into the dead end at (5, 1) and back, and one up to (1, 3) and back
    detour = "DOWN DOWN DOWN DOWN UP UP RIGHT RIGHT UP UP DOWN DOWN RIGHT RIGHT DOWN DOWN DONE"
    assert replay(detour, MAZE) == 1.0


def test_entering_a_wall_scores_zero():
    # the paper's own printed output: RIGHT from START enters the wall at (1, 2)
    assert replay("RIGHT RIGHT RIGHT RIGHT DOWN DOWN DOWN DOWN DONE", MAZE) == 0.0
    assert replay("DOWN DOWN RIGHT RIGHT RIGHT RIGHT RIGHT DOWN DOWN DONE", MAZE) == 0.0  # into the east wall


def test_leaving_the_grid_scores_zero():
    # START next to the outer wall: UP from it leaves the cells; the outer wall stops it before the grid's edge
    assert replay("UP DOWN DOWN RIGHT RIGHT RIGHT RIGHT DOWN DOWN", MAZE) == 0.0
    assert replay("LEFT", "#####/#S.G#/#####") == 0.0


def test_stopping_short_or_saying_anything_else_scores_zero():
    assert replay("DOWN DOWN RIGHT RIGHT DONE RIGHT RIGHT DOWN DOWN", MAZE) == 0.0  # DONE early ends the walk
    assert replay("DOWN DOWN RIGHT RIGHT", MAZE) == 0.0  # the completion ends short of GOAL
    assert replay("DOWN WALL DOWN RIGHT RIGHT RIGHT RIGHT DOWN DOWN", MAZE) == 0.0  # not a move
    assert replay("", MAZE) == 0.0


def test_moves_after_arriving_are_not_read():
    assert replay(SHORTEST + " UP UP LEFT", MAZE) == 1.0


def test_scores_count_empty_completions_as_parse_failures():
    scores = MazeReward().score([SHORTEST + " DONE", "  ", "RIGHT DONE"], [MAZE] * 3)
    assert scores.values == [1.0, 0.0, 0.0] and scores.parse_failures == 1
