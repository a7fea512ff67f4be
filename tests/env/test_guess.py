"""env=guess (rlvr/env/guess.py): bisection solves every game within its turns, the secret is a function of the seed,
malformed actions end the game, forks are independent, and the defaults fit the tiny model's alphabet."""

import asyncio
from collections import Counter

import pytest
from omegaconf import OmegaConf
from openai_compatible_server import CONF_DIR, conf_values

from rlvr.env.guess import GuessEnvironment
from rlvr.types import Example, Step

NOTHING = Example("", "")  # the game reads no example


def game(**overrides) -> GuessEnvironment:
    return GuessEnvironment(**conf_values("env/guess", **overrides))


def bisection(env: GuessEnvironment, seed: int) -> tuple[list, list[Step]]:
    """Guess the middle of what the feedback leaves: (transcript, steps)."""
    async def run():
        episode = env.episode(NOTHING, seed)
        transcript, steps, low, high = [await episode.reset()], [], env.low, env.high
        while not steps or not steps[-1].done:
            guess = (low + high) // 2
            steps.append(await episode.step(str(guess)))
            transcript += [str(guess), steps[-1].observation]
            if steps[-1].observation == env.higher:
                low = guess + 1
            elif steps[-1].observation == env.lower:
                high = guess - 1
        return transcript, steps
    return asyncio.run(run())


def test_bisection_solves_every_secret_within_four_guesses():
    env = game(max_turns=4)  # ceil(log2(10)) = 4
    secrets = {}
    for seed in range(60):
        transcript, steps = bisection(env, seed)
        assert transcript[0] == "="
        assert steps[-1].reward == 1.0 and steps[-1].info["solved"] and steps[-1].observation is None
        assert [s.reward for s in steps[:-1]] == [0.0] * (len(steps) - 1)  # 1 on the solving turn only
        secrets[env.secret(seed)] = steps[-1].info["turns"]
    assert sorted(secrets) == list(range(10))  # 60 seeds reach every secret
    # bisection of 0..9 finds 4 at guess 1; 1, 7 at 2; 0, 2, 5, 8 at 3; 3, 6, 9 at 4
    assert secrets == {4: 1, 1: 2, 7: 2, 0: 3, 2: 3, 5: 3, 8: 3, 3: 4, 6: 4, 9: 4}


def test_the_default_three_guesses_let_bisection_solve_seven_secrets_of_ten():
    env = game()
    solved = {env.secret(seed): bisection(env, seed)[1][-1].info["solved"] for seed in range(60)}
    assert sum(solved.values()) == 7 and not solved[3] and not solved[6] and not solved[9]
    _, steps = bisection(env, next(s for s in range(60) if env.secret(s) == 9))
    assert steps == [Step("+", 0.0, False, {}), Step("+", 0.0, False, {}),
                     Step(None, 0.0, True, {"solved": False, "secret": 9, "turns": 3})]  # 4, 7, 8: out of guesses


def test_the_secret_is_a_function_of_the_seed_alone():
    env = game()
    assert [env.secret(s) for s in range(20)] == [game().secret(s) for s in range(20)]
    assert env.episode(Example("a", "b"), 5).secret == env.episode(NOTHING, 5).secret == env.secret(5)
    counts = Counter(env.secret(s) for s in range(2000))
    assert sorted(counts) == list(range(10)) and min(counts.values()) > 150  # about uniform (200 each)
    assert len({game(low=3, high=5).secret(s) for s in range(50)} - {3, 4, 5}) == 0


@pytest.mark.parametrize("action,invalid", [(" 5\n", False), ("05", False), ("x", True), ("", True), ("10", True),
                                            ("5+", True), ("-1", True), ("٥", True), ("9" * 5000, True)])
def test_an_action_that_is_not_a_number_in_range_ends_the_game(action, invalid):
    env = game()
    seed = next(s for s in range(60) if env.secret(s) == 7)

    async def run():
        episode = env.episode(NOTHING, seed)
        await episode.reset()
        return await episode.step(action)

    step = asyncio.run(run())
    if invalid:
        assert step == Step(None, 0.0, True, {"solved": False, "invalid_action": True, "secret": 7, "turns": 1})
    else:
        assert step == Step("+", 0.0, False, {})  # 5 < 7: higher


def test_a_fork_is_an_independent_copy():
    env = game()
    seed = next(s for s in range(60) if env.secret(s) == 2)

    async def run():
        episode = env.episode(NOTHING, seed)
        await episode.reset()
        first = await episode.step("5")
        copy = episode.fork()
        right = await copy.step("2")
        wrong = [await episode.step("1"), await episode.step("3")]
        return first, right, wrong, copy

    first, right, wrong, copy = asyncio.run(run())
    assert first == Step("=", 0.0, False, {})  # 5 > 2: lower
    assert right == Step(None, 1.0, True, {"solved": True, "secret": 2, "turns": 2})
    assert wrong == [Step("+", 0.0, False, {}), Step(None, 0.0, True, {"solved": False, "secret": 2, "turns": 3})]
    assert copy.turns == 2


def test_the_default_texts_fit_the_tiny_model_and_an_episode_fits_its_context():
    alphabet = set(OmegaConf.load(CONF_DIR / "model" / "tiny.yaml").alphabet)
    env = game()
    assert set(env.prompt + env.higher + env.lower) <= alphabet
    # prompt, then per guess a digit and EOS, with feedback between guesses: 1 + 3·2 + 2 = 9 tokens
    assert len(env.prompt) + env.max_turns * 2 + (env.max_turns - 1) * max(len(env.higher), len(env.lower)) == 9
    assert 9 <= env.max_context_tokens


def test_demonstrations_are_random_play_in_the_games_format():
    env = game()
    games = env.demonstrations(2000, seed=0)
    assert games[:3] == env.demonstrations(3, seed=0) and games[:50] != env.demonstrations(50, seed=1)
    for turns in games:
        assert turns[0] == "=" and len(turns) % 2 == 0 and len(turns) <= 2 * env.max_turns
        assert all(a.isdigit() and 0 <= int(a) <= 9 for a in turns[1::2])
        assert all(o in ("+", "=") for o in turns[2::2])
    # feedback ignored: a game is won iff it ends before its 3rd guess or its last guess is right;
    # uniform guesses solve 1 - 0.9^3 = 0.271 of games
    short = sum(len(t) < 2 * env.max_turns for t in games) / len(games)
    assert 0.1 < short < 0.25  # solved at guess 1 or 2: 1 - 0.9^2 = 0.19


@pytest.mark.parametrize("overrides,message", [
    ({"low": 5, "high": 4}, "env.low=5, env.high=4"),
    ({"max_turns": 0}, "env.max_turns=0"),
    ({"higher": "="}, "two different non-empty texts"),
    ({"prompt": ""}, "env.prompt=''"),
    ({"step_timeout_s": 0}, "env.step_timeout_s=0"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        game(**overrides)
