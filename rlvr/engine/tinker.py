"""`engine=tinker`: sampling on the Tinker service, from the sampler `backend=tinker` made of its latest weights.

`sync(policy)` takes the backend's `TinkerPolicy` (a `tinker.SamplingClient` plus the backend's call policy:
timeout, retries, throttle). `sample` fires one request per prompt, all at once,

    sampler.sample(ModelInput.from_ints(prompt), num_samples=G,
                   SamplingParams(max_tokens, temperature, top_p, seed=its group's seed, stop=eos_ids))

then collects them (each bounded by `backend.call_timeout_s`, failed ones retried) and lays the sequences
out as rlvr's Rollouts: row p·G+g, right-padded with `pad_id`, the logprobs the service returned for the
sampled tokens, finished where `stop_reason == "stop"`.

Assumption (stated, not verifiable offline): the service returns the stop token as the last sampled token
of a stopped sequence, as tinker-cookbook's renderers expect when they parse a response up to its stop
token. A stopped sequence whose last token is not an EOS id is kept as returned (and logged once) rather
than given an EOS with an invented log-probability.

Sampling ahead (`trainer.off_policy_steps` ≥ 1, rlvr/overlap.py): `sample` runs in the sampler thread while the
main thread trains. The SDK's calls return futures at once (`sample`, `forward_backward`, `optim_step`: the
SDK's own event loop thread sends them; its `*_async` coroutines are deprecated in favour of these futures), so
the two threads' requests are in flight on the service together. The engine samples from the `TinkerPolicy` of
its last `sync` until the next one: a sampling client is the snapshot of the weights saved after `version`
optimizer steps (`save_weights_and_get_sampling_client`), which later steps do not change, so a step samples from
exactly the version `SampleAhead` synced (tests/backend/test_tinker_ahead.py). For the same reason the engine stages
a version (`stage`, capability `staged_sync`) without copying anything: at k ≥ 2 the trainer never waits for older
steps' sampling before it hands the engine a newer sampler.

Seeds: each prompt gets its own seed derived from the step's sampler seed, so rollouts depend on (seed,
step) as on the local engine; whether the service reproduces a seeded draw exactly is its business.

Shannon entropy is not available (the service returns sampled-token logprobs only): its `needs` do not
provide `entropy`, so a transform that needs it fails at config time. The service's logprobs are those of the
distribution it sampled from; at temperature ≠ 1 they need not match training's (see rlvr/backend/tinker.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.backend.tinker import TinkerPolicy
from rlvr.engine.rows import rollouts_from_rows
from rlvr.lazy import lazy_import
from rlvr.protocols import Needs, Staged
from rlvr.seeds import group_seeds
from rlvr.types import Rollouts, SamplingParams

tinker = lazy_import("tinker")

log = logging.getLogger("rlvr")


class TinkerEngine:
    """Samples from a remote backend's policy handle (pairs with `backend=tinker`)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(provides=frozenset({"staged_sync"}),
                     requires={"remote_policy": "it samples from the service's latest weights"})

    def __init__(self, policy: TinkerPolicy, eos_ids: list[int], pad_id: int) -> None:
        self.eos_ids = list(eos_ids)
        self.pad_id = pad_id
        self._warned_stop = False
        self.sync(policy)

    def connect(self) -> None:
        """Nothing to reach: the engine is ready once built."""

    def sync(self, policy: TinkerPolicy) -> int:
        """Sample from the service's latest weights (the backend saved them there): nothing written here, 0 bytes."""
        self.policy = policy
        return 0

    def stage(self, policy: TinkerPolicy) -> Staged:
        """`sync(policy)` in two halves (rlvr/overlap.py): a sampling client is already a snapshot of one version's
        weights on the service, which later steps do not change, so there is nothing to copy; loading makes it the
        one sampled from."""
        def load() -> None:
            self.policy = policy

        return Staged(load, 0)

    def sleep(self) -> None:
        """Nothing to give back: the sampler runs on the service."""

    def sample_beside_training(self, beside: bool) -> None:
        """Nothing to move: sampling runs on the service, and this process only waits on the SDK's futures (the GIL
        released), so the sampler thread's requests are in flight while the main thread's training calls are."""

    def close(self) -> None:
        """Nothing to release: the sampler belongs to the backend's service client."""

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        if with_entropy:
            raise ValueError("engine=tinker cannot give full-distribution entropy (the service returns sampled-token "
                             "logprobs only)")
        sampler = self.policy.sampler
        seeds = group_seeds(seeds, len(prompt_ids_P))

        def request(p: int, prompt: list[int]):
            sampling = tinker.types.SamplingParams(
                max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
                seed=seeds[p], stop=self.eos_ids,
            )
            return lambda: sampler.sample(prompt=tinker.types.ModelInput.from_ints(prompt), num_samples=group_size,
                                          sampling_params=sampling)

        responses = self.policy.calls.call_all("sample", [request(p, ids) for p, ids in enumerate(prompt_ids_P)])
        sequences = []
        for p, response in enumerate(responses):
            if len(response.sequences) != group_size:
                raise RuntimeError(f"tinker sample: prompt {p} got {len(response.sequences)} sequences, "
                                   f"asked for {group_size}")
            sequences.extend(response.sequences)
        return self._rollouts(prompt_ids_P, group_size, params, sequences)

    def _rollouts(self, prompt_ids_P, group_size: int, params: SamplingParams, sequences) -> Rollouts:
        for i, s in enumerate(sequences):
            if s.logprobs is None or len(s.logprobs) != len(s.tokens):
                raise RuntimeError(f"tinker sample: sequence {i} has {len(s.tokens)} tokens, logprobs {s.logprobs!r}")
            if s.stop_reason == "stop" and (not s.tokens or s.tokens[-1] not in self.eos_ids) and not self._warned_stop:
                self._warned_stop = True
                log.warning("tinker sample: a sequence stopped without an EOS id as its last token (%s); kept as "
                            "returned", s.tokens[-3:])
        rows = [(s.tokens, s.logprobs) for s in sequences]
        return rollouts_from_rows(prompt_ids_P, group_size, rows, self.pad_id, self.eos_ids, params.temperature)
