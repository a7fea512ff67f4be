"""`rlvr eval RUN_OR_CHECKPOINT [OVERRIDE…]`: the held-out evaluation of a saved checkpoint, the trainer's own
(rlvr/rollout/evaluate.py), single-turn or episodes, written beside the checkpoint.

Files, in the checkpoint folder: `eval.json` (the metrics row, the overrides, the row the run logged at that
step when there is one, and whether they agree) and `eval.completions.jsonl` (prompt, reference, greedy
completion, reward per held-out example; a sampled evaluation, `trainer.eval_samples` = k ≥ 2: one line per
sample, k per example, each with its `sample` index 0 … k − 1). With overrides the names carry a tag,
`eval-<8 hex>.json`, the first 8 hex digits of the sha256 of the overrides as given: one pair of files per
distinct override set.

On the run's own config (no overrides) the numbers equal the run's evaluation at that step, field for field
(`eval_time_s` aside), on the same kind of machine with the same thread count (`threads`, which the stored
config carries); a sampled evaluation too (its seeds come from the run seed: rlvr/seeds.py eval_sampling_seeds).
`trainer.eval_samples=8` (and `trainer.eval_temperature`) as overrides give a greedy run's checkpoint pass@k.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TextIO

from rlvr.cli.from_checkpoint import checkpoint_label, open_checkpoint, write_json
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.rollout import EVAL_ROWS, Part, evaluate
from rlvr.start import make_rollout


def output_name(overrides: list[str]) -> str:
    """`eval` for the run's own config, `eval-<8 hex>` for a set of overrides."""
    if not overrides:
        return "eval"
    return "eval-" + hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:8]


def same_numbers(a: dict, b: dict) -> bool:
    """Every field equal but the timings."""
    keys = (a.keys() | b.keys()) - NONDETERMINISTIC_KEYS
    return all(a.get(k) == b.get(k) for k in keys)


def run(path: Path, overrides: list[str], conf: Path, as_json: bool) -> str:
    opened = open_checkpoint(path, overrides, conf)
    name = output_name(overrides)
    t = opened.config["trainer"]  # a config stored before a key existed: evaluate's default, as the trainer's
    samples, temperature = t.get("eval_samples", 0), t.get("eval_temperature", 1.0)
    k = max(samples, 1)
    try:
        c, state = opened.components, opened.state
        rollout = make_rollout(c, opened.engine, opened.tokenizer)
        with open(opened.checkpoint / f"{name}.completions.jsonl", "w") as f:
            row = evaluate(rollout, opened.engine, opened.backend.policy, c.data, t["eval_max_tokens"],
                           state["step"], samples, temperature, t.get("eval_rows", EVAL_ROWS),
                           each=lambda part: write_completions(f, part, k))
    finally:
        opened.close()
    logged = next((e for e in reversed(state.get("evals", [])) if e["step"] == state["step"]), None)
    record = {
        "checkpoint": str(opened.checkpoint),
        "step": state["step"],
        "overrides": overrides,
        "metrics": row,
        "logged": logged,
        "same_as_logged": same_numbers(row, logged) if logged is not None and not overrides else None,
        "completions": f"{name}.completions.jsonl",
    }
    write_json(opened.checkpoint / f"{name}.json", record)
    if as_json:
        return json.dumps(record, indent=2)
    how = (f"{k} samples each at temperature {temperature:g}" if k > 1 else "greedy")
    return render(record, opened.checkpoint / f"{name}.json", checkpoint_label(opened.checkpoint, state),
                  t["eval_max_tokens"], how)


def write_completions(f: TextIO, part: Part, k: int) -> None:
    """One line per completion of a part of the evaluation (k per example)."""
    for i, (completion, reward) in enumerate(zip(part.batch.completions, part.batch.scores.values, strict=True)):
        example = part.examples[i // k]
        line = {"prompt": example.prompt, "reference": example.reference, "completion": completion, "reward": reward}
        f.write(json.dumps({**line, "sample": i % k} if k > 1 else line) + "\n")


def render(record: dict, written: Path, label: str, max_tokens: int, how: str = "greedy") -> str:
    row, logged = record["metrics"], record["logged"]
    lines = [f"rlvr eval: {label}, {row['eval/examples']} held-out examples, {how}, up to {max_tokens} tokens"
             + (f", overrides: {' '.join(record['overrides'])}" if record["overrides"] else "")]
    width = max(len(k) for k in row)
    for key, value in row.items():
        if key == "step":
            continue
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        if key == "eval/accuracy" and logged is not None:
            verdict = {True: "the same numbers", False: "DIFFERENT numbers", None: "overrides given"}
            text += (f"   (the run logged {logged['eval/accuracy']:.4f} at step {logged['step']}: "
                     f"{verdict[record['same_as_logged']]})")
        lines.append(f"  {key.ljust(width)}  {text}")
    lines.append(f"wrote {written} and {record['completions']}")
    return "\n".join(lines)
