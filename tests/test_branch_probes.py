"""TL-GRPO's branch probes (rlvr/rollout/branch_probes.py) on the guess game, values worked out by hand, then played
end to end by the tiny model through `play` and the trainer."""

import asyncio
import math
from dataclasses import replace

import torch

from rlvr.env.guarded import GuardedEnvironment
from rlvr.env.guess import GuessEnvironment, GuessEpisode
from rlvr.rollout.branch_probes import Probed, probe
from rlvr.rollout.episodes import play
from rlvr.types import Branching, Example, SamplingParams

NAN = math.nan
# Secrets are drawn from [5, 8]; three guesses; feedback "+" (higher) / "=" (lower).
GAME = GuessEnvironment(low=5, high=8, max_turns=3, max_context_tokens=32, step_timeout_s=5.0, prompt="=",
                        higher="+", lower="=")
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=2)


def played(secret: int, actions: list[str], env=GAME, probe_it: bool = True) -> Probed:
    """An episode of the game played by `actions`, with the snapshot before each action that `play` keeps."""
    episode = env.episode(Example("", ""), 0)
    getattr(episode, "inner", episode).secret = secret

    async def go():
        await episode.reset()
        snapshots, rewards = [], []
        for action in actions:
            snapshots.append(episode.fork())
            step = await episode.step(action)
            rewards.append(step.reward)
            if step.done:
                break
        return snapshots, rewards

    snapshots, rewards = asyncio.run(go())
    return Probed(snapshots, [[] for _ in snapshots], actions[: len(rewards)], rewards, probe_it, seed=0)


def run_probe(episodes, branching, seed=0, engine=None, tokenizer=None):
    """The probes' values, episode r drawing from the sampling seed `seed + r`."""
    async def run(calls):
        return await asyncio.gather(*calls)

    turns = max(len(e.rewards) for e in episodes)
    seeded = [replace(e, seed=seed + r) for r, e in enumerate(episodes)]
    return asyncio.run(probe(engine, tokenizer, seeded, branching, turns, SAMPLING, run))


def test_action_space_values_of_the_primary_and_of_every_alternative():
    # Secret 7, the primary guesses 5 ("+"), 8 ("="), 7 (solved): turn rewards [0, 0, 1]. B = 4: the three
    # legal numbers other than the primary's, all of them (so their order is the only thing drawn). L = 1.
    #   k=0: v_0 = r_0 + r_1 = 0.   alternatives at s_0, then the primary's next action "8" replayed:
    #        6 → "+" then 8 → "=": 0;  7 → solved, nothing replayed: 1;  8 → "=" then 8 → "=": 0
    #   k=1: v_0 = r_1 + r_2 = 1.   at s_1 (one guess made), then "7": 5 → 0 + 1;  6 → 0 + 1;  7 → 1
    #   k=2: v_0 = r_2 = 1.         at s_2 (two made), nothing to replay: 5, 6, 8 → wrong on the last turn: 0
    values = run_probe([played(7, ["5", "8", "7"])], Branching("action_space", 4, 1))
    assert values.shape == (1, 3, 4)
    assert values[0, :, 0].tolist() == [0.0, 1.0, 1.0]
    assert [sorted(values[0, k, 1:].tolist()) for k in range(3)] == [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0],
                                                                     [0.0, 0.0, 0.0]]


def test_lookahead_zero_is_the_turns_own_reward_and_fewer_alternatives_are_drawn_at_random_by_the_seed():
    # L = 0: v_0 = r_k; B = 2: one of the three other legal numbers, a function of the seed
    episodes = [played(7, ["5", "7"])]
    values = run_probe(episodes, Branching("action_space", 2, 0), seed=3)
    assert values[0, :, 0].tolist() == [0.0, 1.0]
    # k=0: the alternative alone, no replay: 1 iff it is 7; k=1 likewise (5 is the primary's first guess, still legal)
    again = run_probe([played(7, ["5", "7"])], Branching("action_space", 2, 0), seed=3)
    assert torch.equal(values, again)
    drawn = {tuple(run_probe([played(7, ["5", "7"])], Branching("action_space", 2, 0), seed=s)[0, 0].tolist())
             for s in range(20)}
    assert drawn == {(0.0, 0.0), (0.0, 1.0)}  # alternatives 6 or 8 → 0, 7 → 1: the seed chooses


def test_an_invalid_primary_action_carries_its_own_value_only_and_unprobed_episodes_are_nan():
    # "x" is not a legal number: the game ends at once with reward 0 and no alternative is probed
    invalid = played(7, ["x"])
    truncated = played(7, ["5", "6"], probe_it=False)
    values = run_probe([invalid, truncated], Branching("action_space", 4, 2))
    assert values[0, 0].tolist()[0] == 0.0 and all(math.isnan(v) for v in values[0, 0, 1:].tolist())
    assert bool(values[1].isnan().all())


class BreakingEpisode(GuessEpisode):
    """The game, but a guess of 6 raises."""

    async def step(self, action):
        if action.strip() == "6":
            raise RuntimeError("broken")
        return await super().step(action)


class Breaks(GuessEnvironment):
    def episode(self, example, seed):
        return BreakingEpisode(self, self.secret(seed))


def test_a_probe_whose_environment_fails_is_worth_zero_and_the_failure_is_counted():
    # Secret 6 reached by the alternative 6 would be worth 1, but stepping 6 raises: 0.0, as the predecessor
    env = GuardedEnvironment(Breaks(**{k: getattr(GAME, k) for k in GAME.__dataclass_fields__}))
    episode = played(6, ["5", "7"], env=env)  # 5 → "+", 7 → "=": not over, both turns probed
    values = run_probe([episode], Branching("action_space", 4, 0))
    assert values[0].tolist() == [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]] and env.failures.errors == 2


class Scripted:
    """An engine whose every sample is the text `answers[i]` for the i-th context, n times."""

    def __init__(self, tokenizer, answer: str):
        self.tok, self.answer, self.calls = tokenizer, answer, []

    def sample(self, prompt_ids_P, group_size, params, seeds, with_entropy=False):
        from rlvr.types import Rollouts

        self.calls.append((prompt_ids_P, group_size, seeds))
        ids = self.tok.encode(self.answer, add_special_tokens=False)
        rows = len(prompt_ids_P) * group_size
        tokens = torch.tensor([ids] * rows)
        return Rollouts(prompt_ids_P=prompt_ids_P, group_size=group_size, tokens_PG_T=tokens,
                        logprobs_PG_T=torch.zeros(tokens.shape), mask_PG_T=torch.ones(tokens.shape, dtype=torch.bool),
                        finished_PG=torch.ones(rows, dtype=torch.bool), temperature=1.0)


def test_llm_alternatives_are_policy_samples_at_each_turns_own_context():
    from rlvr.model.tiny import TinyLlama

    _, tok = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None).load(0)
    episode = played(7, ["5", "8", "7"])
    episode = replace(episode, contexts=[[1], [1, 2], [1, 2, 3]])
    engine = Scripted(tok, "7")
    values = run_probe([episode], Branching("llm", 3, 0), seed=11, engine=engine, tokenizer=tok)
    # one engine call over the three turns' contexts, B − 1 = 2 samples each; "7" solves wherever it is tried
    assert [(c, n) for c, n, _ in engine.calls] == [([[1], [1, 2], [1, 2, 3]], 2)]
    assert values[0].tolist() == [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_play_probes_every_turn_of_the_tiny_models_games_reproducibly():
    from rlvr.backend.local import LocalBackend
    from rlvr.engine.pytorch import PyTorchEngine
    from rlvr.model.tiny import TinyLlama
    from rlvr.types import LoraSpec

    model, tok = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None).load(0)
    backend = LocalBackend(model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"]), 0, tok.pad_token_id, "cpu",
                           (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    engine = PyTorchEngine(backend.policy, [tok.eos_token_id], tok.pad_token_id, 256, merge_lora=False)
    env = GuardedEnvironment(GuessEnvironment(low=0, high=9, max_turns=3, max_context_tokens=32, step_timeout_s=5.0,
                                              prompt="=", higher="+", lower="="))
    examples = [Example("", "")] * 2
    for mode in ("action_space", "llm"):
        runs = [play(engine, tok, env, examples, 4, SAMPLING, seeds=[1, 2], sample_seeds=[5, 105],
                     branching=Branching(mode, 3, 1)) for _ in range(2)]
        a, b = (r.branch_rewards_PG_K_B for r in runs)
        assert a.shape == (8, int(runs[0].turns_PG.max()), 3) and torch.equal(a.nan_to_num(-9), b.nan_to_num(-9))
        turn_rewards = runs[0].turn_rewards_PG_K
        for r in range(8):
            n = int(runs[0].turns_PG[r])
            if runs[0].truncated_PG[r] or runs[0].failed_PG[r]:
                assert bool(a[r].isnan().all())
                continue
            for k in range(n):  # v_0 = r_k + r_{k+1} (lookahead 1)
                assert float(a[r, k, 0]) == float(turn_rewards[r, k: k + 2].nansum())
            assert bool(a[r, n:].isnan().all())
        # the primary episodes are those played without probes
        plain = play(engine, tok, env, examples, 4, SAMPLING, seeds=[1, 2], sample_seeds=[5, 105])
        assert torch.equal(plain.rollouts.tokens_PG_T, runs[0].rollouts.tokens_PG_T)
        assert plain.branch_rewards_PG_K_B is None and runs[0].probe_seconds > 0
