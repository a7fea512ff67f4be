"""How many torch threads a run uses (`threads=` in conf/train.yaml).

`threads: auto` (the default) is

    in a SLURM job:  SLURM_CPUS_PER_TASK, the cores allocated to this job alone
    elsewhere:       half the cores this process may run on (at least 1, at most 8)

On a machine shared with other jobs, torch's OpenMP threads wait for each other at every parallel region:
when one of them is descheduled, the others spin until it comes back. Measured on a 2-core machine
(`python -m bench.threads`, docs/cpu-recipe.md#threads): with one other CPU-bound job running, 2 threads
made a shortened default run several times slower than 1 thread, while on the idle machine 2 threads were
about 1.2–1.4× faster. A default has to hold on a busy machine, so it leaves half of the cores to the rest of
the machine: 1 thread on 2 cores. The cap of 8 is not measured here (the development machine has 2 cores);
the tiny model's matrices are too small to gain from more. Set `threads=N` to choose, `threads=null` for
torch's own default (one per core).
"""

from __future__ import annotations

import os
from typing import Literal

MAX_AUTO = 8


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve(setting: int | Literal["auto"] | None) -> int | None:
    """The thread count for `threads=<setting>`; None leaves torch's default."""
    if setting != "auto":
        return setting
    allocated = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if allocated.isdigit() and int(allocated) > 0:
        return int(allocated)
    return max(1, min(MAX_AUTO, usable_cores() // 2))
