"""Where a chat template rewrites an episode's earlier turns (rlvr/chat/rewrites.py), on Qwen2.5's,
Qwen3's (hybrid thinking), Qwen3-2507's and Llama 3's template texts with the offline tokenizers of
tests/chat/test_chat_turns.py; in episodes played by a scripted engine, where a turn the template rewrote starts a new
sequence of the row, sampled from the template's re-render; and on a real tiny model, where the backend reads every
action token of a split row behind the prompt the engine sampled it from (its log-probabilities equal the engine's),
which it would not without the split."""

from types import SimpleNamespace

import pytest
import torch
from chat.test_chat_turns import QWEN3, STRIPS_THINKING, llama3, qwen, qwen3_2507, text
from test_episodes import guarded

from rlvr.chat.rewrites import TemplateView
from rlvr.chat.turns import end_of_turn_id
from rlvr.model.prompt_encoding import chat_ids
from rlvr.rollout.episodes import play
from rlvr.telemetry import episode_metrics
from rlvr.types import Example, SamplingParams

THINKS = "<think>\nIt is above 5.\n</think>\n\nMy guess is 8."
ACTIONS = ["My guess is 5.", THINKS, "My guess is 7."]  # the second one reasons before answering
TEMPLATES = {"qwen2.5": qwen, "qwen3-2507": qwen3_2507, "llama3": llama3, "qwen3": lambda: qwen(QWEN3),
             "strips-thinking": lambda: qwen(STRIPS_THINKING)}


def rewritten(tok, actions: list[str], observation: str = "Too low.") -> list[int]:
    """The turns after whose observation the template's render no longer extends the conversation's."""
    view = TemplateView.start(tok, "Guess a number from 1 to 9.")
    assert view is not None
    return [k for k, action in enumerate(actions) if not view.extends(action, observation)]


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3-2507", "llama3"])
def test_prefix_preserving_templates_never_rewrite_even_past_reasoning(name):
    assert rewritten(TEMPLATES[name](), ACTIONS) == []


def test_qwen3_rewrites_every_turn_its_generation_prompt_opened_a_think_block_in():
    # enable_thinking=False opens each assistant turn with "<think>\n\n</think>\n\n"; once a user message follows,
    # the turn renders without it (and without any reasoning the action wrote): every observation turn rewrites
    tok = qwen(QWEN3)
    assert rewritten(tok, ACTIONS) == [0, 1, 2]
    view = TemplateView.start(tok, "Q")
    assert view is not None and view.rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not view.extends(THINKS, "Too low.")
    assert "<|im_start|>assistant\nMy guess is 8.<|im_end|>" in view.rendered and "It is above" not in view.rendered


def test_a_template_dropping_past_reasoning_rewrites_only_after_the_turn_that_reasoned():
    # turn 1's action carries <think>: the render after its observation drops it (rewrite at 1); turn 2's render
    # shows turn 1 as the render after turn 1 did, then turn 2's action: it extends again
    assert rewritten(qwen(STRIPS_THINKING), ACTIONS) == [1]


def test_llama3_trims_an_action_and_that_is_a_rewrite():
    assert rewritten(llama3(), ["My guess is 5.\n", "My guess is 7."]) == [0]


def test_tool_turns_under_qwen2_5_extend():
    tok = qwen()
    schemas = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {}}}]
    view = TemplateView.start(tok, "What is 1 + 2?", schemas)
    assert view is not None and "<tools>" in view.rendered
    assert view.extends('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>', "", ["3"])
    assert view.rendered.endswith("<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert view.extends("3", "Right.")


def test_a_template_that_skips_the_tool_role_sees_the_results_as_the_row_does():
    # qwen3_2507's template here has no tools branch: a tool message renders as nothing; the view, as
    # rlvr/chat/tools.py's tool turn, carries the results as a user message, so a re-render still shows them
    tok = qwen3_2507()
    view = TemplateView.start(tok, "What is 1 + 2?")
    assert view is not None and view.extends("<tool_call>x</tool_call>", "", ["3"])
    assert view.messages[-1] == {"role": "user", "content": "<tool_response>\n3\n</tool_response>\n"}
    assert view.rendered.endswith("<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<|im_end|>\n"
                                  "<|im_start|>assistant\n")


def test_without_a_chat_template_there_is_no_view():
    tok = qwen()
    tok.chat_template = None
    assert TemplateView.start(tok, "Q") is None


class Scripted:
    """An engine that samples each turn's scripted text, ended with the end-of-turn token, logprob −0.5 each."""

    def __init__(self, tok, turns: list[str]):
        self.tok, self.script, self.contexts = tok, turns, []

    def sample(self, contexts, n, sampling, seeds, with_entropy=False):
        ids = self.tok.encode(self.script[len(self.contexts)], add_special_tokens=False) + [end_of_turn_id(self.tok)]
        self.contexts.append([list(c) for c in contexts])
        rows = len(contexts)
        return SimpleNamespace(tokens_PG_T=torch.tensor([ids] * rows), mask_PG_T=torch.ones(rows, len(ids), dtype=bool),
                               logprobs_PG_T=torch.full((rows, len(ids)), -0.5), entropy_PG_T=None)


@pytest.mark.parametrize(("name", "expected"), [("qwen2.5", []), ("llama3", []), ("qwen3", [0, 1, 2]),
                                                ("strips-thinking", [1])])
def test_a_turn_the_template_rewrote_starts_a_sequence_sampled_from_its_re_render(name, expected):
    tok = TEMPLATES[name]()
    engine = Scripted(tok, ACTIONS)
    env = guarded(max_context_tokens=2048, observation="Too low.")
    played = play(engine, tok, env, [Example("Guess a number from 1 to 9.", "x")], 2, SamplingParams(1.0, 1.0, 64),
                  seeds=[0], sample_seeds=[0])
    assert played.turns_PG.tolist() == [3, 3] and played.rewritten_turns == [expected, expected]
    metrics = episode_metrics(played, env.failures.take())
    assert metrics["env/template_rewrite_frac"] == (1.0 if expected else 0.0)
    # a rewrite after the last action starts no sequence (qwen3 rewrites after turn 2, the episode's last)
    splits = [k for k in expected if k < 2]
    assert metrics["env/sequences_mean"] == 1 + len(splits)
    ro = played.rollouts
    assert (ro.segments_PG is None) == (not splits)
    messages = [{"role": "user", "content": "Guess a number from 1 to 9."}]
    for r in range(2):
        row = ro.tokens_PG_T[r, : int(ro.mask_PG_T[r].sum())].tolist()
        sequences = ro.segments(r)
        assert len(sequences) == 1 + len(splits) and sequences[-1][1] == len(row)
        for turn, contexts in enumerate(engine.contexts):
            # every trained token is what the policy conditioned on: action k was sampled from its sequence's prompt
            # and the row from that sequence's start up to it
            start = int((ro.turn_PG_T[r] == turn).nonzero()[0])
            a, b, prompt = next(s for s in sequences if s[0] <= start < s[1])
            assert contexts[r] == prompt + row[a:start]
            assert ro.logprobs_PG_T[r, start] == -0.5 and bool(ro.actions_PG_T[r, start])
            # a sequence starts at the first action after a rewrite, from the template's own render of the
            # conversation so far; before any rewrite the prompt and the row are that render token for token
            rendered = chat_ids(tok, messages)
            assert rendered == contexts[r], (turn, text(tok, rendered), text(tok, contexts[r]))
            assert (a == start and turn > 0) == (turn - 1 in splits)
            messages += [{"role": "assistant", "content": ACTIONS[turn]}, {"role": "user", "content": "Too low."}]
        messages = messages[:1]


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_the_backend_reads_a_split_rows_actions_behind_the_prompts_they_were_sampled_from(packing):
    """A tiny random Llama over the Qwen3 tokenizer plays real episodes (engine=pytorch samples every action; the
    hybrid template rewrites at every turn, so each action is a sequence of its own): the backend's log-probability
    of every action token, padded or packed, equals the engine's to 1e-5: what it trains is what the policy sampled
    from. Read as one row (no split), the later actions' differ."""
    from dataclasses import replace

    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.backend.local import LocalBackend
    from rlvr.engine.pytorch import PyTorchEngine
    from rlvr.types import TrainBatch

    tok = qwen(QWEN3)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=512))
    b = LocalBackend(model, None, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False, packing, 4096)
    engine = PyTorchEngine(b.policy, [end_of_turn_id(tok)], tok.pad_token_id, 256, merge_lora=False)
    env = guarded(max_context_tokens=400, observation="Too low.")
    played = play(engine, tok, env, [Example("Guess a number from 1 to 9.", "x"), Example("Pick one.", "y")], 2,
                  SamplingParams(1.0, 1.0, 6), seeds=[0, 1], sample_seeds=[3, 4])
    ro = played.rollouts
    assert played.turns_PG.tolist() == [3, 3, 3, 3] and [len(s) for s in ro.segments_PG] == [2, 2, 2, 2]
    actions = ro.action_mask_PG_T

    def logprobs(rollouts):
        """The backend's no-grad log-probabilities of the rollouts' tokens, back in their [PG, T] layout."""
        rows = b.trainee.step_rows(TrainBatch(rollouts, actions.float()))
        passes = b.trainee.micro_batches(rows, range(len(rows.prompts)))
        return rows, rows.scatter(b.trainee.step_logprobs(rows, passes), actions.shape)

    rows, got = logprobs(ro)  # 4 rows × 3 sequences, each behind its own prompt
    assert rows.origin == [(r, a) for r in range(4) for a, _, _ in ro.segments(r)] and len(rows.prompts) == 12
    torch.testing.assert_close(got[actions], ro.logprobs_PG_T[actions], rtol=0, atol=1e-5)
    _, unsplit = logprobs(replace(ro, segments_PG=None))
    later = actions & (ro.turn_PG_T > 0)
    assert float((unsplit[later] - ro.logprobs_PG_T[later]).abs().max()) > 1e-2


@pytest.mark.parametrize("packing", [0, 24], ids=["padded", "packed"])
def test_a_row_split_where_its_prompt_is_its_own_context_trains_exactly_as_the_whole_row(packing):
    """Splitting moves tokens between sequences, never their weights: rows split at completion position 3 behind
    their own first 3 tokens as the prompt (the context those tokens were sampled from) give the unsplit rows'
    weights, loss and statistics after 3 steps (seq_mean_token_mean: the per-row weights are the whole row's)."""
    from distributed.steps_worker import KNOBS, LORA, TINY, steps, trainable

    from rlvr.backend.local import LocalBackend

    torch.set_num_threads(1)
    runs = []
    for split in (False, True):
        model, tok = TINY.load(0)
        b = LocalBackend(model, LORA, 0, tok.pad_token_id, micro_batch_size=5, packing=packing > 0,
                         max_tokens_per_micro_batch=packing, reference=True, **KNOBS)
        runs.append((steps(b, 0.2, aggregation="seq_mean_token_mean", kl=0.5, split=split), trainable(b.policy)))
    (whole, whole_w), (split_stats, split_w) = runs
    for name, value in whole_w.items():
        torch.testing.assert_close(split_w[name], value, rtol=0, atol=1e-6)
    for a, b in zip(whole, split_stats, strict=True):
        for key in ("loss", "grad_norm", "clip_fraction", "policy/kl_ref", "policy/entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert split_stats[0]["ref_lp_sum"] == pytest.approx(whole[0]["ref_lp_sum"], rel=1e-6)
