"""`threads: auto`: half the usable cores (a SLURM job: its CPUs), so that a run on a busy 2-core machine
uses 1 thread (bench/threads.py measures why); bad values are config errors."""

import pytest

from composing import compose_config
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.threads import MAX_AUTO, resolve


def test_auto_threads_leave_half_the_cores_and_follow_slurm(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    for cores, expected in ((1, 1), (2, 1), (3, 1), (4, 2), (16, 8), (64, MAX_AUTO)):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert resolve("auto") == expected, cores
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")  # a SLURM job's CPUs are its own
    assert resolve("auto") == 6
    assert resolve(3) == 3 and resolve(None) is None


def test_the_default_is_auto():
    assert compose_config([]).threads == "auto"


@pytest.mark.parametrize("value", ["0", "many", "-2", "true"])
def test_bad_thread_counts_are_config_errors(value):
    with pytest.raises(ConfigError, match=r"threads=.*expected auto, a positive integer or null"):
        check(compose_config([f"threads={value}"]))
