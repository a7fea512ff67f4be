"""Rows of string columns from a local `.jsonl`/`.parquet` file or from a hub dataset.

Every failure names the config key that pointed here, the file or dataset, and what was expected; the
hub is read through `datasets` (the `[hub]` extra), imported only when a source actually needs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.data.jsonl import check_file, read_jsonl
from rlvr.protocols import Needs
from rlvr.requirements import Package, pip_extra

PATH_KEYS = ("path", "eval_path")
"""The settings of a table-reading source that name local files; null reads the hub dataset instead."""


def table_needs(settings: Mapping[str, Any]) -> Needs:
    """What reading a source's tables needs: `datasets` (the `[hub]` extra) when a path is null, so a hub
    dataset is read; pyarrow (which `datasets` brings) for a .parquet file. A source's `needs`."""
    hub = [f"data.{key}" for key in PATH_KEYS if key in settings and settings[key] is None]
    parquet = [f"data.{key}" for key in PATH_KEYS if str(settings.get(key) or "").endswith(".parquet")]
    machine = []
    if hub:
        machine.append(Package("datasets", f"{pip_extra('hub')} ({' and '.join(hub)} null: the hub dataset is read), "
                                           "or set them to local .jsonl/.parquet files"))
    if parquet:
        machine.append(Package("pyarrow", f"{pip_extra('hub')} ({' and '.join(parquet)}: a .parquet file), "
                                          "or use .jsonl files"))
    return Needs(machine=tuple(machine))


def read_local(path: str, columns: tuple[str, ...], config_key: str) -> list[dict[str, Any]]:
    """The `columns` of every row of a .jsonl or .parquet file, checked to be strings."""
    file = Path(path)
    if file.is_dir():  # a folder: named as one, with the files in it
        check_file(file, config_key, f"a .jsonl or .parquet file with columns {list(columns)}", (".jsonl", ".parquet"))
    if file.suffix == ".jsonl":
        numbered = read_jsonl(file, columns, config_key)
    elif file.suffix == ".parquet":
        check_file(file, config_key, "a .parquet file", (".parquet",))
        import pyarrow.parquet as pq

        names = pq.read_schema(file).names
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(
                f"{config_key}={path!r}: missing column(s) {missing}; expected {list(columns)}, found {names}"
            )
        numbered = list(enumerate(pq.read_table(file, columns=list(columns)).to_pylist(), start=1))
    else:
        raise ValueError(f"{config_key}={path!r}: expected a .jsonl or .parquet file with columns {list(columns)}")
    for n, row in numbered:
        if not all(isinstance(row[c], str) for c in columns):
            unit = "line" if file.suffix == ".jsonl" else "row"
            raise ValueError(f"{config_key}={path!r} {unit} {n}: expected strings in {list(columns)}, got {row!r:.200}")
    return [row for _, row in numbered]


def read_hub(
    dataset: str, configs: Sequence[str | None], split: str, columns: tuple[str, ...], config_key: str
) -> list[dict[str, Any]]:
    """Rows of `dataset` for each config (subset), in order; `config_key` is the null key that sent us here."""
    advice = f"or set {config_key} to a local .jsonl/.parquet file with columns {list(columns)}"
    try:
        import datasets
    except ImportError as e:
        raise RuntimeError(
            f"{config_key} is null, so {dataset} is read from the hub, but the `datasets` package is missing: "
            f"install rlvr[hub] {advice}"
        ) from e
    rows: list[dict[str, Any]] = []
    for config in configs:
        try:
            table = datasets.load_dataset(dataset, config, split=split)
            rows.extend({c: r[c] for c in columns} for r in table)
        except Exception as e:  # offline, unknown subset/split, network: all end the same way
            raise RuntimeError(
                f"{config_key} is null, but loading {dataset} subject={config!r} split={split!r} from the hub "
                f"failed ({type(e).__name__}: {e}); fix the subset/split, go online {advice}"
            ) from e
    return rows
