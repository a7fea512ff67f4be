"""The ids an observation adds to an episode's row whose last tokens are an action (rlvr/rollout/episodes.py).

Without a chat template: the text's own ids, `tokenizer.encode(text, add_special_tokens=False)`. With one: the
suffix the template adds for a user message after the assistant's turn (turns.py `observation_ids`), or for a tool
turn when the observation carries an action's tool results (tools.py `tool_turn_ids`), led by the end-of-turn token
when the action did not sample it (cut by max_tokens). The warm-up encodes its demonstrations' observations the same
way (rlvr/warmup.py).
"""

from __future__ import annotations

from typing import Any

from rlvr.chat.tools import tool_turn_ids
from rlvr.chat.turns import end_of_turn_id, has_chat_template, observation_ids


def encode_observation(tokenizer: Any, observation: str, row: list[int], tool_results: list[str] | None = None
                       ) -> list[int]:
    """The ids an observation adds to a row whose last tokens are an action (module docstring); a tool turn's
    (`tool_results`, rlvr/tools/harness.py) are a tool-role turn."""
    if tool_results is not None:
        return tool_turn_ids(tokenizer, tool_results, row)
    if not has_chat_template(tokenizer):
        return tokenizer.encode(observation, add_special_tokens=False)
    closing = end_of_turn_id(tokenizer)
    return ([] if row and row[-1] == closing else [closing]) + observation_ids(tokenizer, observation)
