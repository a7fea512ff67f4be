"""Episodes with tools (rlvr/tools/harness.py, rlvr/chat/tools.py) through the episode loop
(rlvr/rollout/episodes.py): the prompt shows the tools under Qwen2.5's chat template, each tool turn is the
template's tool-role suffix (after Qwen3's rewritten assistant turn too, where the row splits), the row is token in /
token out, only the policy's tokens are actions, and the `env/tool_*` metrics count the calls."""

import asyncio
from types import SimpleNamespace

import torch
from chat.test_chat_turns import QWEN3, build_tokenizer, qwen, qwen3_2507

from rlvr.chat.tools import (
    format_mismatch,
    renders_tools,
    shows_tool_role,
    tool_prompt_ids,
    tool_turn_ids,
    tools_text,
)
from rlvr.chat.turns import end_of_turn_id
from rlvr.env.guarded import GuardedEnvironment
from rlvr.model.prompt_encoding import chat_ids
from rlvr.rollout.episodes import play
from rlvr.tools.harness import ToolEnvironment, tool_metrics, with_tools
from rlvr.tools.schema import build_tools
from rlvr.types import Example, SamplingParams, Step

CALC = [{"_target_": "rlvr.tools.calculator.calculate"}]
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "123 + 456"}}\n</tool_call>'


class Answer:
    """Solved by the reference; anything else: "Wrong." and another try."""

    def __init__(self, example):
        self.example = example

    async def reset(self) -> str:
        return self.example.prompt

    async def step(self, action: str) -> Step:
        if action.strip() == self.example.reference:
            return Step(None, 1.0, True, {"solved": True})
        return Step("Wrong.", 0.0, False, {})

    def fork(self):
        raise NotImplementedError

    async def close(self) -> None:
        pass


class AnswerEnv:
    max_turns, max_context_tokens, step_timeout_s = 2, 2048, 5.0

    def episode(self, example, seed):
        return Answer(example)


class Scripted:
    """An engine that samples the scripted texts of each turn, ended with <|im_end|>, logprob −0.5 each."""

    def __init__(self, tok, turns: list[str]):
        self.tok, self.turns, self.turn, self.contexts = tok, turns, 0, []

    def sample(self, contexts, n, sampling, seeds, with_entropy=False):
        ids = self.tok.encode(self.turns[self.turn], add_special_tokens=False) + [end_of_turn_id(self.tok)]
        self.turn += 1
        self.contexts.append([list(c) for c in contexts])
        rows = len(contexts)
        return SimpleNamespace(tokens_PG_T=torch.tensor([ids] * rows), mask_PG_T=torch.ones(rows, len(ids), dtype=bool),
                               logprobs_PG_T=torch.full((rows, len(ids)), -0.5), entropy_PG_T=None)


def test_a_tool_turn_is_the_templates_tool_message_and_the_row_is_what_the_template_renders():
    tok = qwen()
    env = GuardedEnvironment(with_tools(AnswerEnv(), {"tools": CALC, "max_tool_calls": 2}))
    engine = Scripted(tok, [CALL, "579"])
    played = play(engine, tok, env, [Example("What is 123 + 456?", "579")], 1, SamplingParams(1.0, 1.0, 64),
                  seeds=[0], sample_seeds=[0])
    ro = played.rollouts
    schemas = env.tool_schemas
    assert renders_tools(tok, schemas)
    prompt = ro.prompt_ids_P[0]
    assert "<tools>" in tok.decode(prompt) and '"name": "calculate"' in tok.decode(prompt)
    # token in, token out: prompt + action 0 + tool turn + action 1 is the template's render of the conversation
    conversation = [{"role": "user", "content": "What is 123 + 456?"}, {"role": "assistant", "content": CALL},
                    {"role": "tool", "content": "579"}]
    rendered = tok.apply_chat_template(conversation, tools=schemas, add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
    n = int(ro.mask_PG_T[0].sum())
    row, actions = ro.tokens_PG_T[0, :n].tolist(), ro.actions_PG_T[0, :n].tolist()
    second = engine.contexts[1][0]
    assert second == list(rendered) and second == prompt + row[: len(second) - len(prompt)]
    assert tok.decode(second[len(prompt):]).endswith(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n579\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    call_ids = tok.encode(CALL, add_special_tokens=False) + [end_of_turn_id(tok)]
    tool_ids = tool_turn_ids(tok, ["579"], call_ids)
    assert row == call_ids + tool_ids + tok.encode("579", add_special_tokens=False) + [end_of_turn_id(tok)]
    assert actions == [True] * len(call_ids) + [False] * len(tool_ids) + [True] * (n - len(call_ids) - len(tool_ids))
    assert played.rewards_P_G.tolist() == [[1.0]] and played.turns_PG.tolist() == [2]
    assert played.infos[0][0]["tool_calls"] == [{"name": "calculate", "outcome": "ok", "truncated": False}]
    assert [t["role"] for t in played.transcripts[0]] == ["env", "policy", "tool", "policy"]


def test_under_qwen3_a_tool_turn_follows_the_call_the_template_rewrote_and_the_row_splits_there():
    # Qwen3's hybrid template renders a past assistant turn without the empty <think> block its generation prompt
    # opened: the tool turn is what follows that turn's <|im_end|>, and the answer is sampled from the template's own
    # render of the conversation, a sequence of its own (rlvr/chat/rewrites.py)
    tok = qwen(QWEN3)
    env = GuardedEnvironment(with_tools(AnswerEnv(), {"tools": CALC, "max_tool_calls": 2}))
    engine = Scripted(tok, [CALL, "579"])
    played = play(engine, tok, env, [Example("What is 123 + 456?", "579")], 1, SamplingParams(1.0, 1.0, 64),
                  seeds=[0], sample_seeds=[0])
    assert played.rewards_P_G.tolist() == [[1.0]] and played.rewritten_turns == [[0]]
    assert played.infos[0][0]["tool_calls"] == [{"name": "calculate", "outcome": "ok", "truncated": False}]
    conversation = [{"role": "user", "content": "What is 123 + 456?"}, {"role": "assistant", "content": CALL},
                    {"role": "tool", "content": "579"}]
    rendered = list(tok.apply_chat_template(conversation, tools=env.tool_schemas, add_generation_prompt=True,
                                            tokenize=True, return_dict=False, enable_thinking=False))
    assert engine.contexts[1][0] == rendered
    assert tok.decode(rendered).endswith("<|im_start|>user\n<tool_response>\n579\n</tool_response><|im_end|>\n"
                                         "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ro = played.rollouts
    call_ids = tok.encode(CALL, add_special_tokens=False) + [end_of_turn_id(tok)]
    tool_ids = tool_turn_ids(tok, ["579"], call_ids)
    answer = tok.encode("579", add_special_tokens=False) + [end_of_turn_id(tok)]
    n = int(ro.mask_PG_T[0].sum())
    assert ro.tokens_PG_T[0, :n].tolist() == call_ids + tool_ids + answer
    (a0, b0, first), (a1, b1, second) = ro.segments(0)
    assert (a0, b0, first) == (0, len(call_ids) + len(tool_ids), ro.prompt_ids_P[0])
    assert (a1, b1, second) == (b0, n, rendered)


def test_several_results_are_one_tool_turn_under_qwen2_5():
    tok = qwen()
    ids = tool_turn_ids(tok, ["A", "B"], [end_of_turn_id(tok)])
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n"
                               "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_skips_the_tool_role_gets_the_results_as_a_user_message():
    tok = qwen3_2507()  # its template without the tools branch: a tool message renders as nothing at all
    assert not shows_tool_role(tok) and shows_tool_role(qwen()) and shows_tool_role(qwen(QWEN3))
    ids = tool_turn_ids(tok, ["a", "B"], [end_of_turn_id(tok)])
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nB\n"
                               "</tool_response>\n<|im_end|>\n<|im_start|>assistant\n")


# A template in Llama 3.1's shape (written here, not Meta's text): the tools in the first user message with its
# request for {"name": …, "parameters": …} JSON, "Environment: ipython" and today's date in the system block, a tool
# message as an ipython turn whose content, a string being iterable to Jinja, is rendered as JSON.
LLAMA3_1 = (
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\n{% if tools is not none %}Environment: ipython\n"
    "{% endif %}Cutting Knowledge Date: December 2023\nToday Date: {{ strftime_now('%d %b %Y') }}\n\n<|eot_id|>"
    "{% for m in messages %}{% if m.role == 'tool' or m.role == 'ipython' %}<|start_header_id|>ipython<|end_header_id|>"
    "\n\n{% if m.content is mapping or m.content is iterable %}{{ m.content | tojson }}{% else %}{{ m.content }}"
    "{% endif %}<|eot_id|>{% elif loop.first and tools is not none %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.Do not use variables.\n\n{% for t in tools %}{{ t | tojson(indent=4) }}\n\n"
    "{% endfor %}{{ m.content | trim }}<|eot_id|>{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def llama3_1():
    special = ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
               "<|python_tag|>"]
    return build_tokenizer(LLAMA3_1, special, eos="<|eot_id|>", bos="<|begin_of_text|>", thinking_tokens=False)


def test_under_llama_3_1_json_calls_are_run_and_each_result_is_an_ipython_turn():
    """env.tool_call_format=json: the policy answers the template's request with a bare JSON call, the harness runs
    it, and the result comes back as the template's ipython turn; the row is what the template renders."""
    tok = llama3_1()
    env = GuardedEnvironment(with_tools(AnswerEnv(), {"tools": CALC, "max_tool_calls": 2, "tool_call_format": "json"}))
    call = '{"name": "calculate", "parameters": {"expression": "123 + 456"}}'
    engine = Scripted(tok, [call, "579"])
    played = play(engine, tok, env, [Example("What is 123 + 456?", "579")], 1, SamplingParams(1.0, 1.0, 64),
                  seeds=[0], sample_seeds=[0])
    prompt = played.rollouts.prompt_ids_P[0]
    assert '"parameters": dictionary of argument name' in tok.decode(prompt) and '"calculate"' in tok.decode(prompt)
    conversation = [{"role": "user", "content": "What is 123 + 456?"}, {"role": "assistant", "content": call},
                    {"role": "tool", "content": "579"}]
    second = engine.contexts[1][0]
    assert second == chat_ids(tok, conversation, env.tool_schemas)
    assert tok.decode(second[len(prompt):]) == (call + '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"579"'
                                                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert played.rewards_P_G.tolist() == [[1.0]] and played.turns_PG.tolist() == [2]
    assert played.infos[0][0]["tool_calls"] == [{"name": "calculate", "outcome": "ok", "truncated": False}]


def test_a_format_the_template_does_not_ask_for_is_said():
    """Said once at start (rlvr/trainer.py): Qwen's template asks for <tool_call> blocks, Llama 3.1's for bare JSON."""
    llama = llama3_1()
    schemas = [t.schema for t in build_tools(CALC)]
    assert format_mismatch(qwen(), schemas, "hermes") is None and format_mismatch(llama, schemas, "json") is None
    assert "asks for <tool_call> blocks (env.tool_call_format=hermes), but env.tool_call_format=json" in (
        format_mismatch(qwen(), schemas, "json"))
    said = format_mismatch(llama, schemas, "hermes")
    assert "asks for no <tool_call> blocks, but env.tool_call_format=hermes" in said
    assert "a Llama 3.1–3.3 template asks for bare JSON calls (env.tool_call_format=json)" in said
    assert format_mismatch(llama, schemas, "marker") is None


def test_without_a_chat_template_tools_and_results_are_plain_text():
    tok = qwen()
    tok.chat_template = None
    schemas = [t.schema for t in build_tools(CALC)]
    assert tok.decode(tool_prompt_ids(tok, "Q", schemas)) == tools_text(schemas) + "Q"
    assert tok.decode(tool_turn_ids(tok, ["7"], [])) == "<tool_response>\n7\n</tool_response>\n"


def episode(**settings):
    env = ToolEnvironment(AnswerEnv(), build_tools(CALC), **{"max_tool_calls": 2, **settings})
    return env, env.episode(Example("q", "579"), 0)


def test_bad_calls_are_counted_observations_and_the_budget_bounds_the_turns():
    env, ep = episode()
    assert (env.max_turns, env.step_timeout_s) == (4, 25.0)  # 2 answers + 2 calls; 5 s + 2 × 10 s per tool call
    steps = [asyncio.run(ep.step(a)) for a in (
        '<tool_call>{"name": "calculate", "arguments": {"expression": 7}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>',  # 2 calls: the budget is spent
        CALL,                                                          # past the budget: an answer, wrong
        "579")]
    assert steps[0].observation == ("error: calculate: argument 'expression' must be string, got integer 7\n"
                                    "error: no tool named 'search' (tools: calculate)")
    assert (steps[0].reward, steps[0].done) == (0.0, False)
    assert (steps[1].observation, steps[1].info["tool_calls"][0]["outcome"]) == ("Wrong.", "over_budget")
    assert (steps[2].reward, steps[2].done) == (1.0, True)
    metrics = tool_metrics([[s.info for s in steps], []])  # a second episode that called nothing
    assert metrics == {"env/tool_calls_mean": 1.5, "env/tool_call_frac": 0.5,  # 3 calls / 2 episodes; 1 of 2
                       "env/tool_truncated": 0.0, "env/tool_errors": 0.0, "env/tool_timeouts": 0.0,
                       "env/tool_malformed": 0.0, "env/tool_unknown": 1.0, "env/tool_bad_arguments": 1.0,
                       "env/tool_over_budget": 1.0}


def test_one_action_past_the_remaining_budget_runs_what_is_left():
    _, ep = episode(max_tool_calls=1)
    step = asyncio.run(ep.step(CALL + CALL))
    assert [r["outcome"] for r in step.info["tool_calls"]] == ["ok", "over_budget"]
    assert step.info["tool_results"][0] == "579"
