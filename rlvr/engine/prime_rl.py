"""`engine=prime_rl`: rollouts from PRIME-RL's inference server, which loads the weights PRIME-RL's trainer broadcasts
(pairs with `backend=prime_rl`, rlvr/backend/prime_rl.py, which says which commit of PRIME-RL this follows).

PRIME-RL's inference server is vLLM's OpenAI-compatible server with routes of its own at the root
(src/prime_rl/inference/vllm/server.py). Sampling is `engine=openai`'s (rlvr/engine/openai.py, whose `sample` this
class inherits): `POST {base_url}/completions` with token-id prompts, `n`, `return_token_ids` and the sampled
tokens' log-probabilities, the same `logprobs_mode` rule (the server's `--logprobs-mode`; vLLM's default,
raw_logprobs, needs temperature 1).

Weight sync, as PRIME-RL's orchestrator does it (src/prime_rl/orchestrator/watcher.py and utils/client.py
`update_weights`): `sync(policy)` takes the backend's `PrimeRLPolicy` (a step n), waits for
`{output_dir}/broadcasts/step_{n}/STABLE` (at most `sync_timeout_s`; `backend=prime_rl` has already waited for it
after a step), then

    full weights:  POST {root}/pause  →  POST {root}/update_weights {"weight_dir": <the step folder>}
                   →  POST {root}/resume   (resume also when the update failed)
    LoRA:          POST {root}/load_lora_adapter {"lora_name": engine.lora_name, "lora_path": <the step folder>}
                   (PRIME-RL's wrapper reloads the same name in place); sampling then asks for that name

`{root}` is `base_url` without `/v1`. A step already loaded is not loaded again (an evaluation right after a step
syncs the same version). Admin requests are retried as every request is (`engine.retries`: connection errors,
timeouts, 429, 5xx; PRIME-RL's own client retries them too); a refused update (a 4xx, or a 5xx after the retries)
stops the run with the server's answer, and `/resume` is still sent after a failed `/update_weights`. `sync`
writes nothing itself: 0 bytes.

`connect` checks that `GET {base_url}/models` lists `engine.model` (a clear error naming the URL when the server is
not answering), then waits for the trainer's startup broadcast and loads the newest one marked STABLE: step 0, or
the step a resumed trainer restarts from (rlvr's resume then syncs that same step, which is not sent twice). There
is no logprob probe against a local policy (there is none here: the policy is the trainer's); PRIME-RL's trainer
reports the mismatch itself (`mismatch_kl`). No entropy (`needs` do not provide it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rlvr.backend.prime_rl import PrimeRLPolicy, broadcast_dir, newest_broadcast, wait_for_marker
from rlvr.engine.openai import OpenAIEngine, PolicySyncError, ServerServes, server_rules
from rlvr.errors import ConfigError
from rlvr.openai_api import OpenAIClient, ServerError, excerpt
from rlvr.protocols import Needs
from rlvr.requirements import EnvVar

log = logging.getLogger("rlvr")


class PrimeRLEngine(OpenAIEngine):
    """Samples from PRIME-RL's inference server; loads the trainer's broadcasts into it."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        key = settings["api_key_env"]
        return Needs(
            requires={"remote_policy": "it serves PRIME-RL's trainer's weights (backend=prime_rl)"},
            machine=(*((EnvVar(key, "engine.api_key_env"),) if key else ()),
                     ServerServes(settings["base_url"], settings["model"], key)),
        )

    def __init__(  # noqa: PLR0913 - every knob comes from conf/engine/prime_rl.yaml
        self,
        policy: PrimeRLPolicy,
        eos_ids: list[int],
        pad_id: int,
        base_url: str,
        model: str,
        api_key_env: str | None,
        logprobs_mode: str,
        max_concurrency: int,
        retries: int,
        backoff_s: float,
        timeout_s: float,
        sync_timeout_s: float,
        poll_s: float,
        lora_name: str,
    ) -> None:
        rules = [
            *server_rules(base_url, model, api_key_env, logprobs_mode, max_concurrency, retries, backoff_s, timeout_s),
            ("sync_timeout_s", sync_timeout_s, sync_timeout_s > 0, "> 0"),
            ("poll_s", poll_s, poll_s > 0, "> 0"),
            ("lora_name", lora_name, bool(lora_name), "the adapter name (PRIME-RL's model.lora.name)"),
        ]
        errors = [f"engine.{key}={value!r} must be {rule}" for key, value, ok, rule in rules if not ok]
        if not isinstance(policy, PrimeRLPolicy):
            errors.append(f"engine=prime_rl loads PRIME-RL's trainer's broadcasts: it needs backend=prime_rl (got a "
                          f"{type(policy).__name__} policy)")
        if errors:
            raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
        self.eos_ids, self.pad_id = list(eos_ids), pad_id
        self.client = OpenAIClient(base_url, api_key_env, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
                                   max_concurrency=max_concurrency, owner="engine=prime_rl", config="engine")
        self.client.read_key()  # a missing key fails at construction, before any model work
        self.base_url = self.client.base_url
        self.root = self.base_url.removesuffix("/v1")
        self.model, self.api_key_env, self.logprobs_mode = model, api_key_env, logprobs_mode
        self.served = model
        """The model name sampling asks for: the base model, or `lora_name` once an adapter is loaded."""
        self.max_model_len: int | None = None
        self.policy = policy
        self.lora_name, self.sync_timeout_s, self.poll_s = lora_name, sync_timeout_s, poll_s
        self.loaded: int | None = None
        """The trainer step whose broadcast the server serves (None: none loaded yet)."""
        self.last_sync: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"PrimeRLEngine(model={self.model!r}, base_url={self.base_url!r})"

    def connect(self) -> None:
        """Check that the server lists `model`, then load the trainer's newest broadcast: its startup one (step 0, or
        the step a resumed trainer restarts from: rlvr's resume then syncs that same step, which is not sent again)."""
        try:
            self.max_model_len = self._check_model_listed()
        except ServerError as err:
            raise ServerError(f"engine=prime_rl: PRIME-RL's inference server at {self.base_url} is not answering "
                              f"(start it with `uv run inference …` and set engine.base_url): {err}") from err
        folder = broadcast_dir(self.policy.output_dir)
        wait_for_marker(lambda: newest_broadcast(folder) is not None, self.sync_timeout_s, self.poll_s,
                        f"engine=prime_rl: the trainer's startup broadcast ({folder}/step_*/STABLE)")
        newest = newest_broadcast(folder)
        assert newest is not None  # waited for just above
        self.sync(replace(self.policy, version=newest))

    def sync(self, policy: PrimeRLPolicy) -> int:  # type: ignore[override]
        """Serve `policy`'s broadcast (waiting for its STABLE marker first); 0 bytes written here."""
        if policy.version == self.loaded:
            return 0
        t0 = time.perf_counter()
        folder = policy.folder
        waited = wait_for_marker(folder / "STABLE", self.sync_timeout_s, self.poll_s,
                                 f"engine=prime_rl: the trainer's step-{policy.version} broadcast")
        if policy.lora:
            self._admin("load_lora_adapter", {"lora_name": self.lora_name, "lora_path": str(folder)})
            self.served = self.lora_name
        else:
            self._admin("pause", None)
            try:
                self._admin("update_weights", {"weight_dir": str(folder)})
            finally:
                self._admin("resume", None)
        self.policy, self.loaded = policy, policy.version
        self.last_sync = {"wait_s": waited, "update_s": time.perf_counter() - t0 - waited}
        log.info("engine=prime_rl: serving the trainer's step-%d weights (%s; waited %.1f s, loaded in %.1f s)",
                 policy.version, folder, waited, self.last_sync["update_s"])
        return 0

    def _admin(self, route: str, body: dict[str, Any] | None) -> None:
        response = self.client.request("POST", f"{self.root}/{route}", body)
        if not response.is_success:
            hint = (" (a 404: the server is not PRIME-RL's inference server, `uv run inference`, or for LoRA not "
                    "started with LoRA enabled)" if response.status_code == 404 else "")
            raise PolicySyncError(f"engine=prime_rl: POST {self.root}/{route} answered HTTP {response.status_code}: "
                                  f"{excerpt(response)}{hint}")

    def close(self) -> None:
        """Nothing to release: the server and its adapter are PRIME-RL's (it keeps running)."""
