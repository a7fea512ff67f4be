"""Multi-turn episodes (rlvr/rollout/episodes.py): token in, token out; observation tokens are context, never actions;
the backend's log-probabilities of the action tokens on packed rows equal the engine's."""

import asyncio
from dataclasses import dataclass

import pytest
import torch

from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.credit import assign_credit
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.env.guarded import GuardedEnvironment
from rlvr.model.tiny import TinyLlama
from rlvr.rollout.episodes import play
from rlvr.transform.gtpo import GTPO
from rlvr.types import Example, LoraSpec, SamplingParams, Step, TokenSignals, TrainBatch

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"])


@dataclass
class TryAgain:
    """Answer the sum; a wrong answer is told "+=" (try again) until `max_turns`."""

    prompt: str
    reference: str
    turns: int = 0

    async def reset(self) -> str:
        return self.prompt

    delay_s: float = 0.0
    observation: str = "+="

    async def step(self, action: str) -> Step:
        self.turns += 1
        await asyncio.sleep(self.delay_s)
        if action == self.reference:
            return Step(None, 1.0, True, {"turn": self.turns})
        return Step(self.observation, 0.0, False, {"turn": self.turns})

    def fork(self):
        raise NotImplementedError

    async def close(self) -> None:
        pass


@dataclass
class TryAgainEnv:
    max_turns: int = 3
    max_context_tokens: int = 64
    step_timeout_s: float = 5.0
    max_concurrent: int | None = None
    delay_s: float = 0.0
    observation: str = "+="

    def episode(self, example, seed):
        return TryAgain(example.prompt, example.reference, delay_s=self.delay_s, observation=self.observation)


def guarded(**settings) -> GuardedEnvironment:
    """A TryAgainEnv as the episode loop plays every environment: behind its guard."""
    return GuardedEnvironment(TryAgainEnv(**settings))


class Recording(PyTorchEngine):
    """The real engine, remembering the contexts it was asked to continue."""

    contexts: list

    def sample(self, prompt_ids_P, group_size, params, seeds, with_entropy=False):
        self.contexts = [*getattr(self, "contexts", []), [list(p) for p in prompt_ids_P]]
        return super().sample(prompt_ids_P, group_size, params, seeds, with_entropy)

    def turn_sampler(self):
        """None: every turn through `sample`, recorded (tests/rollout/test_episode_cache.py: the cached turns)."""
        return None


EXAMPLES = [Example("12+34=", "46"), Example("7+8=", "15")]
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3)


def setup():
    model, tok = TINY.load(0)
    backend = LocalBackend(model, LORA, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    engine = Recording(backend.policy, [tok.eos_token_id], tok.pad_token_id, 256, merge_lora=False)
    return backend, engine, tok


def test_each_turn_continues_the_exact_tokens_of_the_last_and_observations_are_not_actions():
    backend, engine, tok = setup()
    played = play(engine, tok, guarded(), EXAMPLES, 3, SAMPLING, seeds=[5, 6], sample_seeds=[1, 101])
    ro = played.rollouts
    plus_eq = tok.encode("+=", add_special_tokens=False)
    assert ro.actions_PG_T is not None and ro.turn_PG_T is not None
    for r in range(6):
        n = int(ro.mask_PG_T[r].sum())
        row, actions, turns = ro.tokens_PG_T[r, :n].tolist(), ro.actions_PG_T[r, :n].tolist(), ro.turn_PG_T[r, :n]
        # actions and observations alternate; each observation is exactly "+=" and no action token
        obs = [t for t, a in zip(row, actions, strict=True) if not a]
        assert obs == plus_eq * (len(obs) // len(plus_eq))
        assert (turns[~ro.actions_PG_T[r, :n]] == -1).all()
        assert int(played.turns_PG[r]) == int(turns.max()) + 1
        assert not ro.actions_PG_T[r, n:].any() and (ro.logprobs_PG_T[r][~ro.actions_PG_T[r]] == 0).all()
    # turn k+1's context = prompt + everything the row holds up to the end of observation k (no re-rendering)
    prompts = [ro.prompt_ids_P[r // 3] for r in range(6)]
    for turn, contexts in enumerate(engine.contexts[1:], start=1):
        live = [r for r in range(6) if int(played.turns_PG[r]) > turn]
        for r, context in zip(live, contexts, strict=True):
            end = int((ro.turn_PG_T[r] == turn).nonzero()[0])  # first token of action `turn`
            assert context == prompts[r] + ro.tokens_PG_T[r, :end].tolist()
    # rewards: one per played turn, the episode's is their sum; truncated = ran out of turns unsolved
    for r in range(6):
        k = int(played.turns_PG[r])
        turn_rewards = played.turn_rewards_PG_K[r, :k]
        assert float(played.rewards_P_G.view(-1)[r]) == float(turn_rewards.sum())
        assert bool(played.truncated_PG[r]) == (turn_rewards.sum() == 0 and k == 3)
        assert played.transcripts[r][0] == {"role": "env", "text": EXAMPLES[r // 3].prompt}


def test_backend_logprobs_of_action_tokens_equal_the_engines_on_packed_rows():
    backend, engine, tok = setup()
    ro = play(engine, tok, guarded(), EXAMPLES, 3, SAMPLING, seeds=[5, 6], sample_seeds=[2, 102]).rollouts
    prompts = [p for p in ro.prompt_ids_P for _ in range(ro.group_size)]
    ids, attn, Lp = backend.trainee.rows(prompts, ro.tokens_PG_T, ro.mask_PG_T)
    with torch.no_grad():
        new = backend.completion_logprobs(ids, attn, Lp, ro.tokens_PG_T, ro.temperature)
    actions = ro.actions_PG_T
    assert actions.sum() > 6  # several turns were played
    assert torch.allclose(new[actions], ro.logprobs_PG_T[actions], atol=1e-5)


def test_observation_tokens_get_no_advantage_and_no_gradient_share():
    backend, engine, tok = setup()
    played = play(engine, tok, guarded(), EXAMPLES, 3, SAMPLING, seeds=[5, 6], sample_seeds=[3, 103])
    ro = played.rollouts
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])  # a signal in both groups, whatever was played
    signals = TokenSignals(logprobs_PG_T=ro.logprobs_PG_T, mask_PG_T=ro.action_mask_PG_T, group_size=3, step=0,
                           correct_rate=0.5)
    credit = assign_credit(rewards, signals, GRPO(PolicyLoss(0.0, 0.0, 0.0)), GTPO(beta=0.1, uncertainty="surprisal"))
    assert (credit.adv_PG_T[~ro.actions_PG_T] == 0).all() and (credit.adv_PG_T[ro.actions_PG_T] != 0).any()
    stats = backend.train_step(TrainBatch(ro, credit.adv_PG_T), PolicyLoss(0.0, 0.0, 0.0), 1e-3)
    assert stats["train/nonfinite_skip"] == 0.0


@pytest.mark.parametrize("cap, expected_turns", [(64, 3), (6 + 3 + 2 + 3, 2)])
def test_episodes_stop_at_max_turns_or_the_context_cap_and_are_marked_truncated(cap, expected_turns):
    backend, engine, tok = setup()
    never = [Example("12+34=", "x")]  # no action can be "x": every episode runs out
    played = play(engine, tok, guarded(max_context_tokens=cap), never, 2, SamplingParams(1.0, 1.0, 3),
                  seeds=[0], sample_seeds=[0])
    # "12+34=" is 6 tokens; a turn needs room for 3 new ones; an action of ≤ 3 plus "+=" (2) per turn:
    # with a cap of 14 the second turn starts at ≤ 6+3+2 = 11 ≤ 14−3, the third at ≤ 16 > 11 does not
    assert played.truncated_PG.all()
    assert (played.turns_PG <= expected_turns).all() and (played.turns_PG >= 1).all()


def test_episodes_are_stepped_concurrently_within_the_environments_bound():
    """6 episodes whose every step takes 0.2 s, one turn: all at once ≈ 0.2 s of environment time; two at a time
    (three rounds) ≈ 0.6 s."""
    backend, engine, tok = setup()
    seconds = {bound: play(engine, tok, guarded(max_turns=1, max_concurrent=bound, delay_s=0.2), EXAMPLES, 3,
                           SamplingParams(1.0, 1.0, 3), seeds=[5, 6], sample_seeds=[1, 101]).env_seconds
               for bound in (None, 2)}
    assert 0.2 <= seconds[None] < 0.45 and seconds[2] >= 0.6, seconds


def test_with_a_chat_template_each_observation_is_the_templates_suffix():
    """A Qwen2.5-template tokenizer (tests/chat/test_chat_turns.py) and a small Llama over its vocabulary: each
    observation segment of a row is `observation_ids` (the template's user message and generation prompt), led
    by <|im_end|> where the action did not end with it (cut by max_tokens)."""
    from chat.test_chat_turns import qwen
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.chat.turns import end_of_turn_id, observation_ids
    from rlvr.model.prompt_encoding import encode_prompts

    tok = qwen()
    im_end = end_of_turn_id(tok)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                                         eos_token_id=im_end, bos_token_id=None, tie_word_embeddings=True))
    engine = PyTorchEngine(model, [im_end], tok.pad_token_id, 256, merge_lora=False)
    env = guarded(max_context_tokens=400, observation="Too low.")
    played = play(engine, tok, env, [Example("Guess a number.", "x")], 2, SamplingParams(1.0, 1.0, 4), seeds=[0],
                  sample_seeds=[0])
    ro = played.rollouts
    assert ro.prompt_ids_P[0] == encode_prompts(tok, ["Guess a number."])[0]
    suffix = observation_ids(tok, "Too low.")
    for r in range(2):
        row, actions = ro.tokens_PG_T[r].tolist(), ro.actions_PG_T[r].tolist()
        segments, k = [], 0
        while k < int(ro.mask_PG_T[r].sum()):  # split the row into maximal runs of action / observation tokens
            j = k
            while j < len(row) and actions[j] == actions[k] and ro.mask_PG_T[r, j]:
                j += 1
            segments.append((actions[k], row[k:j]))
            k = j
        assert [a for a, _ in segments] == [True, False] * (len(segments) // 2) + [True] * (len(segments) % 2)
        for (_, action), (_, observation) in zip(segments[::2], segments[1::2]):
            assert observation == ([] if action[-1] == im_end else [im_end]) + suffix
