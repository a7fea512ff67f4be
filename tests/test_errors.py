"""Wrong invocations of `python train.py`, as a user types them: each fails before any model loads,
says which key or path is wrong and what was expected, and leaves no run folder behind.

The cases run in this process (composed as train.py composes them, then `rlvr.run.run`); one runs as the
real command, to check what the user sees and that torch was never imported."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from composing import compose_config
from rlvr.errors import ConfigError
from rlvr.run import run
from rlvr.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
GPU = ["trainer=gpu", "trainer.max_steps=1", "trainer.sampling.max_tokens=8", "trainer.eval_max_tokens=8"]
"""No warm-up (these cases fail elsewhere), and completions that fit the tiny model's 32 positions."""

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
    (["trainer.sampling.temperature=0"], "trainer.sampling.temperature=0 samples greedily: a group's completions are "
                                         "all alike, their rewards tie, and no RL step would train"),
    (["trainer.sampling.max_tokens=32"], "trainer.sampling.max_tokens=32 does not fit: model "
                                         "<rlvr.model.tiny.TinyLlama> has 32 positions (model.max_positions)"),
    (["trainer.eval_max_tokens=40"], "trainer.eval_max_tokens=40 does not fit"),
    (["env=guess", "env.max_context_tokens=64"], "env.max_context_tokens=64 does not fit: model "
                                                 "<rlvr.model.tiny.TinyLlama> has 32 positions"),
    (["trainer.max_skipped_steps=-1"], "trainer.max_skipped_steps=-1 must be >= 0"),
    (["+algoritm=maxrl"], "algoritm: no config group or key of that name, so nothing would read it (did you mean "
                          "algorithm=maxrl?)"),
    (["+trainr.lr=0.1"], "trainr: no config group or key of that name"),
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
    (["engine=vllm", "backend=fsdp", "transform=gtpo", "transform.uncertainty=shannon_entropy"],
     "needs full-distribution entropy"),
    # the λ schedule's knobs moved under transform.schedule (issue 22): the old names fail naming the new ones
    (["transform=sepa", "+transform.delay_steps=0"], "transform.delay_steps: <rlvr.transform.sepa.SEPA> takes no such "
     "argument (it takes: beta, uncertainty, schedule); transform.delay_steps is now transform.schedule.delay_steps "
     "(say transform.schedule.delay_steps=0)"),
    (["transform=sepa", "transform.schedule=auto"], "transform.schedule='auto': transform.schedule is now "
                                                    "transform.schedule.kind (say transform.schedule.kind=auto)"),
    (["transform=sepa", "transform.schedule.steps=abc"], "transform.schedule.steps='abc' must be int"),
    (["transform=sepa_amp", "transform.schedule.kind=cosine"], "transform.schedule.kind='cosine' is not one of"),
    (["transform=hard_delight", "transform.schedule.fixed_lambda=1.5"],
     "transform.schedule.fixed_lambda=1.5 must be <= 1"),
    (["trainer.dynamic_sampling=refill", "trainer.off_policy_steps=1", "correction=token_tis",
      "algorithm.loss.correction.pi_old=decoupled"], "a step sampled ahead (trainer.off_policy_steps=1) cannot know"),
    # an option that acts only with another is refused by what the components declare (issue 37 req 6)
    (["env=guess", "trainer.dynamic_sampling=filter", "trainer.overlong.filter=true"],
     "trainer <rlvr.trainer.Trainer> does not work with multi-turn episodes (turns, observations between them), which "
     "env <rlvr.env.guess.GuessEnvironment> gives: trainer.dynamic_sampling=filter, trainer.overlong.filter=True "
     "read(s) single-turn completions"),
    (["turn_credit=reward_to_go"], "turn_credit <rlvr.turn_credit.reward_to_go.RewardToGo> needs multi-turn episodes "
     "(turns, observations between them) (turn_credit=reward_to_go gives each turn the rewards of the turns from it "
     "on), which no chosen component gives: choose env=calculator, or env=guess, or env=openenv, or env=retry"),
    (["turn_credit=env"], "turn_credit <rlvr.turn_credit.env.EnvAdvantages> needs multi-turn episodes"),
    (["env=guess", "echo=on", "correction=token_mask"], "echo <rlvr.echo.echo.Echo> does not work with a correction "
     "that masks tokens under algorithm.loss.aggregation=token_mean"),
    (["echo=on"], "echo <rlvr.echo.echo.Echo> needs multi-turn episodes (turns, observations between them) (echo=on "
                  "trains on observation tokens, which single-turn completions have none of)"),
    (["trainer.off_policy_steps=1"], "trainer <rlvr.trainer.Trainer> needs a loss for rollouts sampled by an older "
     "policy: the decoupled correction (π_old recomputed by the trainer, weighted by π_old/π_engine), or PRIME-RL's "
     "own loss (each token's ratio to its inference log-probability, backend=prime_rl) (trainer.off_policy_steps=1 "
     "trains on rollouts sampled 1 update(s) behind), which no chosen component gives: add correction=token_tis "
     "algorithm.loss.correction.pi_old=decoupled"),
    (["trainer.off_policy_steps=1", "correction=token_tis", "algorithm.loss.correction.pi_old=decoupled",
      "backpressure=usl"], "backpressure <rlvr.backpressure.usl.USLBackPressure> does not work with rollouts sampled "
     "ahead of training (trainer.off_policy_steps >= 1), which trainer <rlvr.trainer.Trainer> gives"),
    (["trainer.capture_steps=[0]", "backend=fsdp"], "trainer <rlvr.trainer.Trainer> needs an update written down "
     "exactly (its starting state and its result, for rlvr replay) (trainer.capture_steps=[0] writes down the updates "
     "of those steps), which no chosen component gives: choose backend=local"),
    (["trainer.dynamic_sampling=replace"], "trainer.dynamic_sampling='replace' must be one of off, filter, refill"),
    (["trainer.dynamic_sampling=false"], "(YAML reads off, no, yes, on as booleans: quote the word)"),
    (["trainer.overlong.buffer_frac=1"], "trainer.overlong.buffer_frac=1 must be in [0, 1)"),
    # numbers that cannot train (issue 37 req 5): NaN and inf pass every `< 0` rule, so each is refused by name
    (["trainer.lr=nan"], "trainer.lr=nan must be a finite number"),
    (["trainer.lr=-inf"], "trainer.lr=-inf must be a finite number"),
    (["algorithm.kl.coef=inf"], "algorithm.kl.coef=inf must be a finite number"),
    (["trainer.sampling.temperature=nan"], "trainer.sampling.temperature=nan must be a finite number"),
    (["algorithm.loss.clip_eps=nan"], "algorithm.loss.clip_eps=nan must be a finite number"),
    (["backend.betas=[0.9,nan]"], "backend.betas[1]=nan must be a finite number"),
    (["backend.betas=[0.9,1.0]"], "backend.betas=[0.9, 1.0] must be two numbers in [0, 1)"),
    (["backend.eps=0"], "backend.eps=0 must be > 0"),
    (["backend.weight_decay=-0.1"], "backend.weight_decay=-0.1 must be >= 0"),
    (["trainer.warmup.lr=-1"], "trainer.warmup.lr=-1 must be > 0 when trainer.warmup.steps > 0"),
    (["trainer.reward_max_abs=0"], "trainer.reward_max_abs=0 must be > 0"),
]


def model_loaded(*args, **kwargs):
    raise AssertionError("the run started (a model would load now): the mistake was not caught early")


def outcome(overrides: list[str], run_dir: Path) -> str:
    """What `python train.py <overrides>` reports, run in this process: the error's message."""
    try:
        cfg = compose_config(overrides)
    except Exception as err:  # noqa: BLE001 - Hydra's own composition errors
        return str(err)
    with pytest.raises(Exception) as err:  # noqa: PT011 - each case names its own message below
        run(cfg, run_dir)
    assert isinstance(err.value, ConfigError), repr(err.value)  # the user's input, reported as such
    return str(err.value)


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("index", range(len(CASES)), ids=[" ".join(c[0]) for c in CASES])
def test_wrong_invocation_fails_early_and_clearly(index, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RLVR_TEST_NO_SUCH_KEY", raising=False)
    monkeypatch.setattr(Trainer, "fit", model_loaded)  # a case that gets this far fails now, not after a run
    overrides, expected = CASES[index]
    run_dir = tmp_path / "run"
    message = outcome(overrides, run_dir)
    assert expected in message, message[-2500:]
    assert "loading policy" not in caplog.text  # failed before any model was loaded
    assert not run_dir.exists(), f"left {sorted(p.name for p in run_dir.iterdir())}"


def test_as_typed_a_config_error_is_a_message_in_about_a_second(tmp_path):
    """The real command: exit status 2, the message without a traceback, no run folder left (not even Hydra's
    .hydra/), and neither torch nor transformers imported (their import is ~6 s of CPU here)."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPROFILEIMPORTTIME": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run([sys.executable, "train.py", "backend=tinker", "trainer.warmup.steps=0",
                           "trainer.group_size=1", f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    start = message.index("rlvr.errors.ConfigError: invalid config:")  # then every problem, one a line
    assert "  trainer.group_size=1: every group's rewards tie, so no step would train (need >= 2)" in message[start:]
    assert ("  backend <rlvr.backend.tinker.TinkerBackend>: needs an API key in $TINKER_API_KEY: $TINKER_API_KEY is "
            "not set (backend.api_key_env names it)") in message[start:]
    assert "Traceback" not in proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "transformers", "peft", "tinker", "vllm"}, sorted(imported)[:20]
    assert not run_dir.exists()


def test_numbers_that_cannot_train_exit_2_naming_each_key(tmp_path):
    """`python train.py trainer.lr=nan` used to train: its first update made every weight NaN, and sampling died
    with a traceback. Now: exit 2 before any model loads, every such number named."""
    bad = ["trainer.lr=nan", "algorithm.kl.coef=inf", "trainer.sampling.temperature=nan"]
    proc = subprocess.run([sys.executable, "train.py", *bad, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("rlvr.errors.ConfigError: invalid config:\n  "), proc.stderr[-2000:]
    assert all(f"  {override} must be a finite number\n" in proc.stderr for override in bad), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "loading policy" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()


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
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert f"hydra.run.dir: cannot create or write the output folder ({target})" in proc.stderr
        assert "loading policy" not in proc.stdout + proc.stderr
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("override,expected", [
    ("algoritm=grpo", "algoritm=grpo: no config group or key of that name, so nothing would read it (did you mean "
                      "algorithm=grpo?)"),
    ("algorithm=grpoo", "algorithm=grpoo: no option 'grpoo' in group algorithm (did you mean algorithm=grpo? options: "
                        "discover_entropic, grpo, maxrl, opd, pkpo, reinforce_pp, rloo)"),
    ("trainer.lrr=1e-3", "trainer.lrr=1e-3: trainer has no key 'lrr' (did you mean trainer.lr=1e-3?)"),
    # a key of the default algorithm (grpo) but not of the one chosen: no did-you-mean naming the key itself
    ("algorithm=maxrl algorithm.scale=std", "algorithm.scale=std: algorithm has no key 'scale'\n"),
    ("trainer.lr=[", "cannot parse an override: no viable alternative at input '['"),
    ("hydra/launcher=slurmm", "hydra/launcher=slurmm: no option 'slurmm' in group hydra/launcher (did you mean "
                              "hydra/launcher=slurm?"),
    ("transform.delay_steps=0", "transform.delay_steps=0: transform.delay_steps is now transform.schedule.delay_steps "
                                "(say transform.schedule.delay_steps=0)"),
    ("transform.fixed_lambda=0.5", "transform.fixed_lambda=0.5: transform.fixed_lambda is now "
                                   "transform.schedule.fixed_lambda (say transform.schedule.fixed_lambda=0.5)"),
    ("reward.max_abs=10", "reward.max_abs=10: reward.max_abs is now trainer.reward_max_abs (say "
                          "trainer.reward_max_abs=10)"),
    # a group or key given twice with different values: Hydra takes the last one silently (issue 37 req 6)
    ("campaign=smoke campaign=sepa_ablation", "campaign is chosen 2 times with different options (campaign=smoke, "
                                              "campaign=sepa_ablation): Hydra would silently take the last one"),
    ("algorithm=maxrl algorithm=grpo", "algorithm is chosen 2 times with different options"),
    ("--multirun seed=0,1 hydra/launcher=local hydra/launcher=slurm", "hydra/launcher is chosen 2 times"),
])
def test_hydras_own_errors_exit_2_in_rlvrs_words(override, expected, tmp_path):
    """Mistakes Hydra finds while composing: exit status 2 (not Hydra's 1), rlvr's wording, a did-you-mean, and never
    Hydra's advice to append the key with `+` (followed, it trained plain GRPO and exited 0)."""
    proc = subprocess.run([sys.executable, "train.py", *override.split(), f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("rlvr.errors.ConfigError: invalid config:\n  ") and expected in proc.stderr, (
        proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "To append to your config use" not in proc.stderr
    assert not (tmp_path / "run").exists()
