"""`backend=tinker` sampling ahead of training (`trainer.off_policy_steps=k`): rlvr/overlap.py's `SampleAhead` drives
the real backend and engine against the fake SDK (tests/fake_tinker.py), whose futures answer after a set service
time. The sampler thread's `sample` requests and the main thread's `forward_backward`/`optim_step` are in flight at
once; each step samples from the saved weights of exactly version step − k; the same seed repeats the same rows.
Whole runs through `run()` (what `python train.py backend=tinker trainer.off_policy_steps=k correction=token_tis
algorithm.loss.correction.pi_old=decoupled` does) start, sample ahead and train on the service's decoupled π_old."""

import json

import fake_tinker
import pytest
import torch

from composing import FAST, MIXED, OVERLAP, compose_config
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.tinker import TinkerBackend
from rlvr.engine.tinker import TinkerEngine
from rlvr.overlap import Job, SampleAhead, SampleInline
from rlvr.run import run
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, SamplingParams, TrainBatch

LORA = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
IS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)
PARAMS = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=6)
GROUP = 3
SERVICE_S = 0.05
"""The fake service's answer time for sampling and for each training call."""


pytestmark = pytest.mark.usefixtures("fake_service")  # tests/conftest.py


def backend() -> TinkerBackend:
    return fake_tinker.backend(call_timeout_s=10.0)


def credit(sampled) -> TrainBatch:
    """Every group's first row +1, the others −1, on its sampled tokens: something to train on."""
    adv = torch.where(torch.arange(len(sampled.tokens_PG_T)) % GROUP == 0, 1.0, -1.0)[:, None]
    return TrainBatch(sampled, adv * sampled.action_mask_PG_T)


def drive(k: int, steps: int = 5, staged: bool = False) -> list[dict]:
    """A run of `steps` steps, sampling k ahead (k = 0: in the step, `SampleInline`) as the collect stage does:
    per step, the row fields of `next`, the sampled tokens, and the sampler version each request reached. `staged`:
    the engine's sampler handed over with `stage` (the sampler thread loads it), as a run does."""
    fake_tinker.DELAY.update({"sample": SERVICE_S, "forward_backward": SERVICE_S, "optim_step": SERVICE_S})
    trained = backend()
    engine = TinkerEngine(trained.policy, eos_ids=[1], pad_id=0)

    def sync(version: int) -> dict:
        assert trained.policy.version == version  # the weights saved after `version` optimizer steps
        engine.sync(trained.policy)
        return {}

    def sample(job: Job):
        before = len(fake_tinker.calls("sample"))
        sampled = engine.sample(job.work, GROUP, PARAMS, prompt_seeds(100 + job.step, len(job.work)))
        return sampled, {kw["version"] for kw in fake_tinker.calls("sample")[before:]}

    def work(step: int) -> list[list[int]]:
        return [[5 + step % 4, 6], [7, 8 + step % 3]]

    def stage(version: int):
        assert trained.policy.version == version
        return engine.stage(trained.policy).load, {}

    loop = (SampleAhead(k, "fixed", steps, work, sample, sync, stage=stage if staged else None) if k
            else SampleInline(work, sample, sync))
    engine.sample_beside_training(k > 0)
    loop.start(0, [])
    rows = []
    try:
        for step in range(steps):
            job, fields = loop.next(step)
            sampled, versions = job.sampled
            trained.train_step(credit(sampled), IS, lr=1e-4)
            rows.append({**fields, "step": step, "tokens": sampled.tokens_PG_T.tolist(), "versions": versions})
    finally:
        loop.close()
    return rows


def overlapped(first: str, second: str) -> bool:
    """Whether some answered call of `first` was in flight while one of `second` was."""
    spans = {m: [(a, b) for n, a, b in fake_tinker.TIMES if n == m] for m in (first, second)}
    return any(a < d and c < b for a, b in spans[first] for c, d in spans[second])


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_sampling_ahead_samples_the_weights_of_step_minus_k_while_the_service_trains(k, staged):
    rows = drive(k, staged=staged)
    assert overlapped("sample", "forward_backward") or overlapped("sample", "optim_step")
    assert [r["async/policy_version"] for r in rows] == [max(0, r["step"] - k) for r in rows]
    assert [r["versions"] for r in rows] == [{max(0, r["step"] - k)} for r in rows]  # every request of the step
    fake_tinker.reset()
    again = drive(k, staged=not staged)
    assert [r["tokens"] for r in again] == [r["tokens"] for r in rows]  # fixed mode: the same rows, either way
    assert [r["async/policy_version"] for r in again] == [r["async/policy_version"] for r in rows]


def test_the_synchronous_loop_never_samples_while_the_service_trains():
    rows = drive(0)
    assert not overlapped("sample", "forward_backward") and not overlapped("sample", "optim_step")
    assert [r["versions"] for r in rows] == [{r["step"]} for r in rows]
    assert len(fake_tinker.calls("forward_backward")) == len(rows)


def test_sampling_ahead_is_no_longer_excluded():
    settings = {"loss_fn": "importance_sampling", "base_model": "fake/base", "api_key_env": "TINKER_API_KEY"}
    assert "sampled_ahead" not in TinkerBackend.needs(settings).excludes


RUN = ["backend=tinker", "backend.client._target_=fake_tinker.FakeServiceClient", "backend.base_model=fake/base",
       "backend.backoff_s=0", "trainer.batch_size=2", "trainer.group_size=4", "data.eval_size=8",
       "trainer.max_steps=4", "trainer.off_policy_mode=fixed", *FAST, *MIXED, *OVERLAP]
"""A 4-step run on the fake service, with mixed groups (steps train) and the decoupled token_tis correction."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """k → two runs of the same config (each: its step rows, and what each `forward_backward` carried per datum:
    the input, the targets, π_old and the advantages sent)."""
    out: dict[int, list[dict]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINKER_API_KEY", "tk-test-secret")
        for k in (1, 2):
            out[k] = []
            for _ in range(2):
                fake_tinker.reset()
                folder = tmp_path_factory.mktemp(f"ahead{k}")
                run(compose_config([*RUN, f"trainer.off_policy_steps={k}"]), folder / "run")
                lines = (folder / "run" / "metrics.jsonl").read_text().splitlines()
                sent = [[{key: (d.model_input.to_ints() if key == "input" else d.loss_fn_inputs[key].tolist())
                          for key in ("input", "target_tokens", "logprobs", "advantages")} for d in kw["data"]]
                        for kw in fake_tinker.calls("forward_backward")]
                out[k].append({"rows": [r for r in map(json.loads, lines) if "loss" in r], "sent": sent,
                               "forwards": len(fake_tinker.calls("forward"))})
    fake_tinker.reset()
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_a_run_samples_k_ahead_and_trains_on_the_services_decoupled_pi_old(runs, k):
    first, again = runs[k]
    rows = first["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and not any(r["skipped"] for r in rows)
    assert [r["async/policy_version"] for r in rows] == [max(0, r["step"] - k) for r in rows]
    assert first["forwards"] == len(first["sent"]) == 4  # one forward per step gives π_train before its update
    for steps, datums in enumerate(first["sent"]):  # step n trains on weights after n optimizer steps
        for d in datums:
            credited = [i for i, a in enumerate(d["advantages"]) if a != 0]
            assert credited
            assert [d["logprobs"][i] for i in credited] == [
                fake_tinker.train_logprob(d["target_tokens"][i], steps) for i in credited]
    assert again["sent"] == first["sent"]  # fixed mode: the same rows, the same datums
    assert [r["async/policy_version"] for r in again["rows"]] == [r["async/policy_version"] for r in rows]
