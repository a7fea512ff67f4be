"""Which options give a capability (rlvr/protocols.py `CAPABILITIES`), read from the option files themselves: each
`<group>/<option>.yaml` of the capability's groups, in the run's config folders (rlvr/config_sources.py), whose
`_target_` class's `needs(settings)` provides it with the option's own values (over those of the options of its
group it extends). Said when a chosen component needs what no chosen one gives (rlvr/config_check.py
`unmet_needs`), so the message names every option that would, one added in a search-path folder included."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rlvr.config_sources import config_dirs, group_options, option_file
from rlvr.protocols import Capability, Component


def option_settings(dirs: Sequence[Path], group: str, option: str) -> dict[str, Any]:
    """The option's values as its file states them (under `<group>:` in a `# @package _global_` file), over those
    of the options of its group it names in its defaults list (`backend/fsdp.yaml`: `defaults: [local]`);
    interpolations are left as written."""
    path = option_file(dirs, group, option)
    data = yaml.safe_load(path.read_text()) if path is not None else None
    if not isinstance(data, dict):
        return {}
    settings: dict[str, Any] = {}
    for parent in data.get("defaults") or []:
        if isinstance(parent, str) and parent != "_self_" and option_file(dirs, group, parent) is not None:
            settings.update(option_settings(dirs, group, parent))
    nested = data.get(group)
    own: dict[str, Any] = nested if isinstance(nested, dict) else data  # a global package nests its group
    settings.update({k: v for k, v in own.items() if k != "defaults"})
    return settings


def default_options(dirs: Sequence[Path]) -> dict[str, str]:
    """Each group's default option, from train.yaml's defaults list (`reward: exact`)."""
    train = next((d / "train.yaml" for d in dirs if (d / "train.yaml").is_file()), None)
    entries = (yaml.safe_load(train.read_text()) or {}).get("defaults", []) if train is not None else []
    return {k: v for entry in entries if isinstance(entry, dict) for k, v in entry.items() if isinstance(v, str)}


def with_groups(dirs: Sequence[Path], defaults: dict[str, str], settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` with each value that is a whole group (`reward: ${reward}`, env=retry's verifier) read as that
    group's default option."""

    def group(value: Any) -> str | None:
        name = value[2:-1] if isinstance(value, str) and value.startswith("${") and value.endswith("}") else None
        return name if name in defaults else None

    return {k: option_settings(dirs, g, defaults[g]) if (g := group(v)) else v for k, v in settings.items()}


def providers(name: str, capability: Capability) -> list[str]:
    """`group=option` for every option of the capability's groups that gives it by its own values."""
    from hydra.utils import get_class

    dirs, found = config_dirs(), []
    defaults = default_options(dirs)
    for group in capability.groups:
        for option in group_options(dirs, group):
            settings = with_groups(dirs, defaults, option_settings(dirs, group, option))
            try:
                component: type[Component] = get_class(settings["_target_"])  # every component has `needs`
                provides = component.needs(settings).provides
            except Exception:  # noqa: BLE001 - an option whose values come from the rest of the config: not counted
                continue
            if name in provides:
                found.append(f"{group}={option}")
    return found


def how(name: str, capability: Capability) -> str:
    """What to choose or set for a missing capability: the options that give it, then its own advice."""
    options = providers(name, capability) if capability.groups else []
    choose = f"choose {', or '.join(options)}" if options else ""
    return " ".join(part for part in (choose, capability.how) if part) or "no option gives it"
