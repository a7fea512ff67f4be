"""Where a chat template rewrites an episode's earlier turns: the turns at which a row stops being exact.

An episode's row grows token in, token out (rlvr/rollout/episodes.py): the context of action k+1 is the context of
action k, the sampled ids and the observation's ids; the history is never re-rendered, so the policy conditioned
on exactly the tokens the backend trains. A chat template may nonetheless render the same conversation otherwise
once it grows: Qwen3's hybrid template drops every past assistant turn's `<think>` block (the empty one its
generation prompt opens under `enable_thinking=False` included), QwQ's and DeepSeek-R1's drop past reasoning,
Llama 3's trims each message. A model served with that template (an OpenAI-compatible server re-renders the
history at every request) would condition on the rewritten history, not on the row.

`TemplateView` follows an episode's conversation as messages beside its row and, after each observation, renders
it as the template does for the next assistant turn (text, `enable_thinking=False`, the tools when the prompt
showed them). The turn *extends* when that render starts with the previous render followed by the action's text
(the text the environment was sent: `decode(ids, skip_special_tokens=True)`); otherwise the template rewrote an
earlier turn (or the action's text) there. This is prime-rl's extension property ("each successive step's prompt
contains all previous prompts and completions as a prefix"), checked on text rather than ids: an action whose
sampled ids are not the tokenizer's own encoding of its text is the same turn to the template, not a rewrite.

What rlvr does with it (prime-rl's rule): the turn is counted (`Played.rewritten_turns`,
`env/template_rewrite_frac`) and the row starts a new sequence there. The next action is sampled from the
template's re-render of the conversation (`TemplateView.ids`), as a served model would see it, and the row records
the position and that prompt (`Rollouts.segments_PG`); the backends train each sequence of the row behind its own
prompt (`Rollouts.segments`), so every trained token is still exactly what the policy conditioned on. The episode's
reward, credit and token weights stay the row's: splitting moves tokens between sequences, never their weights.
What reads a sequence as a whole reads each one: GSPO's sequence ratio, the sequence-level mismatch corrections.
Qwen3's hybrid template rewrites at every turn, so each of its actions is a sequence of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlvr.chat.tools import renders_tools, tool_messages, tools_text
from rlvr.chat.turns import has_chat_template
from rlvr.model.prompt_encoding import chat_text


@dataclass
class TemplateView:
    """One episode's conversation as its chat template sees it: the messages so far and their render."""

    tokenizer: Any
    messages: list[dict]
    tools: list[dict] | None
    rendered: str

    @classmethod
    def start(cls, tokenizer: Any, prompt: str, schemas: list[dict] | None = None) -> TemplateView | None:
        """The view of an episode whose first observation is `prompt` (with `schemas`: a tool episode, whose prompt
        rlvr/chat/tools.py renders); None without a chat template (no template, nothing to rewrite)."""
        if not has_chat_template(tokenizer):
            return None
        tools = schemas if schemas and renders_tools(tokenizer, schemas) else None
        content = tools_text(schemas) + prompt if schemas and tools is None else prompt
        messages = [{"role": "user", "content": content}]
        return cls(tokenizer, messages, tools, chat_text(tokenizer, messages, tools))

    def copy(self) -> TemplateView:
        """Another episode's view of the same start (its own messages)."""
        return TemplateView(self.tokenizer, [*self.messages], self.tools, self.rendered)

    def extends(self, action: str, observation: str, tool_results: list[str] | None = None) -> bool:
        """Add the action's text and the observation (one user message, or the tool results as rlvr/chat/tools.py
        gives them to the template: `tool_messages`) and say whether the template's render of the longer conversation
        is its previous render followed by `action` and more (module docstring)."""
        before = self.rendered + action
        self.messages.append({"role": "assistant", "content": action})
        self._add([{"role": "user", "content": observation}] if tool_results is None
                  else tool_messages(self.tokenizer, tool_results))
        return self.rendered.startswith(before)

    def ids(self) -> list[int]:
        """The render's ids, as `encode_prompts` encodes a prompt's render: what a new sequence is sampled from."""
        return list(self.tokenizer.encode(self.rendered, add_special_tokens=False))

    def _add(self, messages: list[dict]) -> None:
        self.rendered = chat_text(self.tokenizer, [*self.messages, *messages], self.tools)
        self.messages += messages
