"""Which of an observation's ids are its body: the text's own tokens, not the chat template's around it (ECHO's
targets, rlvr/echo/echo.py).

An observation adds to a row (rlvr/chat/observation.py `encode_observation`) the end-of-turn token when the action
did not sample it, then the template's suffix for a user message carrying the text (rlvr/chat/turns.py) or
for the tool turns carrying an action's tool results (rlvr/chat/tools.py); without a template, the text's
encoding. The body is found by difference: the same observation encoded with every text empty (`""`, one empty
result per tool result) is the template's part alone, and the ids of the real encoding that a longest-matching-
blocks alignment (difflib, no junk heuristic) does not match to it are the body. With one message that is what lies
between the common prefix and suffix; with several tool results, each result's tokens, and the template tokens between
them are not. Found by difference, not by encoding the text alone, so a template that trims or decorates the content
is read as it renders; a body token merged with a template character at a boundary counts as body. Without a
template the empty encoding is empty and every id is the body.
"""

from __future__ import annotations

from difflib import SequenceMatcher


def observation_body(ids: list[int], empty: list[int]) -> list[bool]:
    """One flag per id of `ids` (an observation's encoding): True where it is not matched to `empty` (the same
    observation encoded with empty texts), i.e. on the text's own tokens."""
    body = [True] * len(ids)
    for block in SequenceMatcher(None, ids, empty, autojunk=False).get_matching_blocks():
        body[block.a : block.a + block.size] = [False] * block.size
    return body
