import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from composing import compose_config
from rlvr.campaign import Plan, engine_memory, expand_grid, overlapped_step_time

ROOT = Path(__file__).resolve().parents[2]


def test_grid_expansion_is_the_basic_sweepers():
    params = {"condition": "grpo,maxrl_gtpo_sepa", "seed": "0,1,2"}
    cli = ["campaign=smoke", "seed=0,1", "trainer.lr=1e-3"]
    ours = expand_grid(params, cli)
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + cli)
    assert ours == BasicSweeper.split_arguments(parsed, None)[0]
    assert len(ours) == 4  # the command line's seed=0,1 replaces the file's 0,1,2


def test_plan_arithmetic():
    # 2 runs × 100 steps = 200 steps; × 30 s / 2 at once = 3,000 s = 50 min
    plan = Plan([["condition=a", "seed=0"], ["condition=a", "seed=1"]], 100, 30.0, 2)
    assert plan.total_steps == 200 and "= 0 h 50 min" not in plan.describe() and "50 min 00 s" in plan.describe()


def rlvr(*args):
    return subprocess.run([sys.executable, "-m", "rlvr.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_rlvr_plan_previews_the_predecessors_ablation():
    proc = rlvr("plan", "campaign=sepa_ablation", "trainer=gpu", "--step-time", "25", "--parallel", "5")
    assert proc.returncode == 0, proc.stderr
    # 5 conditions × 3 seeds = 15 runs × 500 steps = 7,500 steps; × 25 s / 5 = 37,500 s = 10 h 25 min
    assert "5 conditions × 3 seeds = 15 runs × 500 steps = 7500 steps" in proc.stdout
    assert "10 h 25 min" in proc.stdout


def test_rlvr_plan_takes_a_sweep_from_the_command_line():
    proc = rlvr("plan", "condition=grpo,maxrl", "seed=0,1,2", "trainer.max_steps=10", "--step-time", "2")
    assert proc.returncode == 0, proc.stderr
    # 2 × 3 = 6 runs × 10 steps = 60 steps; × 2 s / 1 at once = 120 s = 2 min 00 s
    assert "2 conditions × 3 seeds = 6 runs × 10 steps = 60 steps" in proc.stdout and "2 min 00 s" in proc.stdout


def train(*overrides):
    return subprocess.run([sys.executable, "train.py", *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_smoke_campaign_runs_in_stable_folders_and_a_relaunch_skips_finished_runs(tmp_path):
    fast = ["campaign=smoke", f"hydra.sweep.dir={tmp_path}", "trainer.max_steps=2", "trainer.warmup.steps=0",
            "trainer.eval_every=0", "data.eval_size=32", "threads=1"]
    first = train(*fast)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 conditions × 2 seeds = 4 runs" in first.stdout
    folders = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/seed=*"))
    assert folders == ["grpo/seed=0", "grpo/seed=1", "maxrl_gtpo_sepa/seed=0", "maxrl_gtpo_sepa/seed=1"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["num_runs"] == 4 and {r["state"] for r in manifest["runs"]} == {"finished"}
    assert {(r["condition"], r["seed"]) for r in manifest["runs"]} == {
        ("grpo", "0"), ("grpo", "1"), ("maxrl_gtpo_sepa", "0"), ("maxrl_gtpo_sepa", "1")}
    # auto_squeeze in smoke.yaml: the first run to finish analysed its final adapter (the tiny model's r = 8)
    assert manifest["squeeze"]["state"] == "done" and manifest["squeeze"]["source_rank"] == 8
    assert manifest["squeeze"]["recommended_rank"] in (1, 2, 4, 8) and manifest["squeeze"]["num_layers"] == 14
    again = train(*fast)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("nothing to do") + again.stderr.count("nothing to do") == 4
    for folder in folders:
        rows = [json.loads(x) for x in (tmp_path / folder / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "loss" in r] == [0, 1]  # nothing ran twice
    status = rlvr("status", str(tmp_path))
    assert status.returncode == 0 and "4 runs: 4 finished" in status.stdout


@pytest.mark.parametrize("extra", [["trainer.lr=1e-3,2e-3"]])
def test_a_grid_whose_runs_would_share_a_folder_is_refused(tmp_path, extra):
    proc = train("campaign=smoke", f"hydra.sweep.dir={tmp_path}", *extra)
    assert proc.returncode == 2 and "would share a folder" in proc.stderr
    assert not list(tmp_path.glob("*/seed=*"))  # refused before anything was launched


@pytest.mark.parametrize("level", [0, 1, 2])
def test_plan_counts_what_vllm_leaves_the_trainer_while_it_trains(level):
    """engine=vllm beside the trainer: without sleep it keeps its share (0.5) of the GPU through training, so the
    trainer trains in the other 0.5; asleep (levels 1, 2: vLLM's sleep mode) the training phase has the whole GPU.
    Planned from any machine: a CPU login node plans a GPU campaign (sleep is refused only where a run starts)."""
    proc = rlvr("plan", "campaign=smoke", "engine=vllm", f"engine.sleep_level={level}")
    assert proc.returncode == 0, proc.stderr
    assert f"GPU memory beside the trainer (engine=vllm, engine.sleep_level={level}):" in proc.stdout
    assert "sampling: vLLM holds 0.5 of the GPU (weights, KV cache), beside what the trainer keeps" in proc.stdout
    training = next(line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("training:"))
    if level == 0:
        assert training == ("training: vLLM still holds it; the trainer's policy, optimizer state and activations "
                            "have the other 0.5")
    else:
        assert training.startswith(f"training: vLLM sleeps (level {level}: ")
        assert training.endswith("the trainer has the whole GPU but vLLM's CUDA context")
        assert ("W0 too under LoRA" in training) == (level == 2)


def test_plan_names_no_gpu_memory_for_engines_without_their_own():
    plan = Plan([["seed=0"]], 10, None, 1, engine_memory(compose_config(["engine=pytorch"])))
    assert plan.memory is None and "GPU memory" not in plan.describe()
    kv = engine_memory(compose_config(["engine=vllm", "engine.kv_cache_memory_bytes=1073741824"]))
    assert kv is not None and "vLLM holds its weights and a 1 GiB KV cache" in kv[1]


def test_plan_estimates_the_step_sampling_ahead_would_give_from_a_synchronous_pilot(tmp_path):
    """Per step the longer of the sampler's side (sampling less the sync) and the trainer's (sync + scoring +
    credit + training); the median over the pilot's steps. Rows of an overlapped pilot are not such a measure."""
    rows = [  # sampler side, trainer side: 0.05 vs 0.10 | 0.30 vs 0.05 | 0.12 vs 0.12
        {"step_time_s": 0.15, "sample_time_s": 0.06, "engine/sync_s": 0.01, "score_time_s": 0.005,
         "advantage_time_s": 0.005, "train_time_s": 0.08},
        {"step_time_s": 0.34, "sample_time_s": 0.30, "score_time_s": 0.01, "advantage_time_s": 0.0,
         "train_time_s": 0.04},
        {"step_time_s": 0.24, "sample_time_s": 0.12, "score_time_s": 0.02, "advantage_time_s": 0.0,
         "train_time_s": 0.10},
        {"step_time_s": 9.0, "sample_time_s": 9.0, "train_time_s": 0.0, "async/policy_version": 0.0},
    ]
    (tmp_path / "grpo" / "seed=0").mkdir(parents=True)
    (tmp_path / "grpo" / "seed=0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert overlapped_step_time(tmp_path) == pytest.approx(0.12)
    plan = Plan([["seed=0"]], 10, 0.24, 1, None, overlapped_step_time(tmp_path))
    assert "sampling ahead (trainer.off_policy_steps=1, docs/overlap.md): about 0.12 s a step (0.50× the pilot's)" \
        in plan.describe()


def test_plan_of_a_packed_grid():
    # 2 packs of 3 runs × 100 steps, a pilot's step 0.07 s of which sampling 0.03 s, one pack after another:
    #   none shared:  2 × 100 × 3 × 0.07 = 42 s
    #   all sampling in one loop as fast as one cell's: 2 × 100 × (3 × (0.07 − 0.03) + 0.03) = 2 × 100 × 0.15 = 30 s
    jobs = [[f"condition={c}", f"seed={s}"] for c in "ab" for s in "012"]
    plan = Plan(jobs, 100, 0.07, 1, packs=[3, 3], sample_time_s=0.03, pack_bases=3)
    text = plan.describe()
    assert "packed: 2 packs (2 of 3 runs)" in text and "a pack holds 3 copy(ies) of the base weights" in text
    assert "estimated wall time packed: 0 min 30 s (every cell's sampling" in text and "to 0 min 42 s (none" in text


@pytest.mark.parametrize("launcher, packs", [
    (["hydra/launcher=packed"], "packed: 1 pack (1 of 4 runs)"),
    (["hydra/launcher=packed", "hydra.launcher.pack_size=3"], "packed: 2 packs (1 of 3 runs, 1 of 1 run)"),
    (["hydra/launcher=slurm", "hydra.launcher.pack_size=2"], "packed: 2 packs (2 of 2 runs)"),
    (["hydra/launcher=packed", "model.lora=null"], "packed: 4 packs (4 of 1 run)"),  # full fine-tuning: alone
])
def test_rlvr_plan_groups_a_packed_grid_as_the_launcher_does(launcher, packs):
    proc = rlvr("plan", "campaign=smoke", *launcher, "--step-time", "0.07")
    assert proc.returncode == 0, proc.stderr
    assert packs in proc.stdout
    sized = "hydra.launcher.pack_size=3" not in launcher and "model.lora=null" not in launcher and "packed" in packs
    assert ("pack size (pack_size null): a cell 61 MiB, a base copy 2 MiB" in proc.stdout) is (
        sized and launcher[0] == "hydra/launcher=packed")  # rlvr/pack/fit.py; the arithmetic: tests/pack/test_packs.py
