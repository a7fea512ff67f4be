"""What `hydra/launcher=slurm` refuses before it submits (rlvr/launcher/slurm.py), from sinfo's answer alone: no
cluster needed (tests/launchers/test_slurm.py runs the same against the dev cluster)."""

import pytest
from omegaconf import OmegaConf

from composing import composer
from rlvr.launcher.slurm import Cluster, asks_for_gpus, gpu_requests, launch_problems, parse_sinfo, refusal

DEV = "debug*|up|(null)|4|20489|1\n"  # the dev cluster's answer to `sinfo -h -o '%P|%a|%G|%c|%m|%D'`
GPUS = "cpu*|up|(null)|64|256000|10\ngpu|up|gpu:a100:4(S:0-1)|64|512000|4\ngpu|up|gpu:h100:8|96|1024000|2\n"
FITS_DEV = ["hydra.launcher.gpus_per_task=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]


def cluster(sinfo: str) -> Cluster:
    return Cluster(True, "sinfo answers", parse_sinfo(sinfo))


def preset(*overrides: str):
    """conf/hydra/launcher/slurm.yaml's launcher node, as `hydra/launcher=slurm <overrides>` composes it."""
    with composer() as compose:
        return compose(["hydra/launcher=slurm", *overrides], hydra=True).hydra.launcher


def test_sinfo_rows_become_partitions_with_their_node_groups():
    cpu, gpu = parse_sinfo(GPUS + "weird line\n")
    assert (cpu.name, cpu.default, cpu.has_gpus, cpu.largest("cpus")) == ("cpu", True, False, 64)
    assert (gpu.name, gpu.default, gpu.has_gpus, gpu.largest("memory_mb")) == ("gpu", False, True, 1024000)
    assert cluster(GPUS).partition(None) == cpu and cluster(GPUS).partition("gpu") == gpu
    assert cluster(GPUS).partition("nope") is None
    assert (cpu.count(), gpu.count(), gpu.count(cpus=96), gpu.count(cpus=97)) == (10, 6, 2, 0)
    assert gpu.describe() == ("gpu (up; nodes: 4 × 64 CPUs, 512000 MB, GRES gpu:a100:4(S:0-1); "
                              "2 × 96 CPUs, 1024000 MB, GRES gpu:h100:8)")
    mixed, = parse_sinfo("debug*|up|(null)|4+|20489+|3\n")  # nodes of several sizes: no single largest
    assert mixed.largest("cpus") is None and mixed.largest("memory_mb") is None
    assert mixed.count(cpus=1000) == 3  # sizes not stated for certain count as big enough
    assert parse_sinfo("debug*|up|(null)|4|20489\n") == ()  # not SINFO_FORMAT's six fields


@pytest.mark.parametrize("key,value,asks", [
    ("gpus_per_task", 1, True), ("gpus_per_task", 0, False), ("gpus_per_task", None, False),
    ("gpus_per_node", "a100:2", True), ("gpus_per_node", "a100:0", False), ("gpus", "h100", True),
    ("gres", "gpu:1", True), ("gres", "gpu:a100:2", True), ("gres", "gpu", True), ("gres", "gpu:0", False),
    ("gres", "shard:2", False), ("gres", "shard:2,gpu:1", True), ("gpus-per-task", "1", True),
])
def test_what_asks_for_a_gpu(key, value, asks):
    assert asks_for_gpus(key, value) is asks


def test_the_preset_on_a_cluster_without_gpus_is_refused_with_the_overrides_that_fit():
    launcher = preset()
    problems = launch_problems(launcher, cluster(DEV))
    assert [(p.setting, p.fix) for p in problems] == [
        ("hydra.launcher.gpus_per_task=1", "hydra.launcher.gpus_per_task=null"),
        ("hydra.launcher.cpus_per_task=8", "hydra.launcher.cpus_per_task=4"),
        ("hydra.launcher.mem_gb=64", "hydra.launcher.mem_gb=20"),  # 20 GB = 20480 MB <= 20489 MB
    ]
    assert problems[0].why == "no node of partition debug has a GPU (sinfo GRES: (null))"
    assert refusal(problems, "debug").splitlines()[-1] == (
        "rlvr: to submit, add: hydra.launcher.gpus_per_task=null hydra.launcher.cpus_per_task=4 "
        "hydra.launcher.mem_gb=20")
    # the fixes, applied, leave nothing to refuse (0 GPUs is fine too: sbatch accepts --gpus-per-task=0)
    fixed = preset(*(p.fix for p in problems))
    assert launch_problems(fixed, cluster(DEV)) == []
    assert launch_problems(preset("hydra.launcher.gpus_per_task=0", "hydra.launcher.cpus_per_task=1",
                                  "hydra.launcher.mem_gb=1"), cluster(DEV)) == []


def test_every_way_of_asking_for_a_gpu_is_named_with_its_own_fix():
    asked = ["hydra.launcher.gpus_per_task=null", "hydra.launcher.gres=gpu:1", "hydra.launcher.cpus_per_task=1",
             "+hydra.launcher.additional_parameters.gpus-per-node=2", "hydra.launcher.mem_gb=1"]
    requests = gpu_requests(preset(*asked))
    assert requests == [
        ("hydra.launcher.gres=gpu:1", "hydra.launcher.gres=null"),
        ("hydra.launcher.additional_parameters.gpus-per-node=2", "~hydra.launcher.additional_parameters.gpus-per-node"),
    ]
    assert launch_problems(preset(*asked, *(fix for _, fix in requests)), cluster(DEV)) == []


def test_a_cluster_with_gpus_elsewhere_says_which_partition_has_them():
    problems = launch_problems(preset(), cluster(GPUS))  # default partition `cpu`: big nodes, no GPU
    assert [p.setting for p in problems] == ["hydra.launcher.gpus_per_task=1"]
    assert "partition gpu has GPUs (hydra.launcher.partition=...)" in problems[0].why
    assert launch_problems(preset("hydra.launcher.partition=gpu"), cluster(GPUS)) == []


def test_an_unknown_partition_names_the_ones_there_are_and_the_rest_is_judged_against_the_one_proposed():
    problems = launch_problems(preset("hydra.launcher.partition=gpu", "hydra.launcher.mem_gb=1"), cluster(DEV))
    assert [(p.setting, p.why, p.fix) for p in problems] == [
        ("hydra.launcher.partition=gpu", "the cluster has no such partition (it has debug)",
         "hydra.launcher.partition=debug"),
        ("hydra.launcher.gpus_per_task=1", "no node of partition debug has a GPU (sinfo GRES: (null))",
         "hydra.launcher.gpus_per_task=null"),
        ("hydra.launcher.cpus_per_task=8", "the nodes of partition debug have at most 4 CPUs",
         "hydra.launcher.cpus_per_task=4")]


def test_a_time_limit_signal_that_would_come_as_each_attempt_starts_is_refused():
    fits = ["hydra.launcher.gpus_per_task=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
    problems = launch_problems(preset(*fits, "hydra.launcher.timeout_min=5"), cluster(DEV))  # preset: 300 s ahead
    assert [(p.setting, p.fix) for p in problems] == [
        ("hydra.launcher.signal_delay_s=300", "hydra.launcher.signal_delay_s=75")]
    assert ("SIGUSR1 could come as each attempt starts (hydra.launcher.timeout_min=5 is 300 s, and SLURM may send "
            "the signal up to 60 s early)") in problems[0].why
    assert launch_problems(preset(*fits, "hydra.launcher.timeout_min=5", problems[0].fix), cluster(DEV)) == []
    # 45 s ahead of a 60-s limit: 45 + 60 ≥ 60, and no delay fits a 1-min limit: the fix is a longer one
    short = launch_problems(preset(*fits, "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=45"),
                            cluster(DEV))
    assert [(p.setting, p.fix) for p in short] == [("hydra.launcher.signal_delay_s=45", "hydra.launcher.timeout_min=2")]
    assert launch_problems(preset(*fits, "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=45"),
                           cluster(DEV)) == []  # the time-limit test's setting: 45 + 60 < 120


def test_what_sinfo_does_not_state_for_certain_is_not_refused():
    assert launch_problems(preset("hydra.launcher.gpus_per_task=null"), cluster("debug*|up|(null)|4+|20489+|2\n")) == []
    two_defaults_unknown = cluster("a|up|(null)|1|100|1\nb|up|(null)|1|100|1\n")  # no default partition marked
    assert launch_problems(preset(), two_defaults_unknown) == []
    unknown_count = cluster("debug*|up|(null)|4|20489|?\n")
    assert launch_problems(preset(*FITS_DEV, "hydra.launcher.nodes=9"), unknown_count) == []


def test_the_dev_clusters_two_task_job_fits():
    """tests/launchers/test_slurm_distributed.py's job: 2 tasks of 1 CPU, 1 GB for the node."""
    assert launch_problems(preset(*FITS_DEV, "hydra.launcher.tasks_per_node=2"), cluster(DEV)) == []


def test_more_cpus_than_a_node_has_counts_every_task_of_the_node():
    problems = launch_problems(preset(*FITS_DEV, "hydra.launcher.tasks_per_node=2", "hydra.launcher.cpus_per_task=3"),
                               cluster(DEV))
    assert [(p.setting, p.why, p.fix) for p in problems] == [
        ("hydra.launcher.cpus_per_task=3 (× hydra.launcher.tasks_per_node=2)",
         "the nodes of partition debug have at most 4 CPUs", "hydra.launcher.cpus_per_task=2")]
    assert launch_problems(preset(*FITS_DEV, "hydra.launcher.tasks_per_node=2", problems[0].fix), cluster(DEV)) == []


def test_more_tasks_than_a_node_has_cpus_is_refused_with_fewer_tasks_of_one_cpu():
    problems = launch_problems(preset(*FITS_DEV, "hydra.launcher.tasks_per_node=8", "hydra.launcher.cpus_per_task=2"),
                               cluster(DEV))
    assert [(p.setting, p.fix) for p in problems] == [
        ("hydra.launcher.tasks_per_node=8 (× hydra.launcher.cpus_per_task=2)",
         "hydra.launcher.tasks_per_node=4 hydra.launcher.cpus_per_task=1")]
    assert problems[0].why == "the nodes of partition debug have at most 4 CPUs, fewer than one per task"
    many = launch_problems(preset("hydra.launcher.tasks_per_node=96", "hydra.launcher.nodes=2"), cluster(GPUS))
    assert [(p.setting, p.why, p.fix) for p in many if "tasks_per_node" in p.setting] == [  # partition cpu: 10 nodes
        ("hydra.launcher.tasks_per_node=96 (× hydra.launcher.cpus_per_task=8)", "the nodes of partition cpu have at "
         "most 64 CPUs, fewer than one per task (to keep the run's 192 processes, spread them over more "
         "hydra.launcher.nodes)", "hydra.launcher.tasks_per_node=64 hydra.launcher.cpus_per_task=1")]
    fixed = preset(*FITS_DEV, "hydra.launcher.tasks_per_node=8", "hydra.launcher.cpus_per_task=2",
                   *problems[0].fix.split())
    assert launch_problems(fixed, cluster(DEV)) == []
    # without cpus_per_task a task gets one CPU: still more tasks than CPUs
    unset = launch_problems(preset(*FITS_DEV, "hydra.launcher.tasks_per_node=5", "hydra.launcher.cpus_per_task=null"),
                            cluster(DEV))
    assert [(p.setting, p.fix) for p in unset] == [
        ("hydra.launcher.tasks_per_node=5", "hydra.launcher.tasks_per_node=4")]


def test_more_nodes_than_the_partition_has_is_refused_naming_how_many_it_has():
    problems = launch_problems(preset(*FITS_DEV, "hydra.launcher.nodes=2"), cluster(DEV))
    assert [(p.setting, p.why, p.fix) for p in problems] == [
        ("hydra.launcher.nodes=2", "partition debug has 1 node", "hydra.launcher.nodes=1")]
    gpu = ["hydra.launcher.partition=gpu", "hydra.launcher.nodes=8"]
    assert [(p.setting, p.why, p.fix) for p in launch_problems(preset(*gpu), cluster(GPUS))] == [
        ("hydra.launcher.nodes=8", "partition gpu has 6 nodes", "hydra.launcher.nodes=6")]
    assert launch_problems(preset(*gpu[:1], "hydra.launcher.nodes=6"), cluster(GPUS)) == []


def test_more_nodes_than_the_partition_has_big_enough_for_one_nodes_share_is_refused():
    """8 tasks of 12 CPUs a node: only the two 96-CPU nodes of partition gpu hold them (the four others have 64)."""
    big = ["hydra.launcher.partition=gpu", "hydra.launcher.tasks_per_node=8", "hydra.launcher.cpus_per_task=12"]
    problems = launch_problems(preset(*big, "hydra.launcher.nodes=4"), cluster(GPUS))
    assert [(p.setting, p.why, p.fix) for p in problems] == [
        ("hydra.launcher.nodes=4", "only 2 of the 6 nodes of partition gpu have 96 CPUs and 65536 MB",
         "hydra.launcher.nodes=2")]
    assert launch_problems(preset(*big, problems[0].fix), cluster(GPUS)) == []


def test_the_preset_installs_the_check_and_keeps_its_launcher_keys():
    with composer() as compose:
        cfg = compose(["hydra/launcher=slurm", "campaign=smoke"], hydra=True)
    assert list(cfg.hydra.callbacks) == ["slurm_checks", "manifest"]  # the check runs before the manifest is written
    assert cfg.hydra.callbacks.slurm_checks._target_ == "rlvr.launcher.slurm.SlurmChecks"
    launcher = OmegaConf.to_container(cfg.hydra.launcher)
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["gpus_per_task"] == 1
    assert (launcher["tasks_per_node"], launcher["nodes"]) == (1, 1)  # one process per run unless asked
    assert "export SLURM_KILL_BAD_EXIT=1" in launcher["setup"]  # srun --kill-on-bad-exit=1 (no srun_args in 1.2.0)
    assert launcher["additional_parameters"] == {"signal": "USR1@${hydra.launcher.signal_delay_s}"}
