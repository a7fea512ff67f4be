"""The ids of a tool episode's prompt and of its tool turns, token in and token out (rlvr/rollout/episodes.py), under
the model's chat template; the tool harness that runs the calls is rlvr/tools/.

Prompt. With a chat template that renders `tools` (Qwen2.5, Qwen3, Llama 3.1, …: the render with `tools=`
differs from the render without), the first observation is one user message rendered with
`apply_chat_template(messages, tools=schemas, add_generation_prompt=True)`, so Qwen2.5 opens with its system
block "# Tools … <tools>\\n{schema}\\n</tools> … <tool_call>…</tool_call>" as TRL and verl render it. A template
that ignores `tools`, or no template (model=tiny), gets the plain-text block `tools_text(schemas)` in front of
the prompt instead, in the same words Qwen2.5's template uses (a departure: TRL refuses such a model).

Tool turn. The results of one action's calls are one turn: with a chat template, what it adds after an
assistant turn for one `{"role": "tool", "content": result}` message per result, through the next generation
prompt, derived by diffing two renders of a fixed conversation exactly as `turns.observation_ids` derives a
user message's (and led by the end-of-turn token when the action did not sample it). For Qwen2.5, two results:

    "\\n<|im_start|>user\\n<tool_response>\\nA\\n</tool_response>\\n<tool_response>\\nB\\n</tool_response><|im_end|>
     \\n<|im_start|>assistant\\n"

A template that renders the assistant turn before it differently (Qwen3's hybrid one drops its empty `<think>`
block) gets what follows that turn's end-of-turn token in the longer render (`turns.after_turn`), and the
episode's row splits there as after a user turn (rlvr/chat/rewrites.py). A template that does not
render the tool role (it raises on it, or skips it, as one that renders only the roles it knows: `shows_tool_role`)
gets the results as one user message of `<tool_response>` blocks; no template: the blocks' plain text. The start-up
check (rlvr/chat/check.py) covers user turns only; tests/tools/test_harness.py checks Qwen2.5's, Qwen3's
and such a template's tool turns.
"""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING

from rlvr.chat.turns import REFERENCE, after_turn, end_of_turn_id, has_chat_template, per_template
from rlvr.model.prompt_encoding import chat_ids, chat_text, encode_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OPEN = "<tool_call>"
"""The tag that opens a Hermes tool call, as Qwen's and Hermes' templates ask for it (rlvr/tools/parse.py reads it)."""


def tools_text(schemas: list[dict]) -> str:
    """The tools as plain text, for a prompt whose template does not render them."""
    listed = "\n".join(json.dumps(s) for s in schemas)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>\n"
            f"{listed}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>\n\n")


def renders_tools(tokenizer: PreTrainedTokenizerBase, schemas: list[dict]) -> bool:
    """Whether the chat template shows `tools` (its render with them differs from its render without)."""
    if not has_chat_template(tokenizer):
        return False
    messages = [{"role": "user", "content": "Hello."}]
    try:
        with_tools = chat_text(tokenizer, messages, schemas)
    except Exception:  # noqa: BLE001 - a template that cannot take tools does not render them
        return False
    return with_tools != chat_text(tokenizer, messages)


def format_mismatch(tokenizer: PreTrainedTokenizerBase, schemas: list[dict], call_format: str) -> str | None:
    """Why the chat template asks for tool calls in another format than `env.tool_call_format` reads, or None: its
    tools prompt asks for `<tool_call>` blocks (Qwen, Hermes) and the format is not "hermes", or it renders the tools
    without asking for them (Llama 3.1–3.3 ask for bare JSON) and the format is "hermes"."""
    if call_format == "marker" or not renders_tools(tokenizer, schemas):
        return None
    hermes = OPEN in chat_text(tokenizer, [{"role": "user", "content": "Hello."}], schemas)
    if hermes == (call_format == "hermes"):
        return None
    asked = "<tool_call> blocks (env.tool_call_format=hermes)" if hermes else "no <tool_call> blocks"
    return (f"the chat template's tools prompt asks for {asked}, but env.tool_call_format={call_format}: the policy's "
            "calls may never parse" + ("" if hermes else "; a Llama 3.1–3.3 template asks for bare JSON calls "
                                       "(env.tool_call_format=json)"))


def tool_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, schemas: list[dict]) -> list[int]:
    """The prompt's ids with the tools shown (module docstring)."""
    if not renders_tools(tokenizer, schemas):
        return encode_prompts(tokenizer, [tools_text(schemas) + prompt])[0]
    return chat_ids(tokenizer, [{"role": "user", "content": prompt}], schemas)


def responses_text(results: list[str]) -> str:
    return "".join(f"<tool_response>\n{r}\n</tool_response>\n" for r in results)


def tool_turn_ids(tokenizer: PreTrainedTokenizerBase, results: list[str], row: list[int]) -> list[int]:
    """The ids one action's tool results add to a row whose last tokens are that action (module docstring)."""
    if not has_chat_template(tokenizer):
        return tokenizer.encode(responses_text(results), add_special_tokens=False)
    closing = end_of_turn_id(tokenizer)
    lead = [] if row and row[-1] == closing else [closing]
    full = chat_ids(tokenizer, [*REFERENCE, *tool_messages(tokenizer, results)])
    return lead + after_turn(tokenizer, full, "the tool results")


def tool_messages(tokenizer: PreTrainedTokenizerBase, results: list[str]) -> list[dict]:
    """One action's tool results as the chat template is given them: a tool message each, or one user message of
    `<tool_response>` blocks where the template does not render the tool role (`shows_tool_role`)."""
    if shows_tool_role(tokenizer):
        return [{"role": "tool", "content": r} for r in results]
    return [{"role": "user", "content": responses_text(results)}]


_PROBE = "rlvr tool result probe"
_tool_role_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shows_tool_role(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders a tool message with its content: it neither raises on the role nor skips it
    (a template that renders only the roles it knows). Found once per template, with a probe text."""
    return per_template(_tool_role_cache, tokenizer, _probe_tool_role)


def _probe_tool_role(tokenizer: PreTrainedTokenizerBase) -> bool:
    try:
        return _PROBE in tokenizer.decode(chat_ids(tokenizer, [*REFERENCE, {"role": "tool", "content": _PROBE}]))
    except Exception:  # noqa: BLE001 - a template without a tool role raises on it
        return False
