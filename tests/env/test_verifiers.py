"""env=verifiers (rlvr/env/verifiers.py) with the real library (verifiers 0.4.0): tests/env/verifiers_game.py, a
"guess my digit, then confirm it" environment written with verifiers' own API (Taskset, Task with `@vf.reward`, an
Env driving a seat's interaction), played end to end by a scripted policy, through the guard, concurrently, and
by rlvr's own rollout loop (a new event loop per call) with the tiny model; failures end the episode, not the run."""

import asyncio
import contextlib

import pytest
from openai_compatible_server import conf_values

from rlvr.env.guarded import GuardedEnvironment
from rlvr.types import Example

pytest.importorskip("verifiers")  # in the envs and dev extras (pip install -e ".[dev]")

from rlvr.env.verifiers import ROUTES, VerifiersEnvironment  # noqa: E402

GAME = "tests.env.verifiers_game"
NOTHING = Example("", "")
PROMPT = "Answer with one digit.\nGuess my digit (0-9)."  # the system prompt, then the task's prompt


@contextlib.contextmanager
def environment(**overrides):
    env = VerifiersEnvironment(**conf_values("env/verifiers", environment=GAME, **overrides))
    try:
        yield env
    finally:
        env.shutdown()


@pytest.fixture(scope="module")
def game():
    with environment() as env:
        yield env


async def play(env, seed: int, actions: list[str]) -> list:
    """reset, then the scripted actions until done: [first observation, Step, Step, ...]."""
    episode = env.episode(NOTHING, seed)
    transcript = [await episode.reset()]
    try:
        for action in actions:
            transcript.append(await episode.step(action))
            if transcript[-1].done:
                break
    finally:
        await episode.close()
    return transcript


def test_guess_then_confirm_played_end_to_end_through_the_guard(game):
    guarded = GuardedEnvironment(game)
    right = asyncio.run(play(guarded, 0, ["1", "1"]))  # task 0: the secret is 1
    wrong = asyncio.run(play(guarded, 1, ["5", "4"]))  # task 1: the secret is 4; wrong, then confirmed
    assert right[0] == wrong[0] == PROMPT
    assert right[1].observation == "\nRight. Say the digit again to confirm.\n"  # through env.observation
    assert wrong[1].observation == "\nNo, it is 4. Say the digit again to confirm.\n"
    assert [(s.reward, s.done) for s in right[1:]] == [(0.0, False), (1.0, True)]  # the rubric's score, at the end
    assert [(s.reward, s.done) for s in wrong[1:]] == [(0.0, False), (1.0, True)]
    assert right[2].observation is None
    assert right[2].info == {"rewards": {"correct": 1.0}, "stop": ["user_closed"], "turns": 2}
    assert guarded.failures.episodes == 2 and guarded.failures.errors == guarded.failures.timeouts == 0
    assert not ROUTES  # closed episodes leave nothing behind


def test_a_wrong_confirmation_scores_0_and_seeds_pick_tasks_modulo_their_count(game):
    assert len(game.tasks) == 4
    last = asyncio.run(play(game, 4 + 1, ["4", "7"]))[-1]  # seed 5 plays task 1 again
    assert last.done and last.reward == 0.0 and last.info["rewards"] == {"correct": 0.0}


def test_concurrent_episodes_each_get_their_own_conversation(game):
    async def together():
        return await asyncio.gather(*(play(game, seed, [str(seed), str((3 * seed + 1) % 10)]) for seed in range(4)))

    for seed, transcript in enumerate(asyncio.run(together())):
        secret = (3 * seed + 1) % 10
        verdict = "Right." if seed == secret else f"No, it is {secret}."
        assert transcript[1].observation.startswith(f"\n{verdict}")
        assert transcript[2].reward == 1.0


def test_single_agent_pairing_plays_the_taskset_in_one_turn():
    with environment(settings={"id": "single_agent"}) as env:
        right, wrong = asyncio.run(play(env, 1, ["4"])), asyncio.run(play(env, 1, ["3"]))
    assert right[0] == PROMPT
    assert (right[1].observation, right[1].reward, right[1].done) == (None, 1.0, True)
    assert (wrong[1].reward, wrong[1].done) == (0.0, True)


def test_an_episode_closed_midway_is_cancelled_and_the_next_plays_on(game):
    async def truncated():
        episode = game.episode(NOTHING, 2)
        await episode.reset()
        await episode.step("0")  # the rollout loop truncates it here (max_turns, context) and closes it
        await episode.close()

    asyncio.run(truncated())
    assert not ROUTES
    assert asyncio.run(play(game, 2, ["7", "7"]))[-1].reward == 1.0


def test_an_environment_that_raises_ends_its_episode_as_an_error():
    with environment(settings={"taskset": {"broken": True}}) as env:
        guarded = GuardedEnvironment(env)
        transcript = asyncio.run(play(guarded, 0, ["1", "1"]))
    assert transcript[1].done and transcript[1].reward == 0.0
    assert "the verifiers episode failed" in transcript[1].info["error"]
    assert "broken on purpose" in transcript[1].info["error"]
    assert (guarded.failures.errors, guarded.failures.timeouts) == (1, 0)


def test_an_environment_that_hangs_times_out_and_is_cancelled():
    with environment(settings={"taskset": {"stall_s": 3600}}, step_timeout_s=0.5) as env:
        guarded = GuardedEnvironment(env)
        transcript = asyncio.run(play(guarded, 0, ["1", "1"]))
        assert not ROUTES  # close cancelled the verifiers episode
    assert transcript[1].info == {"error": "step took more than env.step_timeout_s=0.5 s", "timeout": True}
    assert (guarded.failures.errors, guarded.failures.timeouts) == (0, 1)


def test_played_by_rlvrs_rollout_loop_with_the_tiny_model():
    """rlvr/rollout/episodes.py's `play` (a fresh event loop per call, as every training step) with texts model=tiny
    reads."""
    from rlvr.engine.pytorch import PyTorchEngine
    from rlvr.model.tiny import TinyLlama
    from rlvr.rollout.episodes import play as play_batch
    from rlvr.types import SamplingParams

    model, tok = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None).load(0)
    engine = PyTorchEngine(model, [tok.eos_token_id], tok.pad_token_id, 256, merge_lora=False)
    texts = {"prompt": "=", "system": None, "right": "+", "wrong": "="}
    with environment(settings={"taskset": texts}, observation="{text}", max_context_tokens=64) as env:
        guarded = GuardedEnvironment(env)
        sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=2)
        for step in range(2):
            played = play_batch(engine, tok, guarded, [NOTHING, NOTHING], 3, sampling, seeds=[0, 1],
                                sample_seeds=[step, step + 100])
            assert played.turns_PG.tolist() == [2] * 6 and not played.failed_PG.any()
            for row, transcript in enumerate(played.transcripts):
                secret = str((3 * (row // 3) + 1) % 10)
                guess, confirm = transcript[1]["text"], transcript[3]["text"]
                assert transcript[0] == {"role": "env", "text": "="}
                assert transcript[2] == {"role": "env", "text": "+" if guess.strip() == secret else "="}
                assert float(played.rewards_P_G.view(-1)[row]) == float(confirm.strip() == secret)
    assert guarded.failures.errors == guarded.failures.timeouts == 0


@pytest.mark.parametrize("overrides,message", [
    ({"environment": "tests.env.no_such_game"}, "env.environment='tests.env.no_such_game' cannot be imported"),
    ({"environment": "no_such_verifiers_env"}, "verifiers cannot build it: ModuleNotFoundError: taskset "),
    ({"settings": {"taskset": {"no_such_knob": 1}}}, "verifiers cannot build it: ValidationError"),
    ({"observation": "\n"}, "env.observation='\\n' must hold {text}"),
    ({"observation": "{text} {turn}"}, "env.observation='{text} {turn}' must hold {text} (where"),
    ({"num_tasks": 0}, "env.num_tasks=0 must be >= 1"),
    ({"max_turns": 0}, "env.max_turns=0"),
])
def test_configuration_mistakes_are_refused_when_built(overrides, message):
    with pytest.raises(ValueError) as err:
        VerifiersEnvironment(**conf_values("env/verifiers", **{"environment": GAME, **overrides}))
    assert message in str(err.value)


def test_needs_name_the_extra_and_episodes_do_not_fork(game):
    needs = VerifiersEnvironment.needs(conf_values("env/verifiers", environment=GAME))
    assert "fork" not in needs.provides
    (package,) = needs.machine
    assert package.module == "verifiers" and package.at_start and 'pip install -e ".[envs]"' in package.install
    with pytest.raises(NotImplementedError):
        game.episode(NOTHING, 0).fork()
