"""Wrong invocations of `python train.py`, as a user types them: each fails before any model loads,
says which key or path is wrong and what was expected, and leaves no run folder behind."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ["trainer=gpu", "trainer.max_steps=1"]  # no warm-up: these cases fail elsewhere

CASES = [
    # (overrides, text the message must contain)
    (["algorithm=nope"], "algorithm/nope"),
    (["transform=gtpoo"], "transform/gtpoo"),
    (["condition=sepa_plus"], "condition/sepa_plus"),
    (["trainer.lrr=1e-3"], "lrr"),
    (["trainer.batch_size=abc"], "trainer.batch_size='abc' must be int"),
    (["trainer.lr=fast"], "trainer.lr='fast' must be float"),
    (["trainer.batch_size=2.5"], "trainer.batch_size=2.5 must be int"),
    (["trainer.batch_size=0"], "trainer.batch_size=0 must be > 0"),
    (["trainer.group_size=-2"], "trainer.group_size=-2 must be > 0"),
    (["trainer.group_size=1"], "trainer.group_size=1: every group's rewards tie"),
    (["trainer.max_steps=-1"], "trainer.max_steps=-1 must be >= 0"),
    (["trainer.lr=0"], "trainer.lr=0 must be > 0"),
    (["trainer.lr=-1e-3"], "trainer.lr=-0.001 must be > 0"),
    (["trainer.save_every=-5"], "trainer.save_every=-5 must be >= 0"),
    (["trainer.sampling.top_p=1.5"], "trainer.sampling.top_p=1.5 must be in (0, 1]"),
    (["trainer.sampling.temperature=-1"], "trainer.sampling.temperature=-1 must be >= 0"),
    (["trainer.sampling.max_tokens=0"], "trainer.sampling.max_tokens=0 must be > 0"),
    (["trainer.warmup.batch_size=0"], "trainer.warmup.batch_size=0 must be > 0"),
    (["trainer.warmup.cache_dir=123"], "trainer.warmup.cache_dir=123 must be str or null"),
    (["backend.micro_batch_size=7"], "backend.micro_batch_size=7 does not divide trainer.batch_size"),
    (["backend.betas=0.9"], "backend.betas=0.9 must be tuple"),
    (["+backend.momentum=0.9"], "backend.momentum: <rlvr.backend.local.LocalBackend> takes no such argument"),
    (["seed=abc"], "seed='abc' must be an integer"),
    (["resume=sometimes"], "resume='sometimes': expected auto, never or must"),
    (["model.dtype=float13"], "model.dtype='float13': expected one of float32, bfloat16, float16"),
    (["model.lora.rank=0"], "model.lora.rank=0 must be > 0"),
    (["model.lora.target_modules=[]"], "model.lora.target_modules is empty"),
    (["model=qwen3_0_6b", "model.name_or_path=/no/such/model", *GPU], "model.name_or_path='/no/such/model'"),
    (["model=qwen3_0_6b", *GPU], "is not in the local hub cache and HF_HUB_OFFLINE is set"),
    (["data=math", "data.path=/no/such/train.jsonl", *GPU], "data.path='/no/such/train.jsonl'"),
    (["data=jsonl", *GPU], "data.path"),
    (["data=math", *GPU], "set data.path to a local .jsonl/.parquet file"),  # offline, no local file
    (["data=gsm8k", *GPU], "openai/gsm8k"),
    (["data=math", "data.path=tests/fixtures/math.jsonl", "data.eval_path=tests/fixtures/math.jsonl"],
     "has no warm-up demonstrations: set trainer.warmup.steps=0"),
    (["data.eval_size=0"], "data.eval_size=0"),
    (["data.carryless_fraction=2"], "data.carryless_fraction=2"),
    (["algorithm.loss.clip_eps=-0.1"], "algorithm.loss: clip_eps=-0.1"),
    (["algorithm.loss.clip_eps_high=0.2"], "algorithm.loss.clip_eps_high=0.2 needs algorithm.loss.clip_eps > 0"),
    (["transform=gtpo", "transform.uncertainty=entropy_bits"], "entropy_bits"),
    (["transform=gtpo", "transform.beta=-1"], "beta=-1"),
    (["transform=hicra", "transform.alpha=2"], "alpha=2"),
    (["transform=sepa", "transform.schedule=cosine"], "cosine"),
    (["planning.grams=wait"], "planning.grams='wait' must be Sequence or null"),
    (["reward=math", "reward.parsing_timeout_s=0"], "parsing_timeout_s"),
    (["reward=judge", "reward.api_key_env=RLVR_TEST_NO_SUCH_KEY"], "needs an API key in $RLVR_TEST_NO_SUCH_KEY"),
    (["engine=openai", "engine.api_key_env=RLVR_TEST_NO_SUCH_KEY"], "needs an API key in $RLVR_TEST_NO_SUCH_KEY"),
    (["backend=tinker", "trainer.warmup.steps=0", "backend.api_key_env=RLVR_TEST_NO_SUCH_KEY"],
     "RLVR_TEST_NO_SUCH_KEY"),
    (["engine=vllm", "transform=gtpo", "transform.uncertainty=shannon_entropy"], "needs full-distribution entropy"),
]


def invoke(case, tmp: Path):
    index, (overrides, _) = case
    run_dir = tmp / f"run{index}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RLVR_TEST": "1"}
    proc = subprocess.run([sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    return proc, run_dir


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda case: invoke(case, tmp), enumerate(CASES)))


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("index", range(len(CASES)), ids=[" ".join(c[0]) for c in CASES])
def test_wrong_invocation_fails_early_and_clearly(index, outcomes):
    proc, run_dir = outcomes[index]
    expected = CASES[index][1]
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert expected in output, output[-2500:]
    assert "loading policy" not in output  # failed before any model was loaded
    assert not run_dir.exists(), f"left {sorted(p.name for p in run_dir.iterdir())}"


def test_an_unwritable_run_folder_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions: use a path that cannot be a folder
            target = Path("/proc/rlvr-run")
        else:
            target = locked / "run"
        proc = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={target}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and str(target) in proc.stdout + proc.stderr
        assert "loading policy" not in proc.stdout + proc.stderr
    finally:
        locked.chmod(0o700)
