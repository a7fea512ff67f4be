"""`<run>/base/`: the model RL started from, so a run folder is usable on its own (`rlvr eval`, `sample`,
`export`) on any machine, without the warm-up cache or the preset's code.

    base/
      base.json                  what the weights are (below)
      config.json                the model's config (save_pretrained)
      generation_config.json     its EOS/pad ids
      tokenizer.json, tokenizer_config.json, …   the tokenizer (save_pretrained), pad token included
      model.safetensors          only when the weights were made here (see below)

`base.json`:

    weights       "model.safetensors", or for a pretrained model loaded unchanged a pointer
                  {"name_or_path", "revision", "commit"}: `commit` is the hub snapshot the local cache
                  resolved the revision to (read offline; null for a local folder or when not cached)
    sha256        of model.safetensors (null for a pointer)
    warmup_key    the SFT warm-up's cache key (rlvr/warmup.py), or null: no warm-up (or not known)
    preset        the model preset's settings without its LoRA block, and its class
    dtype, attn_implementation, trust_remote_code    how `load_base` loads the weights back

The weights are stored when the preset builds them (TinyLlama: seeded random init) or the warm-up changed
them: they are then exactly the weights LoRA (or full fine-tuning) started from. A pretrained model loaded
unchanged is a pointer: its weights are the hub's (or the local folder's), not copied into every run.

Writing is atomic (a temporary sibling folder, renamed). A resumed run whose base/ already records the same
weights (same warm-up key and preset, or the same sha256) leaves it untouched. `load_base` checks the
sha256 before loading and says what is wrong when the folder is missing, incomplete or changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.lazy import lazy_import

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

torch = lazy_import("torch")
transformers = lazy_import("transformers")

BASE_FILE = "base.json"
WEIGHTS = "model.safetensors"
MAX_SHARD = "10000GB"
"""One weights file whatever the model's size, so one sha256 names it."""


class BaseFolderError(RuntimeError):
    """A run's base/ folder is missing, incomplete or does not match its record; the message says which."""


def save_base(folder: Path, module: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, preset: object,
              warmup_key: str | None) -> Path:
    """Write `folder` (normally `<run>/base`) for `module` as it is now (after the warm-up, before LoRA)."""
    folder = Path(folder)
    record = _record(module, preset, warmup_key)
    stores = record["weights"] == WEIGHTS
    old = _read_record(folder)
    if old is not None and _same_source(old, record) and (not stores or warmup_key is not None):
        return folder  # a resumed run: the same pointer, or the same cached warm-up's weights
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tokenizer.save_pretrained(tmp)
        if stores:
            with _no_progress_bar():  # no 'Writing model shards' bar in the run's console
                module.save_pretrained(tmp, max_shard_size=MAX_SHARD)
            record["sha256"] = file_sha256(tmp / WEIGHTS)
        else:
            module.config.save_pretrained(tmp)
            module.generation_config.save_pretrained(tmp)
        (tmp / BASE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if old is not None and old == record:  # same bytes as the folder already there: keep it
            shutil.rmtree(tmp)
            return folder
        _replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load_base(folder: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model (weights checked against the recorded sha256, or fetched from where the pointer says)
    and the tokenizer, from a base/ folder written by `save_base`."""
    folder = Path(folder)
    record = read_record(folder)
    tokenizer = _tokenizer(folder, record)
    kwargs = {"dtype": getattr(torch, record["dtype"]), "attn_implementation": record["attn_implementation"],
              "trust_remote_code": record["trust_remote_code"]}
    if record["weights"] == WEIGHTS:
        verify_weights(folder, record)
        module = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    else:
        module = _load_pointer(folder, record["weights"], kwargs)
    return module, tokenizer


def read_record(folder: Path) -> dict:
    """`base.json` of `folder`; a BaseFolderError when there is none or it is unreadable."""
    record = _read_record(folder)
    if record is None:
        why = "does not exist" if not folder.is_dir() else f"has no readable {BASE_FILE}"
        raise BaseFolderError(f"{folder} {why}: the run folder does not hold its base model (base/ is written when "
                              "a run starts or resumes: a run from before then has none)")
    return record


def verify_weights(folder: Path, record: dict) -> None:
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise BaseFolderError(f"{weights} is missing (base.json records sha256 {record['sha256']})")
    found = file_sha256(weights)
    if found != record["sha256"]:
        raise BaseFolderError(f"{weights}: sha256 {found} != {record['sha256']} recorded in {folder / BASE_FILE}: "
                              "the file was changed or cut short; it is not the base this run trained on")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _record(module: PreTrainedModel, preset: object, warmup_key: str | None) -> dict:
    settings = asdict(preset) if is_dataclass(preset) and not isinstance(preset, type) else {}
    settings = {k: v for k, v in settings.items() if k != "lora"}
    name = settings.get("name_or_path")
    dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
    return {  # the weights are stored when built here (no name) or changed by the warm-up
        "weights": WEIGHTS if name is None or warmup_key is not None else _pointer(name, settings.get("revision")),
        "sha256": None,
        "warmup_key": warmup_key,
        "preset": {"class": f"{type(preset).__module__}.{type(preset).__qualname__}", **settings},
        "dtype": dtype,
        "attn_implementation": module.config._attn_implementation,
        "trust_remote_code": bool(settings.get("trust_remote_code", False)),
    }


def _pointer(name_or_path: str, revision: str | None) -> dict:
    local = Path(os.path.expanduser(name_or_path))
    if name_or_path.startswith(("/", ".", "~")) or local.exists():
        return {"name_or_path": str(local.resolve()), "revision": None, "commit": None}
    return {"name_or_path": name_or_path, "revision": revision, "commit": hub_commit(name_or_path, revision)}


def hub_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit the local hub cache resolves `revision` of `repo_id` to (offline), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(found).parent.name if isinstance(found, str) else None


def _same_source(old: dict, new: dict) -> bool:
    keys = ("weights", "warmup_key", "preset", "dtype")
    return all(old.get(k) == new.get(k) for k in keys)


def _read_record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / BASE_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _no_progress_bar():
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _replace(tmp: Path, folder: Path) -> None:
    """`tmp` becomes `folder`; an older `folder` is moved aside first and removed after."""
    aside = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if folder.exists():
        shutil.rmtree(aside, ignore_errors=True)
        folder.rename(aside)
    tmp.rename(folder)
    shutil.rmtree(aside, ignore_errors=True)


def _tokenizer(folder: Path, record: dict) -> PreTrainedTokenizerBase:
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=record["trust_remote_code"])
    except (OSError, ValueError) as err:
        raise BaseFolderError(f"{folder}: the tokenizer does not load ({err})") from err


def _load_pointer(folder: Path, pointer: dict, kwargs: dict) -> PreTrainedModel:
    name, revision = pointer["name_or_path"], pointer["commit"] or pointer["revision"]
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(name, revision=revision, **kwargs)
    except (OSError, ValueError) as err:
        at = f" at {revision}" if revision else ""
        fix = (f"copy the model folder to {name}" if Path(name).is_absolute() else
               f"download them: huggingface-cli download {name}{' --revision ' + revision if revision else ''}")
        raise BaseFolderError(f"{folder / BASE_FILE} points to the pretrained weights {name}{at}, which cannot be "
                              f"loaded here ({' '.join(str(err).split())[:300]}): {fix}") from err
