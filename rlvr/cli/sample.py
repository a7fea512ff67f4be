"""`rlvr sample RUN_OR_CHECKPOINT --prompt TEXT … | --prompts FILE`: completions of a saved checkpoint's policy,
sampled by the run's engine from its weights (rlvr/cli/from_checkpoint.py), with the run's reward when a
prompt comes with a reference.

Prompts: `--prompt` (repeatable), and/or `--prompts FILE`: a `.jsonl` file holds one JSON object per line with
a "prompt" and optionally a "reference"; any other file holds one prompt per line (blank lines skipped). Each
prompt is encoded as in training (the tokenizer's chat template when it has one). Defaults: the run's
`trainer.sampling` temperature, top-p and max tokens; `--temperature 0` is greedy. The draws depend on
(`--seed`, the weights) alone, as the trainer's do. A prompt the model cannot read (it encodes to the
tokenizer's unknown token: the tiny model reads only "0123456789+=") is refused, exit status 2, naming its
unknown characters and what the model reads, before anything is sampled.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.cli.from_checkpoint import checkpoint_label, open_checkpoint
from rlvr.cli.runs import CliError
from rlvr.seeds import prompt_seeds


def read_prompts(prompts: list[str], prompts_file: Path | None) -> list[tuple[str, str | None]]:
    """(prompt, reference or None) pairs, from `--prompt`s then the file."""
    pairs: list[tuple[str, str | None]] = [(p, None) for p in prompts]
    if prompts_file is not None:
        try:
            lines = prompts_file.read_text().splitlines()
        except OSError as err:
            raise CliError(f"--prompts {prompts_file}: {err.strerror or err}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if prompts_file.suffix != ".jsonl":
                pairs.append((line, None))
                continue
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise CliError(f"--prompts {prompts_file}, line {number}: expected a JSON object with a \"prompt\" "
                               "string (and optionally a \"reference\")")
            reference = item.get("reference")
            pairs.append((item["prompt"], None if reference is None else str(reference)))
    if not pairs:
        raise CliError("no prompts: give --prompt TEXT (repeatable) or --prompts FILE")
    return pairs


def run(path: Path, overrides: list[str], conf: Path, prompts: list[str], prompts_file: Path | None, n: int,
        temperature: float | None, top_p: float | None, max_tokens: int | None, seed: int, as_json: bool) -> str:
    if n < 1:
        raise CliError(f"--n must be at least 1, got {n}")
    if max_tokens is not None and max_tokens < 1:
        raise CliError(f"--max-tokens must be at least 1, got {max_tokens}")
    if temperature is not None and temperature < 0:
        raise CliError(f"--temperature must be >= 0, got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise CliError(f"--top-p must be in (0, 1], got {top_p}")
    pairs = read_prompts(prompts, prompts_file)
    opened = open_checkpoint(path, overrides, conf)
    try:
        records, params = _sample(opened, pairs, n, temperature, top_p, max_tokens, seed)
    finally:
        opened.close()
    if as_json:
        return "\n".join(json.dumps(r) for r in records)
    lines = [f"rlvr sample: {checkpoint_label(opened.checkpoint, opened.state)}, {n} per prompt, temperature "
             f"{params.temperature:g}, top_p {params.top_p:g}, up to {params.max_tokens} tokens, seed {seed}"]
    for r in records:
        lines.append(r["prompt"] + (f"   (reference {r['reference']})" if r["reference"] is not None else ""))
        for i, completion in enumerate(r["completions"]):
            reward = f"   reward {r['rewards'][i]:g}" if r["rewards"] is not None else ""
            text = completion.replace("\n", "\n      ")
            lines.append(f"  [{i}] {text}{reward}")
    return "\n".join(lines)


def _sample(opened, pairs, n, temperature, top_p, max_tokens, seed):
    from rlvr.model.prompt_encoding import decode_completions, encode_prompts
    from rlvr.reward.guarded import RewardGuard, guarded_score
    from rlvr.types import SamplingParams

    run_params = opened.config["trainer"]["sampling"]  # the run's trainer.sampling, as composed
    params = SamplingParams(
        temperature=run_params["temperature"] if temperature is None else temperature,
        top_p=run_params["top_p"] if top_p is None else top_p,
        max_tokens=run_params["max_tokens"] if max_tokens is None else max_tokens,
    )
    prompt_ids = encode_prompts(opened.tokenizer, [p for p, _ in pairs])
    unreadable = [problem for (prompt, _), ids in zip(pairs, prompt_ids, strict=True)
                  if (problem := unknown_tokens(opened.tokenizer, prompt, ids)) is not None]
    if unreadable:
        raise CliError("\n  ".join([f"the model cannot read {len(unreadable)} of the {len(pairs)} prompt(s); "
                                     f"{vocabulary(opened.tokenizer)}:", *unreadable]))
    rollouts = opened.engine.sample(prompt_ids, n, params, seeds=prompt_seeds(seed, len(prompt_ids)))
    completions = decode_completions(opened.tokenizer, rollouts)
    judged = [i for i, (_, reference) in enumerate(pairs) if reference is not None]
    rewards: dict[int, list[float]] = {}
    if judged:
        scores = guarded_score(opened.components.reward, [completions[i * n + g] for i in judged for g in range(n)],
                               [pairs[i][1] for i in judged for _ in range(n)],
                               RewardGuard.of(opened.components.config))
        rewards = {i: scores.values[k * n:(k + 1) * n] for k, i in enumerate(judged)}
    records = [{"prompt": prompt, "reference": reference, "completions": completions[i * n:(i + 1) * n],
                "rewards": rewards.get(i)} for i, (prompt, reference) in enumerate(pairs)]
    return records, params


def unknown_tokens(tokenizer, prompt: str, ids: list[int]) -> str | None:
    """What is wrong with `prompt` when its encoding `ids` holds the tokenizer's unknown token (its characters the
    model cannot read, and how many of the ids are unknown), else None. A tokenizer without an unknown token
    (byte-level BPE) reads any text."""
    unk = tokenizer.unk_token_id
    count = sum(1 for i in ids if i == unk) if unk is not None else 0
    if count == 0:
        return None
    chars = dict.fromkeys(c for c in prompt if unk in tokenizer.encode(c, add_special_tokens=False))
    shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    where = (f"from {len(chars)} character(s) not in the vocabulary: {' '.join(repr(c) for c in chars)}" if chars
             else "from the chat template's text around it")
    return f"{shown!r}: {count} of its {len(ids)} tokens are the unknown token {tokenizer.unk_token!r}, {where}"


def vocabulary(tokenizer) -> str:
    """What the model reads: its characters, for a character-level vocabulary (the tiny model's), else its size."""
    special = set(tokenizer.all_special_tokens)
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]) if t not in special]
    if tokens and all(len(t) == 1 for t in tokens):
        return f"it reads only the characters {''.join(tokens)!r}"
    return f"its vocabulary has {len(tokenizer.get_vocab())} tokens"
