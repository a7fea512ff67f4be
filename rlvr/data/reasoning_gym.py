"""`reasoning_gym`: any reasoning-gym task (github.com/open-thought/reasoning-gym, `pip install -e ".[envs]"`)
by name, as single-turn prompts whose reward is the task's own `score_answer` (`reward=reasoning_gym`).

Generation. `rg.create_dataset(task, seed=s, size=n, **config[task])` is a procedural generator: entry i
is a pure function of (task, knobs, s, n, i) (most tasks draw it from `random.Random(s + i)`). `config` maps
task names to their knobs, so a run switches `data.task` without touching it; a task it does not name gets
reasoning-gym's defaults, and a name in it that is no task fails. Entries are made when first needed and
cached for the process (`entry`), so a costly task (countdown: ~54 ms an entry on a busy 2-core machine)
costs its time as batches draw it, not `size` entries up front; `demonstrations` does generate all `size`
(the warm-up's cache key hashes every demonstration).

- Training: `size` examples generated from the run's data seed (`train_seed(seed, 0)`), so every run seed
  trains on its own draw of problems. Order: `rlvr.data.order.batch_indices` over 0..size-1 (a seeded
  shuffle per epoch; `shuffle: false` = generator order), a pure function of (seed, step).
- Held out: `eval_size` examples generated from the fixed `eval_seed`, identical for every run seed, made
  at construction. Disjoint from training by the prompt the policy sees: a training example whose prompt
  is a held-out prompt is replaced by example i of the next training seed (`train_seed(seed, k)`, k = 1, 2,
  …), so position i stays a function of (seed, i). A task whose config gives so few distinct prompts that
  `MAX_DRAWS` draws in a row are held out fails, naming `data.eval_size`; training example 0 is drawn at
  construction so that a held-out set covering the whole task fails at start.

References. The reward needs the entry itself (`score_answer(answer, entry)` reads its metadata; ARC's
metadata holds tuples that a JSON round trip would turn into lists, so a JSON copy of the entry scores a
right ARC answer 0.05). So an `Example.reference` *names* its entry: the JSON object
`{"answer", "task", "config", "seed", "size", "index"}` (`EntryKey`), from which `reward=reasoning_gym`
regenerates it (in this process: a cache hit). `answer` (the task's own, null for tasks with many right
answers) is there for readers of samples/ and as a check: a regenerated entry with another answer is a
grading error, not a silent misgrade.

Prompt = `prompt_template.format(question=entry["question"], metadata=entry["metadata"])`: `{question}` is
the task's own wording; `{metadata[expression]}` and the like rephrase it compactly (the default: two-term
addition from `basic_arithmetic` written `"57 + 100 ="`, short enough for the tiny model's 32 positions; its
alphabet has no space, which it reads as `<unk>`, the same token everywhere). Warm-up demonstrations
(`demonstrations`, a template over `{answer}`, null = none): each training example's prompt with
`demonstrations.format(answer=entry["answer"])` as the completion, which must be what the reward extracts
(`"{answer}"` for `reward.extract=completion`, `"<answer>{answer}</answer>"` for `reward.extract=tag`).

Reproducibility across processes: in reasoning-gym 0.1.25 the entries of five tasks depend on Python's
string hashing (`HASH_SEED_DEPENDENT`, measured: three entries of every task under two values of
PYTHONHASHSEED), so a run of them resumed in a new process, or `rlvr eval`, sees other problems unless
PYTHONHASHSEED is fixed; choosing one warns.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

from rlvr.data.order import batch_indices
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra
from rlvr.seeds import sub_seed
from rlvr.types import Demonstration, Example

rg = lazy_import("reasoning_gym")
log = logging.getLogger(__name__)

PACKAGE = Package("reasoning_gym", pip_extra("envs"), ("reasoning-gym",))
"""reasoning-gym on the import path: checked by every run with data= or reward=reasoning_gym at start."""
CAPABILITY = "reasoning_gym_entries"
"""What this source gives `reward=reasoning_gym` (rlvr/protocols.py CAPABILITIES)."""
SEED_LIMIT = 2**31
"""Generator seeds and sizes stay below this, so seed + index < 2**32 (pool_matrix seeds numpy with it)."""
MAX_DRAWS = 64
"""Training seeds tried for one position before its prompts are judged all held out."""
HASH_SEED_DEPENDENT = frozenset({"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note",
                                 "word_ladder"})
"""Tasks whose entries differ under another PYTHONHASHSEED (reasoning-gym 0.1.25)."""


def train_seed(seed: int, k: int) -> int:
    """The generator seed of the k-th training draw (k = 0: every position's first) of a run's data seed."""
    return sub_seed(seed, f"reasoning_gym/train/{k}") % SEED_LIMIT


@cache
def dataset(task: str, config_json: str, seed: int, size: int) -> Any:
    """The reasoning-gym dataset object (it generates and scores), one per (task, config, seed, size)."""
    return rg.create_dataset(task, seed=seed, size=size, **json.loads(config_json))


@cache
def entry(task: str, config_json: str, seed: int, size: int, index: int) -> dict[str, Any]:
    """Entry `index` ({"question", "answer", "metadata"}); made once per process."""
    return dataset(task, config_json, seed, size)[index]


@dataclass(frozen=True)
class EntryKey:
    """What an Example's reference holds: enough to regenerate its reasoning-gym entry."""

    answer: str | None
    """The entry's answer (for readers and as a check); null for tasks with many right answers."""
    task: str
    config: dict[str, Any]
    seed: int
    size: int
    index: int

    @property
    def config_json(self) -> str:
        return json.dumps(self.config, sort_keys=True)

    def reference(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def parse(cls, reference: str) -> EntryKey:
        """The key a `reference()` wrote; ValueError for anything else (a reference from another source)."""
        try:
            fields = json.loads(reference)
            key = cls(**fields)
        except (json.JSONDecodeError, TypeError) as err:
            raise ValueError(f"not a reasoning-gym entry reference ({err}): {reference[:200]!r}") from err
        return key

    def entry(self) -> dict[str, Any]:
        return entry(self.task, self.config_json, self.seed, self.size, self.index)

    def dataset(self) -> Any:
        return dataset(self.task, self.config_json, self.seed, self.size)


def template_fields(template: str, allowed: set[str], key: str) -> None:
    """Fail unless `template` is a str.format template using at least one field, each rooted in `allowed`
    (`metadata[expression]` is rooted in `metadata`)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ValueError(f"{key}={template!r} is not a str.format template ({err}); a literal brace is {{{{ or }}}}"
                         ) from err
    roots = {f.split("[")[0].split(".")[0] for f in fields}
    if not roots or not roots <= allowed:
        raise ValueError(f"{key}={template!r} must use {' or '.join(f'{{{a}}}' for a in sorted(allowed))} and no "
                         f"other field (found {sorted(roots) or 'none'})")


def task_config(config: Mapping[str, Any], task: str) -> dict[str, Any]:
    """`task`'s knobs from `data.config` (each task's, by name; none = reasoning-gym's defaults). Every name in
    it must be a task, so that a misspelt one fails instead of being ignored."""
    if not isinstance(config, Mapping):
        raise ValueError(f"data.config={config!r} must map task names to their knobs ({{}}: every task's defaults)")
    for name, knobs in config.items():
        resolve_task(name, f"data.config.{name}: {name}")
        if knobs is not None and not isinstance(knobs, Mapping):
            raise ValueError(f"data.config.{name}={knobs!r} must be a dict of {name}'s config fields")
    return dict(config.get(task) or {})


def resolve_task(task: str, where: str | None = None) -> type:
    """The task's config dataclass; an unknown name fails listing the close ones."""
    registry = rg.factory.DATASETS
    if task not in registry:
        close = difflib.get_close_matches(task, registry, n=5, cutoff=0.6)
        hint = f"close: {', '.join(close)}" if close else (
            f"{len(registry)} tasks: python -c \"import reasoning_gym.factory as f; print(sorted(f.DATASETS))\"")
        raise ValueError(f"{where or f'data.task={task}'} is not a reasoning-gym task ({hint})")
    return registry[task][1]


class ReasoningGym:
    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({CAPABILITY}), machine=(PACKAGE,))

    def __init__(
        self,
        seed: int,
        task: str,
        config: dict[str, dict[str, Any]],
        size: int,
        eval_size: int,
        eval_seed: int,
        prompt_template: str,
        shuffle: bool,
        demonstrations: str | None,
    ) -> None:
        if not 0 < size < SEED_LIMIT:
            raise ValueError(f"data.size={size} must be in [1, 2**31)")
        if not 0 <= eval_size < SEED_LIMIT:
            raise ValueError(f"data.eval_size={eval_size} must be in [0, 2**31) (0 = no held-out set)")
        if not 0 <= eval_seed < SEED_LIMIT:
            raise ValueError(f"data.eval_seed={eval_seed} must be in [0, 2**31)")
        template_fields(prompt_template, {"question", "metadata"}, "data.prompt_template")
        if demonstrations is not None:
            template_fields(demonstrations, {"answer"}, "data.demonstrations")
        self.seed, self.task, self.size, self.shuffle = seed, task, size, shuffle
        self.prompt_template, self.demonstration_template = prompt_template, demonstrations
        self.config = task_config(config, task)
        self._config_json = json.dumps(self.config, sort_keys=True)
        self._check_config(resolve_task(task))
        if task in HASH_SEED_DEPENDENT and os.environ.get("PYTHONHASHSEED", "random") == "random":
            log.warning("data.task=%s: its entries depend on Python's string hashing; set PYTHONHASHSEED (e.g. "
                        "PYTHONHASHSEED=0) so that a resumed run or rlvr eval sees the same problems", task)
        self._eval = [self._example(self._key(eval_seed, eval_size, i)) for i in range(eval_size)]
        self._held_out = {e.prompt for e in self._eval}
        self._train_key(0)

    def _check_config(self, config_class: type) -> None:
        takes = [f.name for f in dataclasses.fields(config_class) if f.name not in ("seed", "size")]
        unknown = sorted(set(self.config) - set(takes))
        if unknown:
            raise ValueError(f"data.config.{self.task} sets {unknown}, which {self.task} does not take (it takes "
                             f"{takes}; data.size and the seeds set seed and size)")
        try:
            dataset(self.task, self._config_json, train_seed(self.seed, 0), self.size)
        except Exception as err:  # noqa: BLE001 - whatever reasoning-gym's validation raises is a config error
            raise ValueError(f"data.task={self.task} with data.config.{self.task}={self.config}: reasoning-gym "
                             f"refuses it: {type(err).__name__}: {err}") from err

    def _key(self, seed: int, size: int, index: int) -> EntryKey:
        answer = entry(self.task, self._config_json, seed, size, index)["answer"]
        return EntryKey(answer, self.task, self.config, seed, size, index)

    def _example(self, key: EntryKey) -> Example:
        e = key.entry()
        try:
            prompt = self.prompt_template.format(question=e["question"], metadata=e["metadata"])
        except (KeyError, IndexError, AttributeError, TypeError) as err:
            raise ValueError(f"data.prompt_template={self.prompt_template!r} does not fit data.task={self.task}'s "
                             f"entries ({type(err).__name__}: {err}); their metadata holds "
                             f"{sorted(e['metadata'])}") from err
        return Example(prompt, key.reference())

    def _train_key(self, index: int) -> EntryKey:
        """Training position `index`: the first of its draws whose prompt is not held out."""
        for k in range(MAX_DRAWS):
            key = self._key(train_seed(self.seed, k), self.size, index)
            if self._example(key).prompt not in self._held_out:
                return key
        raise ValueError(f"data.task={self.task}: training example {index} was a held-out prompt in all {MAX_DRAWS} "
                         f"draws; data.config.{self.task}={self.config} gives too few distinct prompts for "
                         f"data.eval_size={len(self._eval)}")

    def batch(self, step: int, size: int) -> list[Example]:
        return [self._example(self._train_key(i))
                for i in batch_indices(step, size, self.size, self.seed, self.shuffle)]

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def demonstrations(self) -> list[Demonstration]:
        return list(self._demonstrations)

    @cached_property
    def _demonstrations(self) -> list[Demonstration]:
        if self.demonstration_template is None:
            return []
        demos = []
        for i in range(self.size):
            key = self._train_key(i)
            if key.answer is None:
                raise ValueError(f"data.task={self.task} gives no answer to demonstrate (entry {i}'s answer is null: "
                                 "a task with many right answers); set data.demonstrations=null")
            completion = self.demonstration_template.format(answer=key.answer)
            demos.append(Demonstration(self._example(key).prompt, completion))
        return demos
