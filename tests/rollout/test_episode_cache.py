"""engine=pytorch keeps each episode's KV cache between its turns (rlvr/engine/pytorch.py "Turns"): an optimisation of
time, never of what is sampled. Played with the cache and with every turn re-encoded (the plain `Engine.sample` path
an engine without `turn_sampler` takes), the same episodes sample the same token ids from the same seeds, and the
log-probabilities and entropies agree to 1e-5 (float32; float summation order is all that differs: the cache's rows
carry padding holes where re-encoding has none). Tested on the tiny model with an environment whose actions differ in
length (some rows finish while others decode on, so the cache holds holes), on env=guess, in chunks of a few rows
and with a budget that forces re-encoding, and under the Qwen2.5 and Qwen3 chat templates with tool-role turns (the
observation bodies ECHO trains on compared too)."""

from dataclasses import dataclass

import pytest
import torch
from test_episodes import TINY, TryAgain, TryAgainEnv, guarded

from rlvr.engine.pytorch import PyTorchEngine
from rlvr.env.guarded import GuardedEnvironment
from rlvr.env.guess import GuessEnvironment
from rlvr.rollout.episodes import play
from rlvr.types import Example, SamplingParams, Step

TOL = 1e-5
"""float32 both ways; measured gaps ~1e-7."""
EXAMPLES = [Example("12+34=", "46"), Example("7+8=", "15"), Example("3+3=", "6")]
GUESS = GuessEnvironment(0, 9, 3, 32, 5.0, "=", "+", "=")


@dataclass
class Plain:
    """The engine without `turn_sampler`: every turn one `sample` call on the whole context (what other engines do)."""

    engine: PyTorchEngine

    def sample(self, prompt_ids_P, group_size, params, seeds, with_entropy=False):
        return self.engine.sample(prompt_ids_P, group_size, params, seeds, with_entropy)


@pytest.fixture(scope="module")
def model_tok():
    return TINY.load(0)


def engine_of(model, tok, **settings) -> PyTorchEngine:
    return PyTorchEngine(model, [tok.eos_token_id], tok.pad_token_id, settings.pop("max_batch_rows", 256),
                         merge_lora=False, **settings)


def assert_same_episodes(cached, plain) -> None:
    a, b = cached.rollouts, plain.rollouts
    assert torch.equal(a.tokens_PG_T, b.tokens_PG_T) and torch.equal(a.mask_PG_T, b.mask_PG_T)
    assert torch.equal(a.actions_PG_T, b.actions_PG_T) and torch.equal(a.turn_PG_T, b.turn_PG_T)
    assert torch.equal(cached.rewards_P_G, plain.rewards_P_G) and torch.equal(cached.turns_PG, plain.turns_PG)
    assert torch.allclose(a.logprobs_PG_T, b.logprobs_PG_T, atol=TOL, rtol=0)
    assert a.entropy_PG_T is not None and b.entropy_PG_T is not None
    assert torch.allclose(a.entropy_PG_T, b.entropy_PG_T, atol=TOL, rtol=0)


@pytest.mark.parametrize("settings", [{}, {"max_batch_rows": 4}], ids=["one-chunk", "chunks-of-4"])
def test_the_cache_samples_what_re_encoding_samples(model_tok, settings):
    model, tok = model_tok
    engine = engine_of(model, tok, **settings)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3)
    env = guarded(max_turns=4, max_context_tokens=64)
    args = (tok, env, EXAMPLES, 6, sampling, [5, 6, 7], [1, 2, 3], True)
    cached, plain = play(engine, *args), play(Plain(engine), *args)
    assert_same_episodes(cached, plain)
    ro = cached.rollouts
    assert int(cached.turns_PG.max()) >= 3  # later turns continued from the cache
    lengths = {int((ro.actions_PG_T[r] & (ro.turn_PG_T[r] == k)).sum()) for r in range(18) for k in range(3)}
    assert {1, 2, 3} <= lengths  # actions that ended early beside others: holes in the cache


def test_guess_episodes_are_the_same_with_and_without_the_cache(model_tok):
    model, tok = model_tok
    engine = engine_of(model, tok)
    env = GuardedEnvironment(GUESS)
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
        sampling = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=2)
        args = (tok, env, [Example("=", "")] * 6, 8, sampling, list(range(6)), list(range(10, 16)), True)
        assert_same_episodes(play(engine, *args), play(Plain(engine), *args))


class ToolTurns(TryAgain):
    """Its first, third, … observations a tool-role turn (two results, as rlvr/tools/harness.py reports them), the
    others an environment message; never done."""

    async def step(self, action: str) -> Step:
        self.turns += 1
        if self.turns % 2:
            return Step("ignored", 0.0, False, {"tool_results": [f"result {self.turns}", "{\"ok\": true}"]})
        return Step("Not yet.", 0.0, False, {})


class ToolTurnsEnv(TryAgainEnv):
    def episode(self, example, seed):
        return ToolTurns(example.prompt, example.reference)


@pytest.mark.parametrize(("template", "rewrites"), [("qwen2.5", False), ("qwen3", True)])
def test_chat_template_episodes_with_tool_turns_are_the_same_with_and_without_the_cache(template, rewrites):
    """A tiny random Llama over the offline Qwen2.5 and Qwen3 tokenizers (tests/chat/test_chat_turns.py) plays
    episodes whose observations are the template's tool-role turns and user turns: Qwen2.5's extend the row (the cache
    is continued with the template's suffixes); Qwen3's hybrid template rewrites after every turn (each next action is
    sampled from the template's re-render, which does not extend what the cache holds: re-encoded). Both ways the same
    ids, observation bodies (ECHO's candidates), sequences and rewards, log-probabilities to 1e-5."""
    from chat.test_chat_turns import QWEN3, qwen
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.chat.turns import end_of_turn_id

    tok = qwen(QWEN3) if template == "qwen3" else qwen()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=512)).eval()
    engine = PyTorchEngine(model, [end_of_turn_id(tok)], tok.pad_token_id, 256, merge_lora=False)
    env = GuardedEnvironment(ToolTurnsEnv(max_turns=4, max_context_tokens=512))
    examples = [Example("Add 12 and 34.", "46"), Example("Multiply 7 by 8.", "56")]
    args = (tok, env, examples, 3, SamplingParams(1.0, 1.0, 5), [5, 6], [1, 2], True)
    continued, decode = [], engine._decode

    def recorded(rows, params, gen, with_entropy, device, past=None):
        continued.append(past is not None)
        return decode(rows, params, gen, with_entropy, device, past)

    engine._decode = recorded  # type: ignore[method-assign]
    cached = play(engine, *args)
    del engine._decode
    plain = play(Plain(engine), *args)
    assert continued == [False, *[not rewrites] * 3]  # turn 0 encodes the prompts; then the cache, or the re-render
    assert_same_episodes(cached, plain)
    a, b = cached.rollouts, plain.rollouts
    assert torch.equal(a.observation_body_PG_T, b.observation_body_PG_T) and a.segments_PG == b.segments_PG
    assert cached.turns_PG.tolist() == [4] * 6 and cached.rewritten_turns == plain.rewritten_turns
    assert (a.segments_PG is not None) == rewrites  # qwen3: every row a sequence per action
    assert int(a.observation_body_PG_T.sum()) > 0  # the tool results' and messages' own tokens
    assert "<tool_response>\nresult 1\n</tool_response>" in tok.decode(a.tokens_PG_T[0])


def test_an_episode_draws_the_same_whichever_other_episodes_play(model_tok):
    model, tok = model_tok
    engine = engine_of(model, tok, max_batch_rows=3)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3)
    env = guarded(max_turns=4, max_context_tokens=64)
    together = play(engine, tok, env, EXAMPLES, 2, sampling, [5, 6, 7], [1, 2, 3]).rollouts
    alone = play(engine, tok, env, EXAMPLES[1:2], 2, sampling, [6], [2]).rollouts
    n = alone.tokens_PG_T.shape[1]
    assert torch.equal(together.tokens_PG_T[2:4, :n], alone.tokens_PG_T)
    assert torch.allclose(together.logprobs_PG_T[2:4, :n], alone.logprobs_PG_T, atol=TOL, rtol=0)


def test_a_sync_drops_the_caches_and_a_context_that_does_not_extend_its_cache_is_re_encoded():
    model, tok = TINY.load(0)  # its own: its weights change
    engine = engine_of(model, tok)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=2)
    turns = engine.turn_sampler()
    assert turns is not None
    first = turns.sample([0, 1], [[3, 4, 5], [6, 7]], greedy, [0, 0])
    grown = [[3, 4, 5, *first.tokens_PG_T[0].tolist(), 12], [9, 9, 9, 9]]  # row 1: not its cache's extension
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync(model)  # new weights: the keys and values the cache holds are stale
    cached = turns.sample([0, 1], grown, greedy, [0, 0], with_entropy=True)
    fresh = engine.sample(grown, 1, greedy, [0, 0], with_entropy=True)
    assert torch.equal(cached.tokens_PG_T, fresh.tokens_PG_T)
    assert torch.allclose(cached.logprobs_PG_T, fresh.logprobs_PG_T, atol=TOL, rtol=0)
    turns.close()
    assert turns.chunks == []


def test_a_cache_grown_past_the_activation_budget_is_re_encoded(model_tok):
    model, tok = model_tok
    engine = engine_of(model, tok, max_batch_mb=0.05)  # ~2 rows of 8 positions: the grown cache does not fit
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3)
    turns = engine.turn_sampler()
    assert turns is not None
    contexts = [[3, 4, 5], [6, 7]]
    first = turns.sample([0, 1], contexts, sampling, [1, 2])
    assert len(turns.chunks) == 1
    grown = [c + first.tokens_PG_T[i].tolist() + [12, 12, 12] for i, c in enumerate(contexts)]
    cached = turns.sample([0, 1], grown, sampling, [3, 4], with_entropy=True)
    assert len(turns.chunks) == 2  # re-encoded, a row a chunk
    fresh = engine.sample(grown, 1, sampling, [3, 4], with_entropy=True)
    assert torch.equal(cached.tokens_PG_T, fresh.tokens_PG_T)
    assert torch.allclose(cached.logprobs_PG_T, fresh.logprobs_PG_T, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", ["qwen3_5", "gemma4"])
def test_a_model_whose_cache_is_not_all_attention_re_encodes_every_turn(family, tmp_path):
    """Qwen3.5's linear-attention layer runs its convolution and recurrent state through every position fed, held out
    by the attention mask or not, and Gemma 4's sliding-window layer counts such a position in its window: a cache
    with holes would show a row something re-encoding does not (for Qwen3.5 the log-probabilities move by far more
    than float order, checked below by forcing it). So on these models every turn is re-encoded (`holes_are_exact`),
    and episodes are those the plain path plays; a group's shared prefill copies the linear-attention states too."""
    from model.test_new_families import checkpoint, preset

    from rlvr.engine.pytorch import holes_are_exact

    model, tok = preset(family, checkpoint(family, tmp_path / family)).load(seed=0)
    engine = engine_of(model.eval(), tok, max_batch_rows=256)
    assert not holes_are_exact(model) and not engine.caches_continue
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3)
    args = (tok, guarded(max_turns=4, max_context_tokens=48), EXAMPLES, 4, sampling, [5, 6, 7], [1, 2, 3], True)
    played = play(engine, *args)
    assert_same_episodes(played, play(Plain(engine), *args))
    assert int(played.turns_PG.max()) >= 3
    one_row = engine_of(model, tok, max_batch_rows=1)  # nothing shared in a prefill
    assert_same_episodes(played, play(Plain(one_row), *args))
    if family == "qwen3_5":
        engine.caches_continue = True  # what continuing through the holes would have sampled
        forced = play(engine, *args).rollouts
        assert not torch.allclose(forced.logprobs_PG_T, played.rollouts.logprobs_PG_T, atol=1e-3, rtol=0)


def test_sampling_in_the_worker_process_keeps_the_cache_there(model_tok):
    """trainer.off_policy_steps ≥ 1 on a CPU: sampling runs in a forked worker (rlvr/engine/sampler_process.py), which
    keeps the episodes' caches between turns (`WorkerTurns`; bit for bit the trainer process's own on one thread:
    tests/engine/test_sampler_process.py), and plays the same episodes."""
    model, tok = model_tok
    engine = engine_of(model, tok)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3)
    args = (tok, guarded(max_turns=3, max_context_tokens=64), EXAMPLES[:2], 3, sampling, [5, 6], [1, 2], True)
    cached = play(engine, *args)
    engine.sample_beside_training(True)
    try:
        assert type(engine.turn_sampler()).__name__ == "WorkerTurns"
        in_worker = play(engine, *args)
    finally:
        engine.sample_beside_training(False)
    assert_same_episodes(cached, in_worker)
