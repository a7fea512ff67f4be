"""`backend=tinker` / `engine=tinker` against the in-process fake SDK (tests/fake_tinker.py): the exact
Datums sent, the sampler swap after each step, the Adam and loss settings, retries and bounded calls,
checkpoints and resume, and the config errors that stop a run before anything is built."""

import json
import time
from pathlib import Path

import fake_tinker
import pytest
import torch
from tinker import types

from composing import FAST, compose_config
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.tinker import RL_LOSSES, TinkerBackend, TinkerCallError, datums_of
from rlvr.build import backend_runtime_args
from rlvr.distributed import ONE_PROCESS, World
from rlvr.engine.tinker import TinkerEngine
from rlvr.errors import ConfigError
from rlvr.run import run
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, Rollouts, SamplingParams, TrainBatch

LORA = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
IS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)
TINY = ["backend=tinker", "backend.client._target_=fake_tinker.FakeServiceClient", "backend.base_model=fake/base",
        "backend.backoff_s=0", "trainer.batch_size=2", "trainer.group_size=4", "data.eval_size=8"]


pytestmark = pytest.mark.usefixtures("fake_service")  # tests/conftest.py


def backend(**overrides) -> TinkerBackend:
    kwargs = dict(
        lora=LORA, lora_seed=7, base_model="fake/base", api_key_env="TINKER_API_KEY", base_url=None,
        loss_fn="importance_sampling", betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, grad_clip_norm=1.0,
        call_timeout_s=5.0, retries=2, backoff_s=0.0, max_concurrent=4, client=fake_tinker.FakeServiceClient,
    )
    return TinkerBackend(**{**kwargs, **overrides})


def known_batch() -> TrainBatch:
    """P=2 prompts × G=2. Rows (pad 0, EOS 1):
        row 0: prompt [5,6,7], completion [3,4,1]   adv [ 1, 1, 1]
        row 1: prompt [5,6,7], completion [8,1]     adv [-1,-1]
        row 2: prompt [9,10],  completion [11,12,13] (hit max_tokens) adv 0 → not sent
        row 3: prompt [9,10],  completion [14,1]    adv [0.5, 0] (its EOS token has advantage 0)
    N = tokens with a non-zero advantage = 3 + 2 + 1 = 6."""
    tokens = torch.tensor([[3, 4, 1], [8, 1, 0], [11, 12, 13], [14, 1, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    logprobs = torch.tensor([[-0.5, -0.25, -0.125], [-1.0, -2.0, 0.0], [-0.1, -0.2, -0.3], [-0.75, -1.5, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    rollouts = Rollouts(prompt_ids_P=[[5, 6, 7], [9, 10]], group_size=2, tokens_PG_T=tokens, logprobs_PG_T=logprobs,
                        mask_PG_T=mask, finished_PG=torch.tensor([True, True, False, True]), temperature=1.0)
    return TrainBatch(rollouts, adv)


def as_lists(d: types.Datum) -> tuple:
    f = d.loss_fn_inputs
    return (d.model_input.to_ints(), f["target_tokens"].tolist(), f["logprobs"].tolist(), f["advantages"].tolist())


def test_datums_are_shifted_by_one_with_zero_prompt_credit_and_token_mean_advantages():
    datums, n = datums_of(known_batch())
    assert n == 6 and len(datums) == 3  # row 2 (all advantages 0) is not sent
    f32 = lambda xs: torch.tensor(xs, dtype=torch.float32).tolist()  # noqa: E731 - float32 on the wire
    # input = prompt + completion[:-1]; target i = token i+1 of prompt+completion; prompt positions 0
    assert as_lists(datums[0]) == (
        [5, 6, 7, 3, 4], [6, 7, 3, 4, 1], f32([0, 0, -0.5, -0.25, -0.125]), f32([0, 0, 1 / 6, 1 / 6, 1 / 6])
    )
    assert as_lists(datums[1]) == ([5, 6, 7, 8], [6, 7, 8, 1], f32([0, 0, -1.0, -2.0]), f32([0, 0, -1 / 6, -1 / 6]))
    assert as_lists(datums[2]) == ([9, 10, 14], [10, 14, 1], f32([0, -0.75, -1.5]), f32([0, 0.5 / 6, 0]))
    assert {d.loss_fn_inputs["target_tokens"].dtype for d in datums} == {"int64"}
    assert {d.loss_fn_inputs["advantages"].dtype for d in datums} == {"float32"}


def test_an_aggregation_other_than_token_mean_weighs_the_advantages_it_sends():
    # prompt_mean on known_batch: prompt 0 has 3 + 2 = 5 tokens with signal, prompt 1 has 1; P = 2. Each token's
    # advantage is sent times w = 1/(P·n_p): row 0 1/10, row 1 −1/10, row 3 0.5/2 (its EOS token still 0).
    datums, n = datums_of(known_batch(), PolicyLoss(0.0, 0.0, 0.0, aggregation="prompt_mean"))
    f32 = lambda xs: torch.tensor(xs, dtype=torch.float32).tolist()  # noqa: E731 - float32 on the wire
    assert n == 6 and [as_lists(d)[3] for d in datums] == [f32([0, 0, 0.1, 0.1, 0.1]), f32([0, 0, -0.1, -0.1]),
                                                           f32([0, 0.25, 0])]


def test_start_opens_a_lora_run_with_the_key_rank_and_seed():
    backend()
    service = fake_tinker.SERVICES[-1]
    assert service.api_key == "tk-test-secret" and service.base_url is None
    assert fake_tinker.calls("create_lora_training_client") == [dict(
        base_model="fake/base", rank=8, seed=7, train_mlp=True, train_attn=True, train_unembed=False)]
    assert len(fake_tinker.calls("save_weights_and_get_sampling_client")) == 1  # the initial weights' sampler


def test_a_step_sends_the_datums_then_adam_then_swaps_the_sampler():
    b = backend()
    before = b.policy
    stats = b.train_step(known_batch(), IS, lr=3e-5)
    (fwd,) = fake_tinker.calls("forward_backward")
    assert fwd["loss_fn"] == "importance_sampling" and fwd["loss_fn_config"] is None
    assert [as_lists(d) for d in fwd["data"]] == [as_lists(d) for d in datums_of(known_batch())[0]]
    (opt,) = fake_tinker.calls("optim_step")
    assert opt["optim_params"] == types.AdamParams(learning_rate=3e-5, beta1=0.9, beta2=0.95, eps=1e-8,
                                                   weight_decay=0.01, grad_clip_norm=1.0)
    assert [m for m, _ in fake_tinker.CALLS][-3:] == ["forward_backward", "optim_step",
                                                     "save_weights_and_get_sampling_client"]
    assert b.policy is not before and b.policy.version == 1 and b.policy.sampler.version == 1
    # the fake's loss:sum at ratio 1 is −Σ sent advantages = −(3/6 − 2/6 + 0.5/6)
    assert stats["loss"] == pytest.approx(-(3 - 2 + 0.5) / 6, abs=1e-6)
    assert stats["rl/optimizer_nonzero_advantage_action_tokens"] == 6 and stats["tinker_train_rows"] == 3
    assert stats["tinker/fake:datums"] == 3 and stats["tinker/optim/fake:step"] == 1 and stats["lr"] == 3e-5


def test_clipping_goes_to_a_clipping_loss_and_not_to_importance_sampling():
    ppo = PolicyLoss(clip_eps=0.2, clip_eps_high=0.28, adv_clip_max=0.0)
    backend(loss_fn="ppo").train_step(known_batch(), ppo, lr=1e-5)
    (fwd,) = fake_tinker.calls("forward_backward")
    assert fwd["loss_fn"] == "ppo"
    assert fwd["loss_fn_config"] == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    with pytest.raises(ConfigError, match="backend.loss_fn=ppo"):
        backend().train_step(known_batch(), ppo, lr=1e-5)
    with pytest.raises(ConfigError, match="backend.loss_fn='sft'"):
        backend(loss_fn="sft")


def test_the_engine_samples_from_the_sampler_of_the_latest_step():
    b = backend()
    engine = TinkerEngine(b.policy, eos_ids=[1], pad_id=0)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=6)
    first = engine.sample([[5, 6], [7]], 3, params, seeds=prompt_seeds(11, 2))
    b.train_step(known_batch(), IS, lr=1e-5)
    stale = engine.sample([[5, 6], [7]], 3, params, seeds=prompt_seeds(11, 2))  # no sync yet: the old sampler
    engine.sync(b.policy)
    fresh = engine.sample([[5, 6], [7]], 3, params, seeds=prompt_seeds(11, 2))
    versions = [kw["version"] for kw in fake_tinker.calls("sample")]
    assert versions == [0, 0, 0, 0, 1, 1]
    assert torch.equal(first.tokens_PG_T, stale.tokens_PG_T) and not torch.equal(first.tokens_PG_T, fresh.tokens_PG_T)
    request = fake_tinker.calls("sample")[0]
    assert request["num_samples"] == 3 and request["prompt"] == [5, 6]
    sp = request["sampling_params"]
    assert (sp.max_tokens, sp.temperature, sp.top_p, list(sp.stop)) == (6, 1.0, 1.0, [1])
    seeds = [kw["sampling_params"].seed for kw in fake_tinker.calls("sample")]
    assert seeds[0] != seeds[1] and seeds[:2] == seeds[2:4]  # one seed per prompt, a function of the step seed


def test_rollouts_follow_the_engine_contract():
    engine = TinkerEngine(backend().policy, eos_ids=[1], pad_id=0)
    ro = engine.sample([[5], [6], [7]], 4, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=5),
                       seeds=prompt_seeds(3, 3))
    responses = [fake_tinker.FakeSamplingClient(0).sample(
        types.ModelInput.from_ints(p), 4, kw["sampling_params"]).value
        for p, kw in zip([[5], [6], [7]], fake_tinker.calls("sample"))]
    assert ro.tokens_PG_T.shape[0] == 12 and ro.entropy_PG_T is None and ro.temperature == 1.0
    for r, seq in enumerate(s for resp in responses for s in resp.sequences):  # row p·G+g
        n = len(seq.tokens)
        assert ro.tokens_PG_T[r, :n].tolist() == seq.tokens and (ro.tokens_PG_T[r, n:] == 0).all()
        assert ro.mask_PG_T[r].tolist() == [True] * n + [False] * (ro.mask_PG_T.shape[1] - n)
        assert ro.logprobs_PG_T[r, :n].tolist() == pytest.approx(seq.logprobs)
        assert bool(ro.finished_PG[r]) == (seq.stop_reason == "stop") == (seq.tokens[-1] == 1)


def test_transient_failures_are_retried_and_the_last_one_names_the_call():
    b = backend(retries=2)
    fake_tinker.FAIL["forward_backward"] = 2
    b.train_step(known_batch(), IS, lr=1e-5)  # third try succeeds
    assert len(fake_tinker.calls("forward_backward")) == 3
    fake_tinker.FAIL["optim_step"] = 3
    with pytest.raises(TinkerCallError, match=r"tinker optim_step: still failing after 3 tries.*APIConnectionError"):
        b.train_step(known_batch(), IS, lr=1e-5)


def test_a_training_call_that_may_have_been_applied_is_not_sent_twice():
    b = backend(retries=3)
    fake_tinker.LATE["forward_backward"] = 1  # sent, then the connection dropped: gradients may be accumulated
    with pytest.raises(TinkerCallError, match="forward_backward failed .* after it was sent; not retried"):
        b.train_step(known_batch(), IS, lr=1e-5)
    assert len(fake_tinker.calls("forward_backward")) == 1 and fake_tinker.calls("optim_step") == []
    fake_tinker.LATE["sample"] = 1  # sampling has no side effect: sent again
    TinkerEngine(b.policy, eos_ids=[1], pad_id=0).sample([[5]], 2, SamplingParams(1.0, 1.0, 3),
                                                         seeds=prompt_seeds(0, 1))
    assert len(fake_tinker.calls("sample")) == 2


def test_a_bad_request_is_not_retried():
    b = backend(retries=5)
    fake_tinker.BAD["forward_backward"] = 1
    with pytest.raises(TinkerCallError, match="tinker forward_backward failed: BadRequestError"):
        b.train_step(known_batch(), IS, lr=1e-5)
    assert len(fake_tinker.calls("forward_backward")) == 1


def test_a_hanging_call_is_bounded():
    fake_tinker.HANG.add("create_lora_training_client")  # the SDK's silent block against a dead service
    t0 = time.perf_counter()
    with pytest.raises(TinkerCallError, match="create_lora_training_client: still failing after 2 tries"):
        backend(call_timeout_s=0.3, retries=1)
    assert time.perf_counter() - t0 < 3
    assert len(fake_tinker.calls("create_lora_training_client")) == 2


def test_only_failed_sample_requests_are_sent_again():
    engine = TinkerEngine(backend().policy, eos_ids=[1], pad_id=0)
    fake_tinker.FAIL["sample"] = 1  # the first of three prompts' requests fails once
    engine.sample([[5], [6], [7]], 2, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=3),
                  seeds=prompt_seeds(0, 3))
    assert [kw["prompt"] for kw in fake_tinker.calls("sample")] == [[5], [6], [7], [5]]


def test_save_then_load_in_a_new_backend_restores_the_training_state(tmp_path):
    a = backend()
    a.train_step(known_batch(), IS, lr=1e-5)
    a.train_step(known_batch(), IS, lr=1e-5)
    folder = tmp_path / ".step_2.tmp"  # the name Checkpoints writes under before the rename
    a.save(folder)
    record = json.loads((folder / "tinker_state.json").read_text())
    run_a = fake_tinker.calls("save_weights_and_get_sampling_client")[0]["run"]
    assert record == {"state_path": f"tinker://{run_a}/state/step_2", "steps": 2, "rank": 8,
                      "sampler_path": f"tinker://{run_a}/sampler_weights/step_2"}
    assert fake_tinker.calls("save_state") == [{"name": "step_2", "overwrite": True}]
    b = backend()
    assert b.policy.version == 0
    b.load(folder)
    assert fake_tinker.calls("load_state_with_optimizer") == [{"path": record["state_path"]}]
    assert b.policy.version == 2 and b.policy.sampler.version == 2 and b.steps == 2
    assert "tk-test-secret" not in (folder / "tinker_state.json").read_text()


def test_the_key_is_passed_to_the_client_and_never_kept():
    b = backend()
    assert "tk-test-secret" not in repr(vars(b)) and "tk-test-secret" not in repr(vars(b.calls))


# --- through rlvr.run: the config checks, a whole run, a resumed run -----------------------------------


def test_missing_key_fails_before_anything_is_built(monkeypatch, tmp_path):
    monkeypatch.delenv("TINKER_API_KEY")
    with pytest.raises(ConfigError, match="TINKER_API_KEY is not set"):
        run(compose_config(FAST + TINY), tmp_path / "run")
    assert fake_tinker.CALLS == [] and fake_tinker.SERVICES == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,message", [
    (["transform=gtpo", "transform.uncertainty=shannon_entropy"], "needs full-distribution entropy"),
    (["engine=pytorch"], "engine <rlvr.engine.pytorch.PyTorchEngine> needs the policy as a module in this process"),
    (["trainer.warmup.steps=5"], "trainer <rlvr.trainer.Trainer> needs the policy as a module in this process "
                                 "(trainer.warmup.steps=5: the SFT warm-up trains it here)"),
    (["model.lora=null"], "backend <rlvr.backend.tinker.TinkerBackend> needs a LoRA adapter to train (it trains LoRA "
                          "adapters only), which no chosen component gives: choose a model preset with model.lora set"),
    (["backend.base_model=null"], "backend.base_model is null"),
    (["algorithm.loss.clip_eps=0.2"], "needs PPO ratio clipping in the loss (algorithm.loss.clip_eps=0.2), which no "
                                      "chosen component gives: choose backend=fsdp, or backend=local (or "
                                      "backend=tinker with backend.loss_fn=ppo or cispo)"),
])
def test_tinker_config_mistakes_fail_before_anything_is_built(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        run(compose_config(FAST + TINY + overrides), tmp_path / "run")
    assert message in str(err.value)
    assert fake_tinker.SERVICES == []


def test_a_tinker_engine_with_the_local_backend_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="engine <rlvr.engine.tinker.TinkerEngine> needs a policy held by a service "
                                          "to sample from .*: choose backend=prime_rl, or backend=tinker \\(with its "
                                          "engine of the same name\\)"):
        run(compose_config(FAST + ["engine=tinker"]), tmp_path / "run")


def test_backend_tinker_selects_engine_tinker_and_a_hub_preset_names_the_base_model():
    cfg = compose_config(["backend=tinker", "model=qwen3_4b"])
    assert cfg.engine._target_ == "rlvr.engine.tinker.TinkerEngine"
    assert cfg.backend.base_model == "Qwen/Qwen3-4B-Instruct-2507"
    assert compose_config(["backend=tinker"]).backend.base_model is None  # the tiny model has no hub id


def test_campaign_jobs_share_a_throttle_folder_and_single_runs_have_none(tmp_path):
    cfg = compose_config(TINY)
    assert backend_runtime_args(cfg, tmp_path, ONE_PROCESS) == {"throttle_dir": str(tmp_path / "tinker_throttle")}
    assert backend_runtime_args(cfg, None, ONE_PROCESS) == {}
    assert backend_runtime_args(compose_config([]), tmp_path, ONE_PROCESS) == {}  # backend=local takes none
    two = World(rank=1, size=2, local_rank=1)
    assert backend_runtime_args(compose_config(["backend=fsdp"]), tmp_path, two) == {"world": two}  # fsdp: the world


def test_a_run_trains_on_the_service_and_resumes_from_its_recorded_state(tmp_path):
    out = tmp_path / "run"
    summary = run(compose_config(FAST + TINY + ["trainer.max_steps=3", "trainer.save_every=2"]), out)
    assert summary["steps"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "mean_reward" in r]
    assert [r["step"] for r in train] == [0, 1, 2]
    trained = [r for r in train if not r["skipped"]]
    assert len(fake_tinker.calls("forward_backward")) == len(trained) == len(fake_tinker.calls("optim_step"))
    # every sampling call after k optimizer steps used the sampler of version k
    assert all(kw["version"] <= len(trained) for kw in fake_tinker.calls("sample"))
    assert (out / "checkpoints" / "step_2" / "tinker_state.json").is_file()
    final = json.loads((out / "checkpoints" / "step_3" / "tinker_state.json").read_text())
    assert final["state_path"] in fake_tinker.STATES

    # the same folder with more steps continues from the final checkpoint's Tinker state
    fake_tinker.CALLS.clear()
    run(compose_config(FAST + TINY + ["trainer.max_steps=5", "trainer.save_every=2"]), out)
    assert fake_tinker.calls("load_state_with_optimizer") == [{"path": final["state_path"]}]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "mean_reward" in r]
    assert steps == [0, 1, 2, 3, 4]
    assert "tk-test-secret" not in "".join(p.read_text(errors="ignore") for p in Path(out).rglob("*") if p.is_file())


def test_the_loss_names_checked_without_the_sdk_are_the_sdks():
    """RL_LOSSES is written out so that checking a config never imports the SDK (~5 s, it imports torch)."""
    from typing import get_args

    from tinker import types

    assert set(RL_LOSSES) == set(get_args(types.LossFnType)) - {"custom", "cross_entropy"}
