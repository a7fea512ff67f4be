"""env=openenv (rlvr/env/openenv.py) with the real library: tests/env/openenv_game.py's Game in this process and served
by openenv-core on 127.0.0.1 give the same transcripts for the same seeds; a server that hangs, errs, sends a malformed
reward or drops the connection costs that episode; a server that is down fails the run's start checks."""

import asyncio
import json
from pathlib import Path

import pytest
from env.openenv_process import free_port, served
from openai_compatible_server import conf_values

from composing import compose_config
from rlvr.env.guarded import GuardedEnvironment
from rlvr.env.openenv import OpenEnvEnvironment, ServerAnswers
from rlvr.types import Example, Step

pytest.importorskip("openenv")  # in the envs and dev extras (pip install -e ".[dev]")

ROOT = Path(__file__).resolve().parents[2]
GAME = "tests.env.openenv_game.Game"
NOTHING = Example("", "")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m tests.env.openenv_server PORT`: its ws:// URL once GET /health answers."""
    with served(tmp_path_factory.mktemp("openenv")) as url:
        yield url


def openenv(**overrides) -> OpenEnvEnvironment:
    """conf/env/openenv.yaml's environment with `overrides`; one naming `environment` clears the default url."""
    in_process = {"url": None} if "environment" in overrides else {}
    return OpenEnvEnvironment(**conf_values("env/openenv", **{"step_timeout_s": 5.0} | in_process | overrides))


async def bisect(env, seed: int) -> list:
    """The game (0..9, four guesses) by bisection on its "higher"/"lower": [first, (guess, Step), ...]."""
    episode = env.episode(NOTHING, seed)
    transcript, low, high = [await episode.reset()], 0, 9
    try:
        while True:
            guess = (low + high) // 2
            step = await episode.step(str(guess))
            transcript.append((guess, step))
            if step.done:
                return transcript
            low, high = (guess + 1, high) if step.observation == "higher" else (low, guess - 1)
    finally:
        await episode.close()


async def every(env, seeds):
    return await asyncio.gather(*(bisect(env, seed) for seed in seeds))


def test_served_and_in_process_transcripts_are_equal_for_the_same_seeds(server):
    seeds = list(range(16))
    in_process = GuardedEnvironment(openenv(environment=GAME))
    served = GuardedEnvironment(openenv(url=server))
    mine = asyncio.run(every(in_process, seeds))  # 16 episodes at once, each on its own thread
    theirs = asyncio.run(every(served, seeds))  # 16 sessions at once
    assert mine == theirs
    assert mine[0][0] == "guess a number from 0 to 9 (seeded game 0)"
    assert all(t[-1][1].reward == 1.0 and t[-1][1].done and t[-1][1].observation is None for t in mine)
    assert {t[-1][0] for t in mine} == {__import__("random").Random(s).randint(0, 9) for s in seeds}
    assert len({len(t) for t in mine}) > 1  # secrets differ, so do the games
    assert in_process.failures.fractions() == served.failures.fractions() == {"env/error_frac": 0.0,
                                                                             "env/timeout_frac": 0.0}


async def first_step(env, action: str):
    episode = env.episode(NOTHING, 0)
    await episode.reset()
    step = await episode.step(action)
    await episode.close()
    return step, episode


@pytest.mark.parametrize("where", ["in_process", "served"])
@pytest.mark.parametrize("action,kind,message", [
    ("sleep:30", "timeout", "step took more than env.step_timeout_s=0.5 s"),
    ("raise", "error", "step raised RuntimeError: "),
    ("reward:nan", "error", "step returned reward=nan (expected a finite number within "
                            "±trainer.reward_max_abs=1000)"),
])
def test_a_game_that_hangs_raises_or_answers_nan_costs_its_episode(where, action, kind, message, request):
    env = GuardedEnvironment(openenv(step_timeout_s=0.5, **({"environment": GAME} if where == "in_process" else
                                                             {"url": request.getfixturevalue("server")})))
    step, episode = asyncio.run(first_step(env, action))
    if (where, action) == ("served", "reward:nan"):  # the server sends NaN as null (pydantic's JSON): reward 0
        assert step == Step("?", 0.0, False, {}) and episode.failure is None
        return
    assert step.done and step.reward == 0.0 and step.info["error"].startswith(message) and episode.failure == kind
    assert asyncio.run(bisect(env, 1))[-1][1].reward == 1.0  # the environment (and the server) play on
    assert (env.failures.episodes, env.failures.errors + env.failures.timeouts) == (2, 1)


def test_a_server_that_drops_the_connection_mid_episode_costs_that_episode():
    """A WebSocket server that answers `reset` as OpenEnv does, then closes the connection on the first step."""
    from websockets.asyncio.server import serve

    async def drop_after_reset(connection):
        message = json.loads(await connection.recv())
        assert message["type"] == "reset"
        await connection.send(json.dumps({"type": "observation", "data": {"observation": {"message": "go"},
                                                                            "reward": None, "done": False}}))
        await connection.recv()
        await connection.close(code=1011, reason="server going away")

    async def run():
        async with serve(drop_after_reset, "127.0.0.1", 0) as listening:
            port = listening.sockets[0].getsockname()[1]
            env = GuardedEnvironment(openenv(url=f"ws://127.0.0.1:{port}"))
            episode = env.episode(NOTHING, 0)
            first = await episode.reset()
            step = await episode.step("5")
            await episode.close()
            return env, first, step

    env, first, step = asyncio.run(run())
    assert first == "go" and step.done and step.reward == 0.0
    assert step.info["error"].startswith("step raised ConnectionClosedError: received 1011 (internal error) server "
                                         "going away")
    assert env.failures.errors == 1


def test_a_server_that_is_down_fails_the_runs_start_checks():
    from rlvr.config_check import start_errors

    url = f"ws://127.0.0.1:{free_port()}"  # nothing listens there
    found = ServerAnswers(url).check()
    assert found.status == "missing"
    assert found.detail.startswith(f"the OpenEnv server env.url={url} is not answering (GET http://127.0.0.1:")
    cfg = compose_config(["env=openenv", f"env.url={url}"])
    needs = OpenEnvEnvironment.needs(conf_values("env/openenv", url=url))
    assert all(r.at_start for r in needs.machine)
    assert start_errors(cfg, {"env": needs}) == [f"env <rlvr.env.openenv.OpenEnvEnvironment>: {found.detail}"]


def test_needs_name_the_extra_and_check_a_server_only_when_there_is_one():
    (package,) = OpenEnvEnvironment.needs(conf_values("env/openenv", environment=GAME, url=None)).machine
    assert package.module == "openenv" and package.at_start and 'pip install -e ".[envs]"' in package.install
    assert package.check().status == "ok" and "openenv-core 0.3" in package.check().detail
    served = OpenEnvEnvironment.needs(conf_values("env/openenv"))  # the default: a server on port 8000
    assert [type(r).__name__ for r in served.machine] == ["Package", "ServerAnswers"]
    assert served.machine[1].url == "ws://127.0.0.1:8000" and served.machine[1].at_start
    assert "fork" not in served.provides


def test_episodes_do_not_fork():
    episode = openenv(environment=GAME).episode(NOTHING, 0)
    with pytest.raises(NotImplementedError):
        episode.fork()


@pytest.mark.parametrize("overrides,message", [
    ({"url": None}, "set exactly one of env.environment"),
    ({"environment": GAME, "url": "ws://127.0.0.1:1"}, "set exactly one of env.environment"),
    ({"environment": "tests.env.openenv_game.Nope"}, "env.environment='tests.env.openenv_game.Nope' cannot be "
                                                     "imported"),
    ({"environment": "tests.env.openenv_game.GuessAction"}, "is not an openenv.core.Environment subclass"),
    ({"url": "127.0.0.1:8000"}, "must start with ws://"),
    ({"environment": GAME, "step_timeout_s": 0.0}, "env.step_timeout_s=0.0"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        openenv(**overrides)
