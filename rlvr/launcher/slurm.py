"""`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml) asks the cluster before it submits anything.

The preset installs `SlurmChecks` as a Hydra callback. Before the sweep starts, one `sinfo` call reads each
partition's nodes (GRES, CPUs, memory), and a job array that asks for what its partition cannot give is refused,
naming the overrides that fit, with exit status 2 and no traceback. Without the check, sbatch refuses it at the
end of submitit's traceback ("Invalid generic resource (gres) specification", "Requested node configuration is
not available", "invalid partition specified"). The check refuses:

- a GPU where no node of the partition has GPU GRES. A GPU is asked for by `gpus_per_task`, `gpus_per_node`,
  `gres: gpu…`, or the same keys in `additional_parameters`. The fix is `hydra.launcher.gpus_per_task=null`;
  a count of 0 also works, since sbatch accepts `--gpus-per-task=0` on such a cluster;
- more CPUs per node (`cpus_per_task` × `tasks_per_node`; a task without `cpus_per_task` gets one) or more memory
  (`mem_gb`, per node) than the partition's largest node has. When the tasks alone are more than its CPUs, the fix
  is fewer tasks per node, with one CPU each;
- more `nodes` than the partition has, or than it has nodes big enough for one node's share (`cpus_per_task` ×
  `tasks_per_node` CPUs and `mem_gb`);
- a partition the cluster does not have;
- a `signal_delay_s` not at least 60 s shorter than `timeout_min`: SLURM may send the signal up to 60 s early
  (`SIGNAL_EARLY_S`), so SIGUSR1 ("checkpoint and requeue") could come as every attempt starts.

`rlvr doctor` reports the same problems, one line each, through `launch_problems`. Only what sinfo states for
certain is refused. A node size shown with `+` (the partition has nodes of several sizes) is not compared. A
cluster that does not answer within the timeout is submitted to as it is, and sbatch has its say. A cluster that
answers with an error (no controller, or SLURM_CONF unset) is refused, and the refusal names the error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol")
"""What `hydra/launcher=slurm` runs (`rlvr doctor` checks they are on PATH)."""
SINFO_FORMAT = "%P|%a|%G|%c|%m|%D"
"""Partition (`*` marks the default), availability, GRES, CPUs, memory (MB) and node count of each group of alike
nodes."""
SUBMIT_SINFO_TIMEOUT_S = 30.0
SIGNAL_EARLY_S = 60
"""sbatch --signal: "Due to the resolution of event handling by Slurm, the signal may be sent up to 60 seconds
earlier than specified" (man sbatch). On the dev cluster it came 1 s into an attempt of timeout_min=1 with
signal_delay_s=45, before Python had a handler: the task died of SIGUSR1."""
DEV_CLUSTER_CONF = Path("/tmp/rlvr-slurm/etc/slurm.conf")
"""Where launchers/slurm-cluster.sh writes the dev cluster's config (its default SLURM_TEST_ROOT)."""
GPU_KEYS = ("gpus_per_task", "gpus_per_node", "gres")
"""The launcher's own keys that ask for GPUs (hydra-submitit-launcher's SlurmQueueConf)."""
SBATCH_GPU_OPTIONS = ("gpus", "gpus_per_task", "gpus_per_node", "gres")
"""sbatch options that ask for GPUs, as `additional_parameters` keys (dashes or underscores)."""


@dataclass(frozen=True)
class NodeGroup:
    """One sinfo row of a partition: nodes alike in GRES, CPUs and memory."""

    gres: str
    """As sinfo prints it: `(null)`, `gpu:4`, `gpu:a100:4(S:0-1),shard:8`."""
    cpus: int | None
    """None: not one number (sinfo's `4+`: the partition has nodes of several sizes)."""
    memory_mb: int | None
    count: int | None = 1
    """How many nodes the group has (sinfo's `%D`); None: not a number."""

    @property
    def has_gpus(self) -> bool:
        return any(item.strip().split(":")[0] == "gpu" for item in self.gres.split(","))

    def holds(self, cpus: int, memory_mb: float) -> bool:
        """One of these nodes has `cpus` CPUs and `memory_mb` MB, or sinfo does not say for certain that it has not."""
        return (self.cpus is None or self.cpus >= cpus) and (self.memory_mb is None or self.memory_mb >= memory_mb)


@dataclass(frozen=True)
class Partition:
    name: str
    available: str
    default: bool
    nodes: tuple[NodeGroup, ...]

    @property
    def has_gpus(self) -> bool:
        return any(n.has_gpus for n in self.nodes)

    def largest(self, field: str) -> int | None:
        """The most CPUs (`cpus`) or memory (`memory_mb`) of one node, or None when sinfo does not say for certain."""
        values = [getattr(n, field) for n in self.nodes]
        return None if not values or None in values else max(values)

    def count(self, cpus: int = 0, memory_mb: float = 0) -> int | None:
        """How many of its nodes have `cpus` CPUs and `memory_mb` MB (all of them, by default; one whose size sinfo
        does not state counts), or None when sinfo does not say how many nodes a group has."""
        counts = [n.count for n in self.nodes if n.holds(cpus, memory_mb)]
        known = [c for c in counts if c is not None]
        return None if len(known) < len(counts) else sum(known)

    def describe(self) -> str:
        nodes = "; ".join(f"{_show(n.count)} × {_show(n.cpus)} CPUs, {_show(n.memory_mb)} MB, "
                          f"{'GRES ' + n.gres if n.gres != '(null)' else 'no GPU'}" for n in self.nodes)
        return f"{self.name}{'*' if self.default else ''} ({self.available}; nodes: {nodes})"


@dataclass(frozen=True)
class Cluster:
    """What `sinfo` answered under $SLURM_CONF, as sbatch would see the cluster."""

    ok: bool
    detail: str
    partitions: tuple[Partition, ...] = ()
    answered: bool = True
    """False: sinfo did not answer in time (the cluster may still take the job); True with `ok` False: it
    answered with an error, or is not there at all."""

    def partition(self, name: str | None) -> Partition | None:
        """The partition `name` names, or for None the one sbatch uses by default (None if it cannot be told)."""
        if name is not None:
            return next((p for p in self.partitions if p.name == name), None)
        defaults = [p for p in self.partitions if p.default]
        return defaults[0] if len(defaults) == 1 else self.partitions[0] if len(self.partitions) == 1 else None


@dataclass(frozen=True)
class Problem:
    """One setting of the launcher that the cluster cannot give, and the override that fits."""

    setting: str
    """`hydra.launcher.gpus_per_task=1`"""
    why: str
    fix: str
    """`hydra.launcher.gpus_per_task=null`"""

    def __str__(self) -> str:
        return f"{self.setting}: {self.why}"


def query_cluster(timeout_s: float) -> Cluster:
    """One `sinfo` call: every partition with its nodes, or why there is no cluster to submit to."""
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF unset"
    if shutil.which("sinfo") is None:
        return Cluster(False, "sinfo is not on PATH")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", SINFO_FORMAT], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Cluster(False, f"sinfo -h did not answer within {timeout_s:g} s ({where})", answered=False)
    partitions = parse_sinfo(proc.stdout) if proc.returncode == 0 else ()
    if not partitions:
        errors = proc.stderr.strip().splitlines()
        if not conf and DEV_CLUSTER_CONF.is_file():
            hint = f"; the dev cluster's config is {DEV_CLUSTER_CONF}: eval \"$(bash launchers/slurm-cluster.sh env)\""
        else:
            hint = "; a single-node dev cluster: bash launchers/ci-slurm.sh"
        error = errors[-1] if errors else "no partitions"
        return Cluster(False, f"no cluster answers sinfo -h ({where}): {error}{hint}")
    return Cluster(True, f"sinfo answers ({where}): partitions {', '.join(p.describe() for p in partitions)}",
                   partitions)


def parse_sinfo(text: str) -> tuple[Partition, ...]:
    """Partitions from `sinfo -h -o SINFO_FORMAT` rows, in sinfo's order."""
    found: dict[str, tuple[str, bool, list[NodeGroup]]] = {}
    for row in text.splitlines():
        fields = row.strip().split("|")
        if len(fields) != 6:
            continue
        name, available, gres, cpus, memory, count = fields
        entry = found.setdefault(name.rstrip("*"), (available, name.endswith("*"), []))
        entry[2].append(NodeGroup(gres, _count(cpus), _count(memory), _count(count)))
    return tuple(Partition(name, available, default, tuple(nodes))
                 for name, (available, default, nodes) in found.items())


def _show(count: int | None) -> str:
    return "?" if count is None else str(count)


def _count(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def asks_for_gpus(key: str, value: Any) -> bool:
    """Whether a launcher value asks for at least one GPU: `1`, `a100:2`, `gpu:1` (gres) do; null, 0 and a
    gres without `gpu` (`shard:2`) do not."""
    if value is None or value is False:
        return False
    for item in str(value).split(","):
        parts = item.strip().split(":")
        if key.replace("-", "_") == "gres" and parts[0] != "gpu":
            continue
        count = parts[-1].split("(")[0]  # gres: gpu[:type][:count]; gpus: [type:]count
        if not count.isdigit() or int(count) > 0:  # no count (`gpu`, `a100`): one
            return True
    return False


def gpu_requests(launcher: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(setting, the override that removes it) for every launcher value that asks for GPUs."""
    found = [(f"hydra.launcher.{key}={launcher.get(key)}", f"hydra.launcher.{key}=null") for key in GPU_KEYS
             if asks_for_gpus(key, launcher.get(key))]
    extra = launcher.get("additional_parameters") or {}
    found += [(f"hydra.launcher.additional_parameters.{key}={value}", f"~hydra.launcher.additional_parameters.{key}")
              for key, value in extra.items()
              if key.replace("-", "_") in SBATCH_GPU_OPTIONS and asks_for_gpus(key, value)]
    return found


def launch_problems(launcher: Mapping[str, Any], cluster: Cluster) -> list[Problem]:
    """What sbatch would refuse in the launcher's request (`hydra.launcher`), on a cluster that answered."""
    wanted, problems = launcher.get("partition"), []
    partition = cluster.partition(wanted)
    if partition is None:
        if wanted is None or not cluster.partitions:
            return []  # no single default partition to judge the request against
        names = ", ".join(p.name for p in cluster.partitions)
        partition = cluster.partition(None) or cluster.partitions[0]  # the rest is judged against the one proposed
        problems.append(Problem(f"hydra.launcher.partition={wanted}", f"the cluster has no such partition (it has "
                                f"{names})", f"hydra.launcher.partition={partition.name}"))
    if not partition.has_gpus:
        elsewhere = [p.name for p in cluster.partitions if p.has_gpus]
        gres = ", ".join(dict.fromkeys(n.gres for n in partition.nodes))
        why = f"no node of partition {partition.name} has a GPU (sinfo GRES: {gres})" + (
            f"; partition {', '.join(elsewhere)} has GPUs (hydra.launcher.partition=...)" if elsewhere else "")
        problems += [Problem(setting, why, fix) for setting, fix in gpu_requests(launcher)]
    problems += node_problems(launcher, partition)
    timeout_min, delay = launcher.get("timeout_min"), launcher.get("signal_delay_s")
    limit_s = int(timeout_min) * 60 if timeout_min else 0
    if limit_s and delay is not None and int(delay) + SIGNAL_EARLY_S >= limit_s:
        fix = (f"hydra.launcher.signal_delay_s={limit_s // 4}" if limit_s // 4 + SIGNAL_EARLY_S < limit_s else
               f"hydra.launcher.timeout_min={(int(delay) + SIGNAL_EARLY_S) // 60 + 1}")
        problems.append(Problem(f"hydra.launcher.signal_delay_s={delay}", f"SIGUSR1 could come as each attempt starts "
                                f"(hydra.launcher.timeout_min={timeout_min} is {limit_s} s, and SLURM may send the "
                                f"signal up to {SIGNAL_EARLY_S} s early), so every attempt could checkpoint and "
                                "requeue at its first step, or die of the signal before Python handles it", fix))
    return problems


def node_problems(launcher: Mapping[str, Any], partition: Partition) -> list[Problem]:
    """What one node's share of the job (`tasks_per_node` tasks of `cpus_per_task` CPUs, `mem_gb`) and the number
    of `nodes` ask of the partition's nodes, beyond what sinfo says they have."""
    problems = []
    tasks, cpus = int(launcher.get("tasks_per_node") or 1), launcher.get("cpus_per_task")
    per_task = int(cpus) if cpus else 1  # sbatch gives a task one CPU unless asked for more
    nodes, total, most_cpus = int(launcher.get("nodes") or 1), partition.count(), partition.largest("cpus")
    if most_cpus is not None and per_task * tasks > most_cpus:
        if tasks > most_cpus:  # fewer CPUs than tasks: no cpus_per_task fits
            per_task_part = f" (× hydra.launcher.cpus_per_task={cpus})" if cpus else ""
            spread = (f" (to keep the run's {tasks * nodes} processes, spread them over more hydra.launcher.nodes)"
                      if total is None or total > nodes else "")
            problems.append(Problem(f"hydra.launcher.tasks_per_node={tasks}{per_task_part}", f"the nodes of partition "
                                    f"{partition.name} have at most {most_cpus} CPUs, fewer than one per task{spread}",
                                    f"hydra.launcher.tasks_per_node={most_cpus}"
                                    + (" hydra.launcher.cpus_per_task=1" if per_task > 1 else "")))
        else:
            per_node = f" (× hydra.launcher.tasks_per_node={tasks})" if tasks > 1 else ""
            problems.append(Problem(f"hydra.launcher.cpus_per_task={cpus}{per_node}", f"the nodes of partition "
                                    f"{partition.name} have at most {most_cpus} CPUs",
                                    f"hydra.launcher.cpus_per_task={most_cpus // tasks}"))
    mem_gb, most_mb = launcher.get("mem_gb"), partition.largest("memory_mb")
    if mem_gb and most_mb is not None and float(mem_gb) * 1024 > most_mb:  # submitit: --mem=<mem_gb>GB, 1 GB = 1024 MB
        fits = most_mb // 1024 if most_mb >= 1024 else int(most_mb / 1024 * 100) / 100
        problems.append(Problem(f"hydra.launcher.mem_gb={mem_gb}", f"the nodes of partition {partition.name} have "
                                f"at most {most_mb} MB", f"hydra.launcher.mem_gb={fits}"))
    if total is not None and nodes > total:
        problems.append(Problem(f"hydra.launcher.nodes={nodes}", f"partition {partition.name} has {total} "
                                f"node{'s' if total != 1 else ''}", f"hydra.launcher.nodes={total}"))
    elif total is not None and not problems:  # enough nodes: are enough of them big enough for one node's share?
        need_mb = float(mem_gb) * 1024 if mem_gb else 0.0
        big = partition.count(per_task * tasks, need_mb)
        if big is not None and 0 < big < nodes:
            problems.append(Problem(f"hydra.launcher.nodes={nodes}", f"only {big} of the {total} nodes of partition "
                                    f"{partition.name} have {per_task * tasks} CPUs"
                                    + (f" and {need_mb:g} MB" if mem_gb else ""), f"hydra.launcher.nodes={big}"))
    return problems


def refusal(problems: list[Problem], partition: str | None) -> str:
    """The message that stops a submission: each problem, then every override at once."""
    where = f"partition {partition}" if partition else "the cluster"
    lines = [f"rlvr: hydra/launcher=slurm asks for what {where} cannot give, so sbatch would refuse the job array; "
             "nothing was submitted:", *(f"  {p}" for p in problems),
             f"rlvr: to submit, add: {' '.join(p.fix for p in problems)}"]
    return "\n".join(lines)


class SlurmChecks(Callback):
    """conf/hydra/launcher/slurm.yaml's Hydra callback: `launch_problems` before anything is submitted."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        cluster = query_cluster(SUBMIT_SINFO_TIMEOUT_S)
        if not cluster.ok:
            if not cluster.answered:
                print(f"rlvr: warning: {cluster.detail}; submitting without checking the cluster", file=sys.stderr)
                return
            # Hydra turns a callback's exception into a warning and goes on: stop here instead
            print(f"rlvr: hydra/launcher=slurm has no cluster to submit to: {cluster.detail}", file=sys.stderr)
            raise SystemExit(2)
        launcher = config.hydra.launcher
        problems = launch_problems(launcher, cluster)
        if problems:
            partition = cluster.partition(launcher.get("partition"))
            print(refusal(problems, partition.name if partition else None), file=sys.stderr)
            raise SystemExit(2)
