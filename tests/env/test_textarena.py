"""env=textarena (rlvr/env/textarena.py) with the real library: games played end to end, seeded replay that
concurrent episodes do not disturb, forks, and the games that cannot run here refused at construction naming why."""

import asyncio
import random

import pytest
from openai_compatible_server import conf_values

from rlvr.env.guarded import GuardedEnvironment
from rlvr.types import Example

pytest.importorskip("textarena")  # in the envs and dev extras (pip install -e ".[dev]")

from rlvr.env.textarena import TextArenaEnvironment, nltk_words_present  # noqa: E402

NOTHING = Example("", "")


def arena(**overrides) -> TextArenaEnvironment:
    return TextArenaEnvironment(**conf_values("env/textarena", **overrides))


async def bisect(env, seed: int) -> list:
    """GuessTheNumber-v0 (1..20) by bisection on the game's "higher"/"lower" messages: the transcript."""
    episode = env.episode(NOTHING, seed)
    transcript, low, high = [await episode.reset()], 1, 20
    while True:
        guess = (low + high) // 2
        step = await episode.step(str(guess))  # sent as [guess]: bracket_actions
        transcript.append((guess, step))
        if step.done:
            await episode.close()
            return transcript
        low, high = (guess + 1, high) if "higher" in step.observation else (low, guess - 1)


def test_guess_the_number_played_end_to_end():
    env = GuardedEnvironment(arena())
    transcript = asyncio.run(bisect(env, seed=3))
    assert transcript[0].startswith("You are Player 0. You are playing Guess The Number.")
    guesses = [guess for guess, _ in transcript[1:]]
    steps = [step for _, step in transcript[1:]]
    assert [s.observation for s in steps[:-1]] == ["The target number is lower.", "The target number is higher.",
                                                   "The target number is higher."]
    assert guesses == [10, 5, 7, 8] and steps[-1].done and steps[-1].reward == 1.0
    assert steps[-1].info == {"reason": "Congratulations! You guessed the correct number.", "invalid_move": False}
    assert env.failures.errors == env.failures.timeouts == 0


def test_tower_of_hanoi_solved_by_the_seven_moves():
    env = arena(game="TowerOfHanoi-v0")

    async def run():
        episode = env.episode(NOTHING, 0)
        first, steps = await episode.reset(), []
        for move in ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]:
            steps.append(await episode.step(move))
        return first, steps

    first, steps = asyncio.run(run())
    assert "Tower of Hanoi with 3 disks" in first and "A: [3, 2, 1]" in first
    assert steps[0].observation.startswith("You moved disk 1 from A to C.\nCurrent Board:")
    assert [s.done for s in steps] == [False] * 6 + [True] and steps[-1].reward == 1.0
    assert [s.reward for s in steps[:-1]] == [0.0] * 6  # the game scores once, when it ends


def test_the_same_seed_replays_the_same_game_whatever_runs_beside_it():
    env = arena(game="Mastermind-v0")
    guesses = ["[1 2 3 4]", "[2 3 4 5]", "[3 4 5 6]"]

    async def play(seed):
        episode = env.episode(NOTHING, seed)
        out = [await episode.reset()]
        for guess in guesses:
            out.append((await episode.step(guess)).observation)
            random.random()  # the process's own draws do not reach the game
        return out

    async def concurrently(seeds):
        return await asyncio.gather(*(play(s) for s in seeds))

    alone = [asyncio.run(play(seed)) for seed in (1, 2, 3)]
    together = asyncio.run(concurrently([1, 2, 3, 1]))
    assert together == [*alone, alone[0]] and alone[0] != alone[1]


def test_a_game_leaves_the_global_random_state_as_it_found_it():
    env = arena(game="Minesweeper-v0")
    state = random.getstate()

    async def run():
        episode = env.episode(NOTHING, 7)
        await episode.reset()
        return await episode.step("[3 3]")  # Minesweeper places its mines at the first reveal

    asyncio.run(run())
    assert random.getstate() == state


def test_a_fork_is_an_independent_copy():
    env = arena()

    async def run():
        episode = env.episode(NOTHING, 3)  # the secret is 8 (test_guess_the_number_played_end_to_end)
        await episode.reset()
        await episode.step("10")
        copy = episode.fork()
        right = await copy.step("8")
        wrong = await episode.step("9")
        return right, wrong

    right, wrong = asyncio.run(run())
    assert right.done and right.reward == 1.0
    assert not wrong.done and wrong.observation == "The target number is lower."


@pytest.mark.parametrize("game,why", [
    ("GuessTheNumbr-v0", "not a TextArena game id (close: ['GuessTheNumber-v0'"),
    ("TwentyQuestions-v0", "asks a remote model through OpenRouter every turn: it needs $OPENROUTER_API_KEY"),
    ("GuessWho-v0", "asks a remote model through OpenRouter every turn"),
    ("TicTacToe-v0", "cannot start for one player here (AssertionError: The number of players has to be 2"),
    ("Klondike-v0", "cannot start for one player here (SyntaxError"),
])
def test_games_that_cannot_run_here_are_refused_naming_the_game_and_why(game, why, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ValueError) as err:
        arena(game=game)
    assert str(err.value).startswith(f"env.game={game}: TextArena's {game} cannot be played: ")
    assert why in str(err.value)


@pytest.mark.parametrize("game", ["Hangman-v0", "Wordle-v0", "WordLadder-v0", "WordSearch-v0"])
def test_word_list_games_are_refused_without_the_corpus_and_without_downloading_it(game):
    if nltk_words_present():
        pytest.skip("nltk's words corpus is on this machine: the word games can run")
    with pytest.raises(ValueError, match=f"env.game={game}: .* reads nltk's 'words' corpus, which is not on this "):
        arena(game=game)
    import sys

    assert f"textarena.envs.{game.split('-')[0]}.env" not in sys.modules  # its import would download the corpus


def test_needs_name_the_extra():
    needs = TextArenaEnvironment.needs(conf_values("env/textarena"))
    assert "fork" in needs.provides
    (package,) = needs.machine
    assert package.module == "textarena" and package.at_start and 'pip install -e ".[envs]"' in package.install


def test_a_game_that_hangs_costs_its_episode_and_the_others_play_on():
    import threading

    release = threading.Event()
    env = GuardedEnvironment(arena(step_timeout_s=0.3))

    async def run():
        stuck = env.episode(NOTHING, 3)
        await stuck.reset()
        stuck.inner.game.step = lambda action: release.wait(3600)  # hangs holding Python's global random state
        hung = await stuck.step("10")
        return hung, await bisect(env, seed=3)

    hung, transcript = asyncio.run(run())
    release.set()
    assert hung.info == {"error": "step took more than env.step_timeout_s=0.3 s", "timeout": True}
    assert transcript[-1][1].reward == 1.0  # the next game took a fresh lock
    assert (env.failures.episodes, env.failures.timeouts, env.failures.errors) == (2, 1, 0)
