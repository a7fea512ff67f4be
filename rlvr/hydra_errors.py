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
    # the SEPA λ schedule's knobs, one node (conf/lambda_schedule.yaml) that transform=sepa*, delight_sepa
    # and hard_delight share; its kind was the key `schedule` itself
    "transform.schedule": "transform.schedule.kind",
    "transform.steps": "transform.schedule.steps",
    "transform.delay_steps": "transform.schedule.delay_steps",
    "transform.correct_rate_gate": "transform.schedule.correct_rate_gate",
    "transform.ema_decay": "transform.schedule.ema_decay",
    "transform.var_threshold": "transform.schedule.var_threshold",
    "transform.warmup_sequences": "transform.schedule.warmup_sequences",
    "transform.fixed_lambda": "transform.schedule.fixed_lambda",
    # the bound on a reward's value is the loop's, one key whatever the reward (its node is handed whole
    # to the reward's constructor, and env=retry reuses it)
    "reward.max_abs": "trainer.reward_max_abs",
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
        choices = [a for a in argv if re.match(r"^[\w/]+=[^,]*$", a)]  # the groups chosen (algorithm=maxrl)
        missing = str(getattr(err.__cause__, "full_key", "") or key)  # the first part of the key not there
        return unknown_dotted_key(given, missing if key.startswith(missing + ".") else key, value, conf, choices)
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return str(err).splitlines()[0]
    return None


def unknown_dotted_key(given: str, missing: str, value: str, conf: Path, choices: list[str]) -> str:
    """`<given>: <parent> has no key <leaf>` for the first part of a dotted key that is not there (`missing`: in
    `algorithm.los.mode` it is `algorithm.los`), with a did-you-mean for the whole key, each part matched to its
    nearest (`algorithm.loss.mode`); or, when its group composed to null (`env.max_turns=3` under env=none), that
    no component of the group is chosen, naming its options."""
    key = given.partition("=")[0].lstrip("+~")
    parent, _, leaf = missing.rpartition(".")
    composed = compose_choices(conf, choices)
    group = key.split(".")[0]
    if composed is not None and parent == group and group in composed and composed[group] is None:
        chosen = next((c.partition("=")[2] for c in choices if c.startswith(f"{group}=")), "none")
        return unchosen_group(given, group, chosen, conf)
    node = _select(composed, parent)
    path = nearest_path(node, key[len(parent) + 1:].split("."))
    part = path or nearest_path(node, [leaf])  # the whole key has no match: the part that is missing, alone
    hint = f" (did you mean {parent}.{'.'.join(part)}{f'={value}' if path else ''}?)" if part else ""
    return f"{given}: {parent} has no key {leaf!r}{hint}"


def unchosen_group(given: str, group: str, chosen: str, conf: Path) -> str:
    """A key of a group whose option builds nothing (`env=none`, `echo=none`: `env: null`): the options that do."""
    others = [o for o in options(conf, group) if o != chosen and o != "none"]
    return (f"{given}: {group}={chosen} chooses no {group}, so nothing would read {given.partition('=')[0]}; "
            f"choose one with {group}=<option> ({', '.join(others)})")


def nearest_path(node: object, parts: list[str]) -> list[str] | None:
    """`parts` with each one that `node` lacks replaced by its nearest key there; None when one has none."""
    from omegaconf import DictConfig, OmegaConf

    path: list[str] = []
    for part in parts:
        if not isinstance(node, DictConfig):
            return None
        keys = [str(k) for k in node]
        name = part if part in keys else closest(part, keys)
        if name is None:
            return None
        path.append(name)
        if len(path) < len(parts):
            node = OmegaConf.select(node, name, default=None, throw_on_resolution_failure=False)
    return path


def compose_choices(conf: Path, choices: list[str]):
    """The config composed with the group `choices` the command made, or None when it cannot be composed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
            return compose("train", overrides=choices)
    except Exception:  # noqa: BLE001 - a suggestion is a courtesy: without one the message still names the key
        return None


def _select(composed, dotted: str):
    """The node at `dotted` in `composed` (None when there is none)."""
    from omegaconf import OmegaConf

    return None if composed is None else OmegaConf.select(composed, dotted, default=None)
