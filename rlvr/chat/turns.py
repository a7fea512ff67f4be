"""Observation ids for multi-turn episodes of chat models.

An episode's context grows by concatenation only (rlvr/rollout/episodes.py):

    context_k+1 = context_k + action_k + observation_ids(observation_k)

`context_0` is the prompt as `encode_prompts` renders it (one user message, `add_generation_prompt=True`,
`enable_thinking=False`); `action_k` is what the engine sampled, ending with the template's end-of-turn token
(`<|im_end|>` for Qwen, `<|eot_id|>` for Llama 3) when the model stopped there. `observation_ids` is what the
chat template adds after that token for a new user message carrying the observation, up to and including the
next assistant turn's generation prompt. For Qwen2.5 that is

    "\\n<|im_start|>user\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n"

(the newline after `<|im_end|>` is the template's, never sampled, so it opens the suffix). It is derived, as
TRL derives a tool result's ids, by diffing two renders of a fixed reference conversation (with and without
the extra user message), so it is exact for the template at hand rather than a hand-written ChatML string.

A template should be prefix-preserving: adding a turn must not change how earlier turns render. rlvr/chat/check.py
checks that once at start; a template that rewrites earlier turns plays with its rows split where it does
(rlvr/chat/rewrites.py).

An action that did not end with the end-of-turn token (cut by `max_tokens`, or stopped on another EOS id such
as Qwen's `<|endoftext|>`) is not what the template's suffix follows: the caller closes it with
`[end_of_turn_id(tokenizer)]` (observation tokens, never trained on) before the observation's ids.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rlvr.model.prompt_encoding import chat_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The conversation observation_ids diffs against (tool turns too: rlvr/chat/tools.py); rlvr/chat/check.py uses
# other texts, so a suffix that depended on the history would show there.
REFERENCE = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]

T = TypeVar("T")

# tokenizer -> (its chat template, the reference render cut just after the assistant's end-of-turn token)
_reference_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def text_of(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, clean_up_tokenization_spaces=False))


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    # all_special_ids misses added special tokens that are not named ones (e.g. a built <|im_start|>)
    added = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    return set(tokenizer.all_special_ids) | added


def per_template(cache: weakref.WeakKeyDictionary, tokenizer: PreTrainedTokenizerBase,
                 compute: Callable[[PreTrainedTokenizerBase], T]) -> T:
    """`compute(tokenizer)`, kept in `cache` for the tokenizer while its chat template stays the same text."""
    cached = cache.get(tokenizer)
    if cached is None or cached[0] != tokenizer.chat_template:
        cached = cache[tokenizer] = (tokenizer.chat_template, compute(tokenizer))
    return cached[1]


def _reference_turn(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The reference conversation's ids up to and including the end-of-turn token closing its assistant turn."""
    return per_template(_reference_cache, tokenizer, _find_reference_turn)


def _find_reference_turn(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    prompt = chat_ids(tokenizer, REFERENCE[:1])
    turn = chat_ids(tokenizer, REFERENCE, generation_prompt=False)
    start = first_difference(prompt, turn)
    # the first special token after the assistant's text (templates may open a turn with special header tokens)
    special, content = _special_ids(tokenizer), REFERENCE[1]["content"]
    closes = (i for i in range(start, len(turn)) if turn[i] in special and content in text_of(tokenizer, turn[start:i]))
    end = next(closes, None)
    if end is None:
        raise ValueError(f"no special token closes the assistant turn {content!r} in {text_of(tokenizer, turn)!r}")
    return turn[: end + 1]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The token the chat template closes an assistant turn with (`<|im_end|>` for Qwen, `<|eot_id|>` for
    Llama 3): the one a sampled action must end with for `observation_ids` to follow it."""
    return _reference_turn(tokenizer)[-1]


def observation_ids(tokenizer: PreTrainedTokenizerBase, observation: str) -> list[int]:
    """The ids the chat template adds after an assistant turn's end-of-turn token for a new user message
    carrying `observation`, through the next assistant turn's generation prompt (`after_turn`)."""
    full = chat_ids(tokenizer, [*REFERENCE, {"role": "user", "content": observation}])
    return after_turn(tokenizer, full, "a user message")


def after_turn(tokenizer: PreTrainedTokenizerBase, full: list[int], follower: str) -> list[int]:
    """What `full`, the reference conversation (`REFERENCE`) and messages after it rendered through the next
    generation prompt, adds after the reference assistant turn's end-of-turn token.

    A template that renders the reference assistant turn differently once `follower` follows it (Qwen3's hybrid one
    drops the turn's empty `<think>` block) still closes that turn with its end-of-turn token: the suffix is then
    what follows the same count of end-of-turn tokens in the longer render (such a template rewrites history, where
    rlvr/chat/rewrites.py splits an episode's row). Raises ValueError when the longer render has no such
    token."""
    turn = _reference_turn(tokenizer)
    if full[: len(turn)] == turn:
        return full[len(turn):]
    eot, closed = turn[-1], turn.count(turn[-1])
    ends = [i for i, t in enumerate(full) if t == eot]
    if len(ends) < closed:
        i = first_difference(turn, full)
        raise ValueError(f"the chat template renders an assistant turn differently once {follower} follows it: "
                         f"{around(tokenizer, turn, i)} became {around(tokenizer, full, i)}")
    return full[ends[closed - 1] + 1:]


def around(tokenizer, ids: list[int], i: int, width: int = 8) -> str:
    """The text of the tokens around position i, marked '…' where cut."""
    text = text_of(tokenizer, ids[max(0, i - width): i + width])
    return repr(("…" if i > width else "") + text + ("…" if i + width < len(ids) else ""))


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer renders conversations with a chat template (model=tiny's plain one has none)."""
    return bool(getattr(tokenizer, "chat_template", None))
