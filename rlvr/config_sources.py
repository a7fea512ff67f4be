"""Where a run's options come from: the folders Hydra composes from, so that whatever reads option files by path
(the labels' option names, a condition's choices, an alias) knows an option added in a `hydra.searchpath` folder
as it knows a built-in one.

Inside a Hydra job these are its file config sources in Hydra's order of precedence: the primary folder (conf/, or
train.py's `--config-dir`) first, then each `hydra.searchpath=[file://...]` folder; an option file found in an
earlier folder hides one of the same name in a later one, as in Hydra. Outside a job (tests composing conf/, the
CLI reading a run folder), the repository's conf/.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_CONF = Path(__file__).resolve().parents[1] / "conf"
"""The repository's own config folder."""
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""`yaml.safe_load`'s loader with libyaml's parser where PyYAML has it: the same values (the constructor and the
resolver are the same Python classes), parsed ~6x faster; a run reads some sixty option files this way before it
starts (`rlvr.labels.target_names`)."""


def read_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, parsed by libyaml where PyYAML has it (`SAFE_LOADER`)."""
    return yaml.load(text, Loader=SAFE_LOADER)  # SafeLoader or its libyaml twin


def config_dirs() -> tuple[Path, ...]:
    """The folders of this Hydra job's file config sources, in precedence order; else (REPO_CONF,)."""
    hydra_config = sys.modules.get("hydra.core.hydra_config")  # never imported: no Hydra job is running
    if hydra_config is not None and hydra_config.HydraConfig.initialized():
        sources = hydra_config.HydraConfig.get().runtime.config_sources
        found = tuple(Path(source.path) for source in sources if source.schema == "file")
        if found:
            return found
    return (REPO_CONF,)


def option_file(dirs: Sequence[Path], group: str, option: str) -> Path | None:
    """`<group>/<option>.yaml` in the first folder of `dirs` that holds it, or None."""
    return next((path for path in (d / group / f"{option}.yaml" for d in dirs) if path.is_file()), None)


def group_options(dirs: Sequence[Path], group: str) -> list[str]:
    """The option names of `group` across `dirs` (each folder's `<group>/*.yaml`), sorted."""
    return sorted({path.stem for d in dirs for path in (d / group).glob("*.yaml")})
