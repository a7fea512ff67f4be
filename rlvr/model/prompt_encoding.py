"""Prompt text → token ids, the same way for sampling, training and evaluation.

With a chat template: `[{"role": "user", "content": prompt}]` rendered with `add_generation_prompt=True`
(`chat_ids`). Without one: plain `encode` with no special tokens added, so the tiny tokenizer's prompts are exactly
their characters.

Every chat template rlvr renders (prompts, episodes' turns, tools) goes through `chat_ids` / `chat_text`, with two
options fixed: `enable_thinking=False` (templates that do not know it ignore it) and the date a template that prints
today's date sees (`TEMPLATE_DATE`: Llama 3.1–3.3's system block reads "Today Date: " + transformers'
`strftime_now`), so a prompt's ids never depend on the day it is rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlvr.types import Rollouts



TEMPLATE_DATE = datetime(2024, 7, 26)
"""The day a chat template sees when it asks for today's (module docstring): fixed, so that a run, its resume and
every seed of a campaign render the same prompt on any day. It is the date Llama 3.1's template falls back on
where `strftime_now` is not defined."""


def template_date(format: str) -> str:
    """`strftime_now` as templates call it, on `TEMPLATE_DATE`."""
    return TEMPLATE_DATE.strftime(format)


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None,
            generation_prompt: bool, tokenize: bool) -> Any:
    return tokenizer.apply_chat_template(messages, tools=cast("list", tools), add_generation_prompt=generation_prompt,
                                         tokenize=tokenize, return_dict=False, enable_thinking=False,
                                         strftime_now=template_date)


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None = None,
             generation_prompt: bool = True) -> list[int]:
    """The conversation's ids as the chat template renders it (module docstring), `tools` shown when given."""
    # one conversation, tokenized, no dict: a list of ids (transformers types every return form at once)
    return list(cast("list[int]", _render(tokenizer, messages, tools, generation_prompt, tokenize=True)))


def chat_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None = None,
              generation_prompt: bool = True) -> str:
    """The conversation's text as the chat template renders it (module docstring), `tools` shown when given."""
    return str(_render(tokenizer, messages, tools, generation_prompt, tokenize=False))


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[list[int]]:
    if tokenizer.chat_template:
        return [chat_ids(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
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
