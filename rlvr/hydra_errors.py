"""Hydra's own composition errors, said in rlvr's words: exit status 2, no traceback, and a "did you mean".

train.py runs Hydra with HYDRA_FULL_ERROR=1, so a mistake Hydra finds while composing (an unknown key or
group, an option that does not exist, an override it cannot parse, an output folder it cannot create) reaches
train.py as the exception itself instead of Hydra's printout and exit status 1; `explain` turns it into the
message rlvr prints for its own config errors. Hydra's advice for an unknown key ("To append to your config
use +algoritm=grpo") is never repeated: followed, it adds a key nothing reads (rlvr/config_check.py refuses those too).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

TOP_LEVEL_KEYS = ("seed", "threads", "resume", "resume_allow_changes")
"""conf/train.yaml's own keys; every other top-level key of a composed config is a group's node."""

RENAMED = {
    # issue 22: the SEPA λ schedule's knobs, one node (conf/lambda_schedule.yaml) that transform=sepa*, delight_sepa
    # and hard_delight share; its kind was the key `schedule` itself
    "transform.schedule": "transform.schedule.kind",
    "transform.steps": "transform.schedule.steps",
    "transform.delay_steps": "transform.schedule.delay_steps",
    "transform.correct_rate_gate": "transform.schedule.correct_rate_gate",
    "transform.ema_decay": "transform.schedule.ema_decay",
    "transform.var_threshold": "transform.schedule.var_threshold",
    "transform.warmup_sequences": "transform.schedule.warmup_sequences",
    "transform.fixed_lambda": "transform.schedule.fixed_lambda",
}
"""Keys that moved, old name → new. An old name fails naming the new one, wherever it is caught: Hydra's "Could not
override" (`transform.delay_steps=0`, `explain` below), a key the constructor takes no such argument for
(`+transform.delay_steps=0`, rlvr/config_check.py's check_types), a scalar where a node now is
(`transform.schedule=auto`, rlvr/transform/sepa_controller.py)."""


def renamed(key: str, *value: object) -> str | None:
    """`<key> is now <new key>` for a key of RENAMED, else None; with the value given for it (a scalar), also
    `(say <new key>=<value>)`."""
    new = RENAMED.get(key)
    if new is None:
        return None
    say = ""
    if value and (value[0] is None or isinstance(value[0], str | int | float)) and value[0] != "":
        shown = "null" if value[0] is None else str(value[0]).lower() if isinstance(value[0], bool) else value[0]
        say = f" (say {new}={shown})"
    return f"{key} is now {new}{say}"


def groups(conf: Path) -> list[str]:
    """The config groups: conf/'s folders (hydra/launcher too: `hydra/launcher=slurm`)."""
    found = [p.name for p in conf.iterdir() if p.is_dir() and p.name != "hydra"] if conf.is_dir() else []
    return sorted(found + ["hydra/launcher"])


def options(conf: Path, group: str) -> list[str]:
    folder = conf / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def closest(word: str, candidates: list[str]) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def override_for(key: str, argv: list[str]) -> str:
    """The command-line override that set `key` (`algoritm=grpo`), else `key` itself."""
    return next((a for a in argv if re.match(rf"^[+~]*{re.escape(key)}(=|$)", a)), key)


def unknown_top_level_key(key: str, value: object, conf: Path) -> str:
    """An unknown top-level key, named with the nearest group or key (the message rlvr/config_check.py prints too)."""
    suggestion = closest(key, groups(conf) + list(TOP_LEVEL_KEYS))
    hint = (f"did you mean {suggestion}={value}?" if suggestion else
            f"the groups: {', '.join(groups(conf))}; the keys: {', '.join(TOP_LEVEL_KEYS)}")
    return f"{key}: no config group or key of that name, so nothing would read it ({hint})"


def explain(err: BaseException, argv: list[str], conf: Path, multirun: bool) -> str | None:
    """rlvr's message for a Hydra error raised before the job started, or None for any other exception."""
    from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(err, MissingConfigException) and err.missing_cfg_file:  # (an OSError too)
        group, _, option = str(err.missing_cfg_file).rpartition("/")
        known = list(err.options or options(conf, group))
        suggestion = closest(option, known)
        hint = f"did you mean {group}={suggestion}? " if suggestion else ""
        return f"{group}={option}: no option {option!r} in group {group} ({hint}options: {', '.join(known)})"
    if isinstance(err, OSError):  # Hydra makes the output folder and writes .hydra/ and the log before the job
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        where = f" ({err.filename})" if err.filename else ""
        return (f"{key}: cannot create or write the output folder{where}: {err.strerror or err}; set {key} to a "
                "folder you can write")
    if isinstance(err, OverrideParseException):
        first = str(err).splitlines()[0]
        return (f"cannot parse an override: {first} (the grammar: "
                "https://hydra.cc/docs/advanced/override_grammar/basic/)")
    if isinstance(err, ConfigCompositionException):
        match = re.match(r"Could not override '([^']+)'", str(err))
        if match is None:
            return str(err).splitlines()[0]
        key = match.group(1)
        given = override_for(key, argv)
        value = given.partition("=")[2]
        if (now := renamed(key, value)) is not None:
            return f"{given}: {now}"
        if "." not in key:
            return unknown_top_level_key(key, value, conf).replace(key, given, 1)
        parent, _, leaf = key.rpartition(".")
        choices = [a for a in argv if re.match(r"^[\w/]+=[^,]*$", a)]  # the groups chosen (algorithm=maxrl)
        suggestion = closest(leaf, keys_under(conf, parent, choices))
        hint = f" (did you mean {parent}.{suggestion}={value}?)" if suggestion else ""
        return f"{given}: {parent} has no key {leaf!r}{hint}"
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return str(err).splitlines()[0]
    return None


def keys_under(conf: Path, dotted: str, choices: list[str]) -> list[str]:
    """The keys of node `dotted` in the config composed with the group `choices` the command made (empty when it
    cannot be composed)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig

    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
            node = compose("train", overrides=choices)
        for part in dotted.split("."):
            node = node[part]
    except Exception:  # noqa: BLE001 - a suggestion is a courtesy: without one the message still names the key
        return []
    return [str(k) for k in node] if isinstance(node, DictConfig) else []
