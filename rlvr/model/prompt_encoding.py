"""Prompt text → token ids, the same way for sampling, training and evaluation.

With a chat template: `[{"role": "user", "content": prompt}]` rendered with `add_generation_prompt=True`
(and `enable_thinking=False`, which templates that do not know it ignore). Without one: plain
`encode` with no special tokens added, so the tiny tokenizer's prompts are exactly their characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlvr.types import Rollouts



def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[list[int]]:
    if tokenizer.chat_template:
        # one conversation, tokenized, no dict: a list of ids (transformers types every return form at once)
        return [
            list(
                cast("list[int]", tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                    enable_thinking=False,
                ))
            )
            for p in prompts
        ]
    return [tokenizer.encode(p, add_special_tokens=False) for p in prompts]


def eos_ids(tokenizer: PreTrainedTokenizerBase, model_eos: int | list[int] | None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS plus the model's generation-config EOS ids
    (chat models end turns with e.g. <|im_end|> while their tokenizer EOS is another token)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if isinstance(model_eos, int):
        ids.add(model_eos)
    elif model_eos:
        ids.update(model_eos)
    if not ids:
        raise ValueError("the tokenizer and the model's generation_config define no EOS token")
    return sorted(ids)


def token_pieces(tokenizer, rollouts: Rollouts) -> list[list[str]]:
    """Each completion's tokens as the tokenizer's raw pieces (what the planning detector reads)."""
    lengths = rollouts.lengths_PG.tolist()
    return [tokenizer.convert_ids_to_tokens(row[:n]) for row, n in zip(rollouts.tokens_PG_T.tolist(), lengths)]


def decode_completions(tokenizer, rollouts: Rollouts) -> list[str]:
    """Completion text without the EOS and padding (special tokens are dropped)."""
    rows = [
        [t for t, m in zip(tokens, mask, strict=True) if m]
        for tokens, mask in zip(rollouts.tokens_PG_T.tolist(), rollouts.mask_PG_T.tolist(), strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
