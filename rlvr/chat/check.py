"""The start-up check that a chat template can play multi-turn episodes token in, token out (rlvr/chat/turns.py).

`check_chat_turns` renders conversations of 1, 2 and 3 user turns once at start and checks that each render is the
previous one, then the sampled action, then `observation_ids` of the new message: token for token for the history
and the observation, and as text for the action (its ids are whatever the model sampled; only the template's
handling of its text can differ). The action of turn 2 carries a `<think>…</think>` block, so templates that strip
past reasoning are caught even when the generation prompt opens no reasoning block. A template that fails (Qwen3's
hybrid one dropping past `<think>` blocks, one that decorates only the last user message) is not refused: its
episodes' rows are split where it rewrites (rlvr/chat/rewrites.py), and the check returns why, for the start-up
log. What is refused (a `ConfigError` naming the model, before any training) is a template that cannot render a
conversation, has no special end-of-turn token, or ends a turn with a token the engine does not stop at.

`check_chat` is the whole check a multi-turn run makes of its model before the warm-up: the turns, and for an
environment with tools whether the template asks for the calls in the format the harness reads
(rlvr/chat/tools.py `format_mismatch`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlvr.chat.tools import format_mismatch
from rlvr.chat.turns import around, end_of_turn_id, first_difference, has_chat_template, observation_ids, text_of
from rlvr.errors import ConfigError
from rlvr.model.prompt_encoding import chat_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlvr.optional import ToolUse

log = logging.getLogger("rlvr")

_USERS = ["Guess a number from 1 to 9.", "Too low.", "Too high."]
_ACTIONS = ["My guess is 5.", "<think>\nIt is above 5.\n</think>\n\nMy guess is 7."]


def check_chat(tokenizer: PreTrainedTokenizerBase, model_name: str, stop_ids: Sequence[int] | None,
               tools: ToolUse | None) -> None:
    """A multi-turn run's check of its model's chat template (none without one): `check_chat_turns` (a template
    that rewrites earlier turns is said once, its episodes' rows being split where it does), and a warning when
    the environment's `tools` are called in another format than the template asks for."""
    if not has_chat_template(tokenizer):
        return
    rewrites = check_chat_turns(tokenizer, model_name, stop_ids)
    if rewrites is not None:
        log.info("%s; an episode's row is split there, each part trained after the prompt its actions were "
                 "sampled from", rewrites)
    mismatch = tools and format_mismatch(tokenizer, tools.tool_schemas, tools.call_format)
    if mismatch:
        log.warning("%s (model %s)", mismatch, model_name)


def check_chat_turns(tokenizer: PreTrainedTokenizerBase, model_name: str, stop_ids: Sequence[int] | None = None
                     ) -> str | None:
    """Refuse (ConfigError naming `model_name`) a chat template that cannot play multi-turn episodes token in, token
    out; with `stop_ids` (the engine's EOS ids, `prompt_encoding.eos_ids`), also one whose end-of-turn token the
    engine would not stop at. Returns None when context + action + observation ids is what the template renders for
    the longer conversation, else how it rewrites an earlier turn (the episodes' rows split there)."""
    try:
        eot = end_of_turn_id(tokenizer)
        renders, messages = [], []
        for k, user in enumerate(_USERS):
            messages.append({"role": "user", "content": user})
            renders.append(chat_ids(tokenizer, messages))
            if k < len(_ACTIONS):
                messages.append({"role": "assistant", "content": _ACTIONS[k]})
    except Exception as e:  # a template that cannot render a plain conversation cannot play episodes either
        raise ConfigError(f"model {model_name!r}: its chat template cannot play multi-turn episodes "
                          f"(token in, token out): {e}") from e
    if stop_ids is not None and eot not in stop_ids:
        raise ConfigError(f"model {model_name!r}: its chat template ends an assistant turn with "
                          f"{text_of(tokenizer, [eot])!r} (id {eot}) but the engine stops at ids {sorted(stop_ids)} "
                          f"({text_of(tokenizer, sorted(stop_ids))!r}): its actions would not end where a turn ends")
    for k in range(1, len(renders)):
        try:
            closing = [eot, *observation_ids(tokenizer, _USERS[k])]
        except ValueError as e:
            raise ConfigError(f"model {model_name!r}: its chat template cannot play multi-turn episodes (token in, "
                              f"token out): {e}") from e
        rewrite = _rewrite(tokenizer, k, renders[k - 1], renders[k], closing)
        if rewrite is not None:
            return f"model {model_name!r}: its chat template rewrites earlier turns: {rewrite}"
    return None


def _rewrite(tokenizer, k: int, context: list[int], longer: list[int], closing: list[int]) -> str | None:
    """How `longer` (k+1 user turns) differs from `context` (k), the k-th action's text, then `closing` (the end of
    turn and the observation ids of the (k+1)-th user message); None when it does not."""
    if longer[: len(context)] != context:
        i = first_difference(context, longer)
        return (f"adding turn {k + 1} rewrites turn {k}'s context from token {i}: the context holds "
                f"{around(tokenizer, context, i)} where the {k + 1}-turn render has {around(tokenizer, longer, i)}")
    action_end = len(longer) - len(closing)
    if action_end < len(context) or longer[action_end:] != closing:
        return (f"after turn {k}'s context the {k + 1}-turn render continues with "
                f"{text_of(tokenizer, longer[len(context):])!r}, which does not end with "
                f"{text_of(tokenizer, closing)!r} (the end of turn, then the observation's ids)")
    action = text_of(tokenizer, longer[len(context): action_end])
    if action != _ACTIONS[k - 1]:
        return (f"the {k + 1}-turn render shows turn {k}'s action as {action!r}, not as the model sampled it: "
                f"{_ACTIONS[k - 1]!r}")
    return None
