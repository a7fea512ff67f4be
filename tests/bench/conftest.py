"""Each bench under bench/ is run by a test of this folder, for real, at its smallest size, and its table is read back:
a bench that no longer runs against the code it measures fails CI instead of waiting for someone to run it."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_bench() -> Callable[..., str]:
    """run(command..., timeout=s) -> stdout: `python <command>` from the repository root, as each bench's docstring
    says to run it (`-m bench.<name> …` or `bench/step.py …`), offline; a failure shows the end of its output."""

    def run(*command: str, timeout: float = 300) -> str:
        proc = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                     f"{proc.stderr[-5000:]}"
        return proc.stdout

    return run


@pytest.fixture
def figure() -> Callable[[str, str], float]:
    """figure(pattern, text): the number `pattern`'s one group captures in `text` (the first match), checked finite: a
    table whose ratio came out NaN or infinite measured nothing."""

    def read(pattern: str, text: str) -> float:
        found = re.search(pattern, text)
        assert found, f"no {pattern!r} in:\n{text[-3000:]}"
        value = float(found.group(1).replace(",", ""))
        assert math.isfinite(value), f"{pattern!r}: {value} in:\n{text[-3000:]}"
        return value

    return read
