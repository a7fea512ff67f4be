"""Whole runs with engine=vllm, in a file of their own: a run closes its vLLM engine, which tears down vLLM's
process-wide parallel state, so it must not share a module with engines that outlive it (test_vllm_engine.py's
module-scoped fixtures)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from composing import OVERLAP, compose_config
from rlvr.build import build_all
from rlvr.errors import ConfigError
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.vllm  # tests/conftest.py: skipped, saying why, where vLLM is not installed


def test_an_entropy_transform_reads_the_backends_entropies(tmp_path):
    """vLLM returns top-k log-probabilities, not the full distribution: backend=local computes the entropies GTPO's
    shannon_entropy reads in a no-grad pass (tests/backend/test_packing.py checks them against engine=pytorch's)."""
    cfg = compose_config(["engine=vllm", "transform=gtpo", "transform.uncertainty=shannon_entropy",
                          "trainer.max_steps=2", "trainer.warmup.steps=0", "trainer.evaluate=false", "threads=1",
                          "reward=function", "reward.function=tests.backpressure.mixed_rewards.parity"])
    assert run(cfg, tmp_path)["steps"] == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["exec_surprisal_mean"] > 0 for r in rows if not r["skipped"]) and not all(r["skipped"] for r in rows)
    with pytest.raises(ConfigError, match=r"full-distribution entropy .* choose engine=pytorch, or backend=local"):
        build_all(compose_config(["engine=vllm", "backend=fsdp", "transform=gtpo",
                                  "transform.uncertainty=shannon_entropy"]))


@pytest.mark.parametrize("lora", [True, False])
def test_vllm_samples_ahead_of_training_from_the_weights_it_was_synced(tmp_path, lora):
    """trainer.off_policy_steps=2 (docs/overlap.md): vLLM samples steps n + 1 and n + 2 in the sampler thread while
    step n trains, each version's adapter written by the trainer and loaded by the sampler thread after the older
    steps (`VLLMEngine.stage`); the trainer sees the stale sampler as π_old ≠ π_engine from step 1 on, and checks
    the sync on step 0 alone (the one sampled on-policy). A process of its own: a second vLLM engine in a process
    whose first was closed finds vLLM's parallel state gone. Under full fine-tuning (`lora=False`) the weights are
    copied whole and sent in memory to the in-process vLLM from the sampler thread, whose torch thread count must
    be the process's (vLLM's CPU attention aborted the run before)."""
    overrides = ["engine=vllm", "trainer.off_policy_steps=2", *OVERLAP, "trainer.max_steps=4", "trainer.warmup.steps=0",
                 "trainer.evaluate=false", "threads=1", "reward=function",
                 "reward.function=tests.backpressure.mixed_rewards.parity", f"hydra.run.dir={tmp_path}",
                 *([] if lora else ["model.lora=null"])]
    proc = subprocess.run([sys.executable, "train.py", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/policy_version"] for r in rows] == [0, 0, 0, 1]
    assert rows[0]["engine/sync_delta"] < 1e-4 and not any("engine/sync_delta" in r for r in rows[1:])
    assert rows[0]["mismatch/kl"] < 1e-5 < min(r["mismatch/kl"] for r in rows[1:])


def test_vllm_continues_partial_rollouts_across_updates_and_repeats(tmp_path):
    """trainer.partial_rollouts=true with engine=vllm (docs/overlap.md): rows unfinished at an update are aborted
    and their prefixes resubmitted to the updated vLLM; every trained token stays within k = 2 updates, some rows
    span two versions, step 0 (one version, on-policy) has no mismatch, and the same command writes the same rows.
    After a short warm-up, whose completions are 1–6 tokens: at most 6, 3 of them in the job that admits a row
    (its quota), so the longer ones cross an update."""
    overrides = ["engine=vllm", "trainer.off_policy_steps=2", "trainer.partial_rollouts=true", *OVERLAP,
                 "trainer.max_steps=6", "trainer.warmup.steps=10", "trainer.warmup.cache_dir=null",
                 "trainer.evaluate=false", "threads=1", "reward=function",
                 "reward.function=tests.backpressure.mixed_rewards.parity", "trainer.sampling.max_tokens=6",
                 "trainer.group_size=2"]
    runs = []
    for name in ("a", "b"):
        proc = subprocess.run([sys.executable, "train.py", *overrides, f"hydra.run.dir={tmp_path / name}"], cwd=REPO,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append([json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    rows = runs[0]
    assert [r["step"] for r in rows] == list(range(6)) and all(r["num_datums"] == 16 for r in rows)
    assert all(r["async/staleness_max"] <= min(2, r["step"]) for r in rows)
    assert any(r["async/partial_frac"] > 0 for r in rows), "some rows crossed an update"
    assert rows[0]["mismatch/kl"] < 1e-5
    assert [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in runs[1]] == \
        [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows]
