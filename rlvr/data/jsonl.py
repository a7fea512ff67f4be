"""`jsonl`: prompts and references from local JSON-lines files.

Each non-blank line of `path` is a JSON object; `prompt_key` holds the problem text (a string) and
`reference_key` the answer (a string, or an integer, which is written in decimal). Prompt =
`prompt_template.format(prompt=<problem>)`. Rows whose reference is empty after stripping are dropped
(one warning line gives the count): no reward can score them.

Training order is `rlvr.data.order.batch_indices` over the kept rows in file order. The held-out set is
`held_out(<kept rows of eval_path>, eval_size)`: a fixed subset, identical for every seed; with
`eval_path: null` there is none (`eval_examples()` is []).

Warm-up demonstrations (`demonstrations_path`, this source's and the other file-reading sources'): a
JSON-lines file whose objects hold `prompt` (the problem text, put through `prompt_template` like a training
prompt) and `completion` (the text the SFT warm-up teaches after it; the model's EOS is appended).

A malformed file fails at construction, naming the config key, the file, the line and what was
expected.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

from rlvr.data.order import ExampleList
from rlvr.types import Demonstration, Example

log = logging.getLogger(__name__)

EVAL_SEED = 0
"""Seeds the held-out subset; a constant, so every run of every seed evaluates on the same rows."""


def held_out(examples: list[Example], eval_size: int, source: str) -> list[Example]:
    """`eval_size` examples drawn by a fixed-seed sample, kept in source order; 0 or more than there are
    = all. Sampling, not a prefix: sources sorted by subject or difficulty would otherwise give a
    one-subject held-out set. More than there are is said at start (`source` names where they came from): a
    table of runs would otherwise report a held-out set of the asked size that it never had."""
    if eval_size > len(examples):
        log.warning("data.eval_size=%d but %s holds %d usable rows: every run evaluates on those %d (say "
                    "data.eval_size=0 for all of them, or give a larger held-out file)", eval_size, source,
                    len(examples), len(examples))
    if eval_size == 0 or eval_size >= len(examples):
        return list(examples)
    return [examples[i] for i in sorted(random.Random(EVAL_SEED).sample(range(len(examples)), eval_size))]


def read_jsonl(
    path: str | Path, columns: tuple[str, ...], config_key: str
) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file; every object holds `columns`. A
    byte-order mark before the first line (Windows editors write one) is skipped."""
    file = check_file(path, config_key, "a JSON-lines file", (".jsonl",))
    rows = []
    with file.open(encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{config_key}={str(path)!r} line {line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e})") from e
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            missing = [c for c in columns if c not in row]
            if missing:
                raise ValueError(
                    f"{where}: missing key(s) {missing}; expected {list(columns)}, found {sorted(row)}"
                )
            rows.append((line_no, row))
    return rows


def check_file(path: str | Path, config_key: str, expected: str, suffixes: tuple[str, ...]) -> Path:
    """`path` as a Path when it is a file; else a FileNotFoundError naming the key, what was expected and, for a
    folder, the files in it of one of `suffixes` (the path meant, most likely)."""
    file = Path(path)
    if file.is_file():
        return file
    if file.is_dir():
        inside = sorted(p.name for p in file.iterdir() if p.suffix in suffixes and p.is_file())
        meant = (f"; say {config_key}={file / inside[0]}" if len(inside) == 1 else
                 f"; it holds {', '.join(inside[:5])}{', …' if len(inside) > 5 else ''}: name one, "
                 f"{config_key}={file}/<file>" if inside else f"; it holds no {' or '.join(suffixes)} file")
        raise FileNotFoundError(f"{config_key}={str(path)!r} is a folder, not a file (expected {expected}){meant}")
    raise FileNotFoundError(f"{config_key}={str(path)!r}: no such file (expected {expected})")


def read_demonstrations(path: str | None, template: str, field: str) -> list[Demonstration]:
    """`data.demonstrations_path`'s rows as demonstrations (none for a null path); `template` formats each
    `prompt` through its `{field}`."""
    if path is None:
        return []
    demos = []
    for line_no, row in read_jsonl(path, ("prompt", "completion"), "data.demonstrations_path"):
        if not isinstance(row["prompt"], str) or not isinstance(row["completion"], str) or not row["completion"]:
            raise ValueError(f"data.demonstrations_path={path!r} line {line_no}: expected a string 'prompt' and a "
                             f"non-empty string 'completion', got {row['prompt']!r} and {row['completion']!r}")
        demos.append(Demonstration(template.format(**{field: row["prompt"]}), row["completion"]))
    if not demos:
        raise ValueError(f"data.demonstrations_path={path!r}: no rows (expected JSON lines with prompt and completion)")
    return demos


def check_template(template: str, field: str) -> None:
    """Fail unless `template` is a str.format template whose only field is `field`."""
    try:
        template.format(**{field: ""})
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"data.prompt_template={template!r} may only use the field {{{field}}} ({e!r})"
        ) from e
    if "{" + field + "}" not in template:
        raise ValueError(f"data.prompt_template={template!r} must contain {{{field}}}")


class JSONL(ExampleList):
    def __init__(
        self,
        seed: int,
        path: str,
        eval_path: str | None,
        prompt_key: str,
        reference_key: str,
        eval_size: int,
        prompt_template: str,
        shuffle: bool,
        demonstrations_path: str | None = None,
    ) -> None:
        check_template(prompt_template, "prompt")
        if eval_size < 0:
            raise ValueError(f"data.eval_size={eval_size} must be >= 0 (0 = the whole eval file)")
        self.seed, self.shuffle = seed, shuffle
        self.prompt_template = prompt_template
        self.prompt_key = prompt_key
        self.reference_key = reference_key
        self._train = self._load(path, "data.path")
        self._eval = [] if eval_path is None else held_out(self._load(eval_path, "data.eval_path"), eval_size,
                                                           f"data.eval_path={eval_path!r}")
        self._demos = read_demonstrations(demonstrations_path, prompt_template, "prompt")
        for examples, key, file in (
            (self._train, "data.path", path),
            (self._eval, "data.eval_path", eval_path),
        ):
            if file is not None and not examples:
                raise ValueError(f"{key}={file!r}: no rows with a non-empty {reference_key!r}")

    def _load(self, path: str, config_key: str) -> list[Example]:
        examples, dropped = [], 0
        for line_no, row in read_jsonl(path, (self.prompt_key, self.reference_key), config_key):
            prompt, reference = row[self.prompt_key], row[self.reference_key]
            reference_ok = isinstance(reference, str | int) and not isinstance(reference, bool)
            if not isinstance(prompt, str) or not reference_ok:
                raise ValueError(
                    f"{config_key}={path!r} line {line_no}: expected a string {self.prompt_key!r} and a "
                    f"string or integer {self.reference_key!r}, got {type(prompt).__name__} and "
                    f"{type(reference).__name__}"
                )
            if not str(reference).strip():
                dropped += 1
                continue
            examples.append(Example(self.prompt_template.format(prompt=prompt), str(reference)))
        if dropped:
            log.warning(
                "%s=%r: dropped %d of %d rows with an empty %r",
                config_key,
                path,
                dropped,
                dropped + len(examples),
                self.reference_key,
            )
        return examples
