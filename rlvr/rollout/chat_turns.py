"""Observation ids for multi-turn episodes of chat models, and the start-up check that makes them exact.

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

A template should be prefix-preserving: adding a turn must not change how earlier turns render.
`check_chat_turns` renders conversations of 1, 2 and 3 user turns once at start and checks that each render is
the previous one, then the sampled action, then `observation_ids` of the new message: token for token for the
history and the observation, and as text for the action (its ids are whatever the model sampled; only the
template's handling of its text can differ). The action of turn 2 carries a `<think>…</think>` block, so
templates that strip past reasoning are caught even when the generation prompt opens no reasoning block. A
template that fails (Qwen3's hybrid one dropping past `<think>` blocks, one that decorates only the last user
message) is not refused: its episodes' rows are split where it rewrites (rlvr/rollout/template_rewrites.py), and
the check returns why, for the start-up log. What is refused (a `ConfigError` naming the model, before any
training) is a template that cannot render a conversation, has no special end-of-turn token, or ends a turn with a
token the engine does not stop at.

An action that did not end with the end-of-turn token (cut by `max_tokens`, or stopped on another EOS id such
as Qwen's `<|endoftext|>`) is not what the template's suffix follows: the caller closes it with
`[end_of_turn_id(tokenizer)]` (observation tokens, never trained on) before the observation's ids.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from rlvr.errors import ConfigError
from rlvr.model.prompt_encoding import chat_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The conversation observation_ids diffs against; check_chat_turns uses other texts, so a suffix that
# depended on the history would show there.
_REFERENCE = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]
_USERS = ["Guess a number from 1 to 9.", "Too low.", "Too high."]
_ACTIONS = ["My guess is 5.", "<think>\nIt is above 5.\n</think>\n\nMy guess is 7."]

T = TypeVar("T")

# tokenizer -> (its chat template, the reference render cut just after the assistant's end-of-turn token)
_reference_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _text(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
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
    prompt = chat_ids(tokenizer, _REFERENCE[:1])
    turn = chat_ids(tokenizer, _REFERENCE, generation_prompt=False)
    start = _first_difference(prompt, turn)
    # the first special token after the assistant's text (templates may open a turn with special header tokens)
    special, content = _special_ids(tokenizer), _REFERENCE[1]["content"]
    closes = (i for i in range(start, len(turn)) if turn[i] in special and content in _text(tokenizer, turn[start:i]))
    end = next(closes, None)
    if end is None:
        raise ValueError(f"no special token closes the assistant turn {content!r} in {_text(tokenizer, turn)!r}")
    return turn[: end + 1]


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The token the chat template closes an assistant turn with (`<|im_end|>` for Qwen, `<|eot_id|>` for
    Llama 3): the one a sampled action must end with for `observation_ids` to follow it."""
    return _reference_turn(tokenizer)[-1]


def observation_ids(tokenizer: PreTrainedTokenizerBase, observation: str) -> list[int]:
    """The ids the chat template adds after an assistant turn's end-of-turn token for a new user message
    carrying `observation`, through the next assistant turn's generation prompt (`after_turn`)."""
    full = chat_ids(tokenizer, [*_REFERENCE, {"role": "user", "content": observation}])
    return after_turn(tokenizer, full, "a user message")


def after_turn(tokenizer: PreTrainedTokenizerBase, full: list[int], follower: str) -> list[int]:
    """What `full`, the reference conversation (`_REFERENCE`) and messages after it rendered through the next
    generation prompt, adds after the reference assistant turn's end-of-turn token.

    A template that renders the reference assistant turn differently once `follower` follows it (Qwen3's hybrid one
    drops the turn's empty `<think>` block) still closes that turn with its end-of-turn token: the suffix is then
    what follows the same count of end-of-turn tokens in the longer render (such a template rewrites history, where
    rlvr/rollout/template_rewrites.py splits an episode's row). Raises ValueError when the longer render has no such
    token."""
    turn = _reference_turn(tokenizer)
    if full[: len(turn)] == turn:
        return full[len(turn):]
    eot, closed = turn[-1], turn.count(turn[-1])
    ends = [i for i, t in enumerate(full) if t == eot]
    if len(ends) < closed:
        i = _first_difference(turn, full)
        raise ValueError(f"the chat template renders an assistant turn differently once {follower} follows it: "
                         f"{_around(tokenizer, turn, i)} became {_around(tokenizer, full, i)}")
    return full[ends[closed - 1] + 1:]


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
                          f"{_text(tokenizer, [eot])!r} (id {eot}) but the engine stops at ids {sorted(stop_ids)} "
                          f"({_text(tokenizer, sorted(stop_ids))!r}): its actions would not end where a turn ends")
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
        i = _first_difference(context, longer)
        return (f"adding turn {k + 1} rewrites turn {k}'s context from token {i}: the context holds "
                f"{_around(tokenizer, context, i)} where the {k + 1}-turn render has {_around(tokenizer, longer, i)}")
    action_end = len(longer) - len(closing)
    if action_end < len(context) or longer[action_end:] != closing:
        return (f"after turn {k}'s context the {k + 1}-turn render continues with "
                f"{_text(tokenizer, longer[len(context):])!r}, which does not end with {_text(tokenizer, closing)!r} "
                "(the end of turn, then the observation's ids)")
    action = _text(tokenizer, longer[len(context): action_end])
    if action != _ACTIONS[k - 1]:
        return (f"the {k + 1}-turn render shows turn {k}'s action as {action!r}, not as the model sampled it: "
                f"{_ACTIONS[k - 1]!r}")
    return None


def _around(tokenizer, ids: list[int], i: int, width: int = 8) -> str:
    """The text of the tokens around position i, marked '…' where cut."""
    text = _text(tokenizer, ids[max(0, i - width): i + width])
    return repr(("…" if i > width else "") + text + ("…" if i + width < len(ids) else ""))
