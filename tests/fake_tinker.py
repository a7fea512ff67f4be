"""An in-process stand-in for the tinker SDK's clients (the service cannot be reached from tests).

`FakeServiceClient` has the constructor and methods rlvr calls, returns the SDK's own result types
(`tinker.types.*`) wrapped in futures with `.result(timeout=)`, and records every call in `CALLS` as
(method, kwargs). Sampling is deterministic: a sampler made after k optimizer steps draws, for a request
seeded s, tokens from a `random.Random((s, k, sample index))` over `VOCAB`, stopping at the first stop id
with probability 1/3 per token; logprobs are −0.1·(position+1). So the same seed gives different tokens
after each step, and a test can tell which sampler answered.

Fault injection: `FAIL[method] = n` makes the next n submits of `method` raise a transient
`tinker.APIConnectionError`; `BAD[method] = n` a non-transient `tinker.BadRequestError`; `HANG` holds the
methods whose submit blocks for an hour (as the real SDK can against an unreachable service); `LATE[method] = n`
makes the next n futures of `method` fail from `.result`, after the request was sent.

Service time: `DELAY[method] = s` makes each future of `method` answer `s` seconds after its submit (`.result`
sleeps until then, as a real future waits for the service); `TIMES` records (method, submitted, answered) of every
answered future (`time.perf_counter`), so a test can tell whether two calls were in flight at once.

The service's storage is `STATES`: path → optimizer steps of the saved state, so a second backend in the
same process can load what a first one saved (a resumed run). `reset()` clears everything.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import tinker
from tinker import types

VOCAB = list(range(3, 15))
"""The tiny model's character ids (rlvr/model/tiny.py: <pad>, <eos>, <unk>, then 12 characters)."""

CALLS: list[tuple[str, dict]] = []
FAIL: dict[str, int] = {}
BAD: dict[str, int] = {}
HANG: set[str] = set()
LATE: dict[str, int] = {}
"""method → n: the next n futures of `method` raise a transient error from `.result` (after being sent)."""
DELAY: dict[str, float] = {}
TIMES: list[tuple[str, float, float]] = []
STATES: dict[str, int] = {}
SERVICES: list[FakeServiceClient] = []


def reset() -> None:
    CALLS.clear(), FAIL.clear(), BAD.clear(), HANG.clear(), LATE.clear(), STATES.clear(), SERVICES.clear()
    DELAY.clear(), TIMES.clear()


def backend(call_timeout_s: float = 10.0) -> Any:
    """A TinkerBackend on this fake service: LoRA rank 8 on q_proj and v_proj, importance_sampling, no retries."""
    from rlvr.backend.tinker import TinkerBackend
    from rlvr.types import LoraSpec

    return TinkerBackend(
        lora=LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"]), lora_seed=7,
        base_model="fake/base", api_key_env="TINKER_API_KEY", base_url=None, loss_fn="importance_sampling",
        betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0, call_timeout_s=call_timeout_s, retries=0,
        backoff_s=0.0, max_concurrent=4, client=FakeServiceClient)


def calls(method: str) -> list[dict]:
    return [kw for m, kw in CALLS if m == method]


class FakeFuture:
    def __init__(self, value: Any, method: str = "") -> None:
        self.value = value
        self.method = method
        self.submitted = time.perf_counter()

    def result(self, timeout: float | None = None) -> Any:
        if LATE.get(self.method, 0) > 0:
            LATE[self.method] -= 1
            raise tinker.APIConnectionError(request=httpx.Request("POST", f"https://fake.tinker/{self.method}"))
        answered = self.submitted + DELAY.get(self.method, 0.0)
        time.sleep(max(answered - time.perf_counter(), 0.0))
        TIMES.append((self.method, self.submitted, time.perf_counter()))
        return self.value


def _submit(method: str, **kwargs) -> None:
    """Record the call, then fail or hang as told."""
    CALLS.append((method, kwargs))
    if method in HANG:
        time.sleep(3600)
    request = httpx.Request("POST", f"https://fake.tinker/{method}")
    if FAIL.get(method, 0) > 0:
        FAIL[method] -= 1
        raise tinker.APIConnectionError(request=request)
    if BAD.get(method, 0) > 0:
        BAD[method] -= 1
        raise tinker.BadRequestError("bad request", response=httpx.Response(400, request=request), body=None)


def train_logprob(token: int, steps: int) -> float:
    """The fake training weights' log-probability of `token` after `steps` optimizer steps (float32-exact)."""
    return -0.125 * (token % 5) - 0.25 * (steps % 3) - 0.0625


class FakeServiceClient:
    def __init__(self, user_metadata=None, project_id=None, *, api_key: str | None = None,
                 base_url: str | None = None, **kwargs) -> None:
        self.api_key = api_key
        self.base_url = base_url
        SERVICES.append(self)

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    **kwargs) -> FakeFuture:
        _submit("create_lora_training_client", base_model=base_model, rank=rank, seed=seed, train_mlp=train_mlp,
                train_attn=train_attn, train_unembed=train_unembed)
        return FakeFuture(FakeTrainingClient(base_model, rank), "create_lora_training_client")


class FakeTrainingClient:
    runs = 0

    def __init__(self, base_model: str, rank: int) -> None:
        FakeTrainingClient.runs += 1
        self.run = f"run{FakeTrainingClient.runs}"
        self.base_model, self.rank = base_model, rank
        self.steps = 0
        """Optimizer steps applied to this run's weights."""

    def forward_backward(self, data: list[types.Datum], loss_fn: str, loss_fn_config=None) -> FakeFuture:
        _submit("forward_backward", data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
        # at ratio 1 (fresh samples) importance_sampling's loss is −Σ advantages
        total = -sum(sum(d.loss_fn_inputs["advantages"].tolist()) for d in data)
        return FakeFuture(types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[],
                                                      metrics={"loss:sum": total, "fake:datums": float(len(data))}),
                          "forward_backward")

    def forward(self, data: list[types.Datum], loss_fn: str, loss_fn_config=None) -> FakeFuture:
        """Forward only (nothing accumulates): `loss_fn_outputs[i]["logprobs"]` holds, per input position, the
        log-probability of its target token under the current weights, `train_logprob(target, steps)`."""
        _submit("forward", data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
        outputs = [{"logprobs": types.TensorData(
            data=[train_logprob(t, self.steps) for t in d.loss_fn_inputs["target_tokens"].tolist()],
            dtype="float32", shape=[len(d.loss_fn_inputs["target_tokens"].tolist())])} for d in data]
        return FakeFuture(types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                                      metrics={}), "forward")

    def optim_step(self, optim_params=None, *, adam_params=None) -> FakeFuture:
        _submit("optim_step", optim_params=optim_params or adam_params)
        self.steps += 1
        return FakeFuture(types.OptimStepResponse(metrics={"fake:step": float(self.steps)}), "optim_step")

    def save_weights_and_get_sampling_client(self, name=None, **kwargs) -> FakeFuture:
        _submit("save_weights_and_get_sampling_client", run=self.run, steps=self.steps)
        return FakeFuture(FakeSamplingClient(self.steps))

    def save_state(self, name: str, ttl_seconds=None, overwrite: bool = False, user_metadata=None) -> FakeFuture:
        _submit("save_state", name=name, overwrite=overwrite)
        path = f"tinker://{self.run}/state/{name}"
        STATES[path] = self.steps
        return FakeFuture(types.SaveWeightsResponse(path=path))

    def save_weights_for_sampler(self, name: str, ttl_seconds=None, user_metadata=None) -> FakeFuture:
        _submit("save_weights_for_sampler", name=name)
        return FakeFuture(types.SaveWeightsForSamplerResponse(path=f"tinker://{self.run}/sampler_weights/{name}"))

    def load_state_with_optimizer(self, path: str, weights_access_token=None) -> FakeFuture:
        _submit("load_state_with_optimizer", path=path)
        self.steps = STATES[path]  # a path the service never saved: KeyError, as the service would refuse it
        return FakeFuture(types.LoadWeightsResponse(path=path))


class FakeSamplingClient:
    def __init__(self, version: int) -> None:
        self.version = version

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               **kwargs) -> FakeFuture:
        _submit("sample", version=self.version, prompt=prompt.to_ints(), num_samples=num_samples,
                sampling_params=sampling_params)
        stop = list(sampling_params.stop or [])
        sequences = []
        for i in range(num_samples):
            rng = random.Random(f"{sampling_params.seed}/{self.version}/{i}")
            tokens: list[int] = []
            while len(tokens) < sampling_params.max_tokens:
                if stop and tokens and rng.random() < 1 / 3:
                    tokens.append(stop[0])
                    break
                tokens.append(rng.choice(VOCAB))
            reason = "stop" if stop and tokens[-1] in stop else "length"
            sequences.append(types.SampledSequence(
                stop_reason=reason, sequence_id=f"s{i}", _tokens_list=tokens,
                _logprobs_list=[-0.1 * (t + 1) for t in range(len(tokens))],
            ))
        return FakeFuture(types.SampleResponse(sequences=sequences), "sample")
