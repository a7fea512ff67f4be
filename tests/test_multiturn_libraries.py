"""Environment libraries played end to end through `rlvr.run.run` (issue 14 #9): a TextArena game with the tiny
model (its alphabet and positions widened so that it reads the game's English text), a reasoning-gym task through
env=retry, and an OpenEnv server on 127.0.0.1 whose episodes are stepped concurrently (#5), both by a 2-step run
and measured against the same steps sent one at a time."""

import asyncio
import json
import string
import time
from pathlib import Path

import pytest
from env.openenv_process import served
from hydra.utils import instantiate
from test_multiturn_engines import Scripted

from composing import FAST, compose_config
from rlvr.build import build_all
from rlvr.env.guarded import GuardedEnvironment
from rlvr.model.tiny import build_char_tokenizer
from rlvr.rollout.episodes import play
from rlvr.run import run
from rlvr.types import Example, SamplingParams

ENV_KEYS = {"env/turns_mean", "env/action_tokens", "env/observation_tokens", "env/truncated_frac", "env/error_frac",
            "env/timeout_frac", "env/turn_0_reward_mean", "env/step_time_s"}
SMALL = ["trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=4", "data.eval_size=4"]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_of(run_dir: Path) -> list[dict]:
    return [r for r in rows(run_dir) if "loss" in r]


def samples(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]


# ---- TextArena ---------------------------------------------------------------------------------------------------

ENGLISH = string.ascii_letters + string.digits + " \n.,:;!?'\"()[]+-=|_/*<>#%&@"
"""What TextArena's games write (no `$`, `{` or `}`: OmegaConf would read `${` as an interpolation)."""


def test_a_textarena_game_is_played_end_to_end(tmp_path):
    """GuessTheNumber-v0 (a 508-character prompt, 10 guesses of 1..20) by the untrained tiny model, one character a
    turn: a digit is a valid guess ("[7]", bracket_actions), anything else an invalid move, which the game answers
    and, the second time, ends with its partial score for the last guess; never an environment error. Partial
    scores make mixed groups, so steps train on the packed rows (~700 tokens each)."""
    pytest.importorskip("textarena")
    cfg = compose_config(FAST + SMALL + ["env=textarena", "env.game=GuessTheNumber-v0", "model.max_positions=1024",
                                         "env.max_context_tokens=1024", "trainer.sampling.max_tokens=1",
                                         "trainer.eval_max_tokens=1"])
    cfg.model.alphabet = ENGLISH
    summary = run(cfg, tmp_path)
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [0, 1] and summary["steps"] == 2
    for r in steps:
        assert ENV_KEYS <= r.keys() and r["env/error_frac"] == 0.0 and r["env/timeout_frac"] == 0.0
        assert r["env/turns_mean"] >= 1.0 and r["env/observation_tokens"] > r["env/action_tokens"] > 0
    assert any(not r["skipped"] and r["rl/nonzero_advantage_action_tokens"] > 0 for r in steps)
    evals = [r for r in rows(tmp_path) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2] and evals[0]["eval/examples"] == 4
    group = samples(tmp_path, 0)[0]
    first = group["transcripts"][0]
    assert first[0]["role"] == "env" and first[0]["text"].startswith("You are Player 0. You are playing Guess The")
    assert group["prompt"] == first[0]["text"]  # the model read the game's own text, every character in its alphabet
    assert all(set(t["text"]) <= set(ENGLISH) for t in first if t["role"] == "env")
    assert {t["role"] for episode in group["transcripts"] for t in episode} == {"env", "policy"}


# ---- reasoning-gym through env=retry -----------------------------------------------------------------------------

RETRY = ["data=reasoning_gym", "reward=reasoning_gym", "env=retry"]


def test_a_reasoning_gym_task_is_played_through_env_retry(tmp_path):
    pytest.importorskip("reasoning_gym")
    cfg = compose_config(FAST + SMALL + RETRY)
    # the composed environment judges with the task's own score_answer: wrong, then "=" and another try, then right
    components, _ = build_all(cfg)  # as the run builds them
    env, example = components.env, components.data.eval_examples()[0]
    answer = json.loads(example.reference)["answer"]

    async def wrong_then_right():
        episode = env.episode(example, 0)
        return await episode.reset(), await episode.step("x"), await episode.step(answer)

    first, wrong, right = asyncio.run(wrong_then_right())
    assert first == example.prompt and wrong.observation == "=" and not wrong.done and wrong.reward == 0.0
    assert right.done and right.reward == 1.0 and right.info["solved"]

    summary = run(cfg, tmp_path)
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [0, 1] and summary["steps"] == 2
    for r in steps:
        assert ENV_KEYS <= r.keys() and r["env/error_frac"] == 0.0 and r["env/timeout_frac"] == 0.0
        assert 1.0 <= r["env/turns_mean"] <= 3.0
    group = samples(tmp_path, 0)[0]
    assert json.loads(group["reference"])["task"] == "basic_arithmetic" and group["prompt"].endswith(" =")
    for transcript in group["transcripts"]:  # every wrong answer but the last turn's is told "=", nothing else
        assert [t["text"] for t in transcript[2::2]] == ["="] * len(transcript[2::2])


# ---- OpenEnv, served ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory):
    """`python -m tests.env.openenv_server PORT` (tests/env/openenv_game.py's Game, at most 32 sessions): its URL."""
    pytest.importorskip("openenv")
    with served(tmp_path_factory.mktemp("openenv")) as url:
        yield url


STEP_S = 0.2
OPENENV = ["env=openenv", "env.step_timeout_s=10"]


def test_a_server_steps_the_episodes_of_a_turn_concurrently(openenv_server):
    """8 sessions whose step sleeps STEP_S on the server (the Game's "sleep:S" directive): ~STEP_S for the turn in
    play(), ~8·STEP_S sent one at a time."""
    cfg = compose_config(OPENENV + [f"env.url={openenv_server}", "env.max_turns=1"])
    env = GuardedEnvironment(instantiate(cfg.env))
    tok = build_char_tokenizer(string.ascii_letters + string.digits + " :.")
    action = f"sleep:{STEP_S}"
    engine = Scripted(tok.encode(action, add_special_tokens=False), tok.eos_token_id, tok.pad_token_id)

    async def one_at_a_time() -> float:
        episodes = [env.episode(Example("", ""), seed) for seed in range(8)]
        await asyncio.gather(*(e.reset() for e in episodes))
        t0 = time.perf_counter()
        for e in episodes:
            await e.step(action)
        elapsed = time.perf_counter() - t0
        await asyncio.gather(*(e.close() for e in episodes))
        return elapsed

    sequential = asyncio.run(one_at_a_time())
    t0 = time.perf_counter()
    played = play(engine, tok, env, [Example("", "")] * 2, 4, SamplingParams(1.0, 1.0, 16), seeds=[0, 1],
                  sample_seeds=[0, 100])
    wall = time.perf_counter() - t0
    assert env.failures.take().fractions() == {"env/error_frac": 0.0, "env/timeout_frac": 0.0}
    assert played.turns_PG.tolist() == [1] * 8 and played.truncated_PG.all()  # "higher", out of turns
    print(f"openenv server, 8 steps of {STEP_S} s: one at a time {sequential:.2f} s, in play() the turn's env time "
          f"(reset + step) {played.env_seconds:.2f} s, wall {wall:.2f} s")
    assert sequential >= 8 * STEP_S
    assert played.env_seconds < sequential / 2


def test_an_openenv_server_is_played_end_to_end(openenv_server, tmp_path):
    """The tiny model's digits are the Game's guesses (0..9, four of them); its ~44-character prompt needs more than
    the tiny preset's 32 positions."""
    summary = run(compose_config(FAST + SMALL + OPENENV + [f"env.url={openenv_server}", "env.max_turns=4",
                                                           "model.max_positions=128", "env.max_context_tokens=128",
                                                           "trainer.sampling.max_tokens=2"]), tmp_path)
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [0, 1] and summary["steps"] == 2
    for r in steps:
        assert ENV_KEYS <= r.keys() and r["env/error_frac"] == 0.0 and r["env/timeout_frac"] == 0.0
    transcript = samples(tmp_path, 0)[0]["transcripts"][0]
    assert transcript[0]["text"].startswith("guess a number from 0 to 9 (seeded game ")
    assert {t["text"] for t in transcript[2::2]} <= {"higher", "lower"}
