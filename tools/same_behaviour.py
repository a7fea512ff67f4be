"""Does a change leave runs bit-for-bit as they were? Runs four short runs of this checkout into a folder, or
compares two such folders row by row, every field but the timing ones (wall-clock seconds, rates, memory).

    python tools/same_behaviour.py run  /tmp/before      # on the old checkout
    python tools/same_behaviour.py run  /tmp/after       # on the new one
    python tools/same_behaviour.py diff /tmp/before /tmp/after

The runs: the default run (300 steps), a multi-turn run (env=guess), an overlapped run (sampling one step ahead)
and a 2-process run (backend=fsdp under torchrun), each also writing its composed config (`--cfg job`), compared
as text. A run's warm-up is read from the cache, so `run` takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

RUNS = {
    "default": [],
    "guess": ["env=guess", "trainer.max_steps=30"],
    "overlap": ["trainer.off_policy_steps=1", "correction=token_tis",
                "algorithm.loss.correction.pi_old=decoupled", "trainer.max_steps=60"],
    "fsdp2": ["backend=fsdp", "trainer.max_steps=30"],
}
TIMING = re.compile(r"(_s$|_share$|_seconds$|per_second|_time$|^time/|^async/.*_frac$|throughput|memory|_mb$|_gb$"
                    r"|rss|wall)")


def run(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, overrides in RUNS.items():
        out = folder / name
        if (out / "summary.json").exists():
            continue
        launch = ["torchrun", "--nproc-per-node", "2"] if name == "fsdp2" else [sys.executable]
        config = subprocess.run([sys.executable, "train.py", *overrides, "--cfg", "job"], capture_output=True,
                                text=True, check=True).stdout
        (folder / f"{name}.yaml").write_text(config)
        command = [*launch, "train.py", *overrides, f"hydra.run.dir={out}", "resume=never"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def diff(before: Path, after: Path) -> int:
    differences = 0
    for name in RUNS:
        if (before / f"{name}.yaml").read_text() != (after / f"{name}.yaml").read_text():
            print(f"{name}: the composed config differs")
            differences += 1
        a, b = rows(before / name / "metrics.jsonl"), rows(after / name / "metrics.jsonl")
        ignored: set[str] = set()
        bad = [] if len(a) == len(b) else [f"{len(a)} rows before, {len(b)} after"]
        for i, (x, y) in enumerate(zip(a, b)):
            keys = set(x) | set(y)
            ignored |= {k for k in keys if TIMING.search(k)}
            bad += [f"row {i} {k}: {x.get(k)!r} → {y.get(k)!r}" for k in sorted(keys)
                    if not TIMING.search(k) and not same(x.get(k), y.get(k))]
        print(f"{name}: {len(a)} rows, {len(bad)} differences (timing fields ignored: {', '.join(sorted(ignored))})")
        print("\n".join(f"  {line}" for line in bad[:20]))
        differences += len(bad)
    return 1 if differences else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(Path(sys.argv[2]).resolve())
    elif sys.argv[1:2] == ["diff"]:
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
