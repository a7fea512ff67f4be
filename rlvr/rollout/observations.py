"""What one played batch encodes and decodes (rlvr/rollout/episode_loop.py): the observations' ids and body flags,
the actions' texts, each distinct one once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlvr.chat.observation import encode_observation
from rlvr.chat.turns import end_of_turn_id, has_chat_template
from rlvr.rollout.observation_body import observation_body

if TYPE_CHECKING:
    from rlvr.types import Rollouts


class Observations:
    """Observations' ids and body flags (`encode_observation`, rlvr/rollout/observation_body.py) and actions' texts,
    each distinct one encoded (decoded) once per played batch: an observation's ids depend on the text, the tool
    results and whether the row ends with the end-of-turn token, nothing else; an action's text on its ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.closing = end_of_turn_id(tokenizer) if has_chat_template(tokenizer) else None
        self.seen: dict[tuple, tuple[list[int], list[bool]]] = {}
        self.texts: dict[tuple[int, ...], str] = {}

    def decode(self, actions: list[list[int]]) -> list[str]:
        """Each action's text, special tokens skipped."""
        keys = [tuple(ids) for ids in actions]
        new = list(dict.fromkeys(k for k in keys if k not in self.texts))
        if new:
            texts = self.tokenizer.batch_decode([list(k) for k in new], skip_special_tokens=True)
            self.texts.update(zip(new, texts, strict=True))
        return [self.texts[k] for k in keys]

    def encode(self, observation: str, row: list[int], results: list[str] | None) -> tuple[list[int], list[bool]]:
        closed = self.closing is not None and bool(row) and row[-1] == self.closing
        key = (observation, None if results is None else tuple(results), closed)
        if key not in self.seen:
            ids = encode_observation(self.tokenizer, observation, row, results)
            blank = None if results is None else [""] * len(results)  # the template alone: ECHO's marker
            self.seen[key] = ids, observation_body(ids, encode_observation(self.tokenizer, "", row, blank))
        ids, body = self.seen[key]
        return list(ids), list(body)


def action_lists(sampled: Rollouts) -> list[tuple[list[int], list[float], list[float]]]:
    """Each row's sampled ids, logprobs and entropies (0.0 each without them) up to its mask's end, as lists: one
    `tolist` per tensor for the whole turn."""
    lengths = sampled.mask_PG_T.sum(1).tolist()
    tokens, logprobs = sampled.tokens_PG_T.tolist(), sampled.logprobs_PG_T.tolist()
    entropy = sampled.entropy_PG_T.tolist() if sampled.entropy_PG_T is not None else None
    return [(tokens[i][:n], logprobs[i][:n], entropy[i][:n] if entropy is not None else [0.0] * n)
            for i, n in enumerate(lengths)]
