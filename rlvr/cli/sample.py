"""`rlvr sample RUN_OR_CHECKPOINT --prompt TEXT … | --prompts FILE`: completions of a saved checkpoint's policy,
sampled by the run's engine from its weights (rlvr/cli/from_checkpoint.py), with the run's reward when a
prompt comes with a reference.

Prompts: `--prompt` (repeatable), and/or `--prompts FILE`: a `.jsonl` file holds one JSON object per line with
a "prompt" and optionally a "reference"; any other file holds one prompt per line (blank lines skipped). Each
prompt is encoded as in training (the tokenizer's chat template when it has one). Defaults: the run's
`trainer.sampling` temperature, top-p and max tokens; `--temperature 0` is greedy. The draws depend on
(`--seed`, the weights) alone, as the trainer's do.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.cli.from_checkpoint import checkpoint_label, open_checkpoint
from rlvr.cli.runs import CliError


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
    from rlvr.reward.guarded import guarded_score
    from rlvr.types import SamplingParams

    run_params = opened.trainer.sampling
    params = SamplingParams(
        temperature=run_params.temperature if temperature is None else temperature,
        top_p=run_params.top_p if top_p is None else top_p,
        max_tokens=run_params.max_tokens if max_tokens is None else max_tokens,
    )
    prompt_ids = encode_prompts(opened.tokenizer, [p for p, _ in pairs])
    rollouts = opened.engine.sample(prompt_ids, n, params, seed=seed)
    completions = decode_completions(opened.tokenizer, rollouts)
    judged = [i for i, (_, reference) in enumerate(pairs) if reference is not None]
    rewards: dict[int, list[float]] = {}
    if judged:
        scores = guarded_score(opened.components.reward, [completions[i * n + g] for i in judged for g in range(n)],
                               [pairs[i][1] for i in judged for _ in range(n)])
        rewards = {i: scores.values[k * n:(k + 1) * n] for k, i in enumerate(judged)}
    records = [{"prompt": prompt, "reference": reference, "completions": completions[i * n:(i + 1) * n],
                "rewards": rewards.get(i)} for i, (prompt, reference) in enumerate(pairs)]
    return records, params
