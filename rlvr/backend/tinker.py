"""`backend=tinker`: LoRA training on the Tinker service; `engine=tinker` samples from it.

Nothing of the model is loaded here: the trainer loads only the tokenizer (`remote = True`). At start,
`ServiceClient(api_key=…, base_url=…).create_lora_training_client(base_model, rank, seed)` opens one
training run; `policy` is a `TinkerPolicy` — the current `SamplingClient` plus the call policy below — which
`engine=tinker` samples from. Each step:

    forward_backward(datums, loss_fn, loss_fn_config) → optim_step(AdamParams(lr, β1, β2, eps, wd, clip))
    → save_weights_and_get_sampling_client()          (the next `engine.sync` samples from the new weights)

Sampling ahead (`trainer.off_policy_steps` = k ≥ 1, rlvr/overlap.py): the engine samples steps n+1 … n+k from
the sampler thread while `train_step` of step n runs here; both only submit SDK requests and wait on their
futures, so sampling and training are in flight on the service together. Each `policy` is the snapshot sampler of
the weights after `version` optimizer steps: the engine keeps the one it was synced with while later steps save
new ones (rlvr/engine/tinker.py). `Calls` is shared by both threads: it keeps no state per call, and a campaign's
`Throttle` counts a slot per call in flight whichever thread holds it. Stale rows need the decoupled loss (k ≥ 1
requires `off_policy_loss`, which `algorithm.loss.correction` provides), and the correction needs
`token_correction`, which this backend provides with a loss_fn of `CORRECTING_LOSSES`: `corrected` computes it (one
`forward` at the current weights gives π_train; the datums carry π_old and each advantage times the correction's
factor).

Datum of completion row r (prompt p_0…p_{L−1}, completion c_0…c_{n−1} with sampled logprobs ℓ_t and token
advantages a_t), in the service's next-token alignment — input position i predicts token i+1 of the full
sequence (tinker docs "Loss functions"; tinker-cookbook `trajectory_to_data`):

    model_input   = p_0 … p_{L−1} c_0 … c_{n−2}                  (L+n−1 tokens)
    target_tokens = p_1 … p_{L−1} c_0 … c_{n−1}                  (int64, L+n−1)
    logprobs      = 0 ×(L−1),     ℓ_0 … ℓ_{n−1}                  (float32)
    advantages    = 0 ×(L−1),     a_0/N … a_{n−1}/N              (float32)

N = the step's tokens with a non-zero advantage (over all rows); under an `algorithm.loss.aggregation` other than
token_mean, a_t·w_t instead, w_t the token's weight (`PolicyLoss.token_weights`). Prompt positions carry advantage 0
and so add nothing to the loss. The 1/N makes the service's summed loss the local backend's token-level mean
(rlvr/algorithm/loss.py; the predecessor sent raw advantages and divided the reported loss by the number of
datums, docs/predecessor.md#tinker): `grad_clip_norm` and the learning rate mean what they mean locally,
and the reported `loss` is the service's `loss:sum`. (This holds for losses linear in the advantages:
importance_sampling, ppo, cispo.) Rows whose advantages are all 0 are not sent; a completion is never
empty (a sampled row has at least one token), and a prompt must have at least one token.

Losses: `backend.loss_fn` is any of the SDK's `LossFnType` but `custom`/`cross_entropy` (RL needs
advantages). `algorithm.loss.clip_eps` > 0 needs a clipping loss (ppo, cispo): the service gets
`clip_low_threshold = 1 − ε`, `clip_high_threshold = 1 + ε_high`. What of `algorithm.loss` the service
computes, the backend declares (`loss_support`, rlvr/loss/support.py): the ppo form, every aggregation; not
`algorithm.loss.mode` kl_cov or clip_cov (they pick tokens by covariance over the whole step, which no service loss
does), gspo or cispo as rlvr computes them, `algorithm.entropy_coef` ≠ 0, or a user's own loss: rlvr/config_check.py
refuses them before anything starts, naming the key and the supported forms (and `loss_config` raises should one
get here). So is `algorithm.kl.coef` > 0 (`reference_model`: the service scores no reference model).
The service computes training log-probabilities at temperature 1, so sample at trainer.sampling.temperature=1
for an on-policy ratio of 1 (a warning says so otherwise; the predecessor sampled at T = 0.7 against these
T = 1 log-probabilities).
A non-finite loss is reported, not skipped: gradients accumulate on the service until `optim_step`, so
there is nothing clean to skip to.

LoRA: rank from `model.lora.rank`; `train_attn`/`train_mlp`/`train_unembed` from whether
`model.lora.target_modules` names attention projections, MLP projections, or `lm_head`. Tinker has no alpha
or dropout knob: `model.lora.alpha`/`dropout` do not apply. Full fine-tuning is not offered (a config error).

Every SDK call goes through `Calls`: inside the campaign's `Throttle` (a no-op for a single run), on a
daemon thread that the caller waits for at most `call_timeout_s` (the SDK can block silently for minutes
against an unreachable service, docs/environment.md#tinker-sdk), retried `retries` times after `backoff_s`, 2·…,
4·… seconds on connection errors, timeouts, HTTP 429/5xx and server-side request failures; any other error,
or the last failure, raises `TinkerCallError` naming the call. forward_backward and optim_step change state
on the service, so once sent they are retried only after a 429 (see `Calls.call_all`).

Checkpoints (`save`/`load`): `save_state(name)` — weights *and* optimizer state, which a resume needs (the
predecessor resumed with `load_state`, weights only, so Adam restarted from zero) — and
`save_weights_for_sampler(name)`; their `tinker://` paths go to `tinker_state.json` in the checkpoint folder.
`load` calls `load_state_with_optimizer(state_path)` on the run's training client and refreshes the sampler.

The API key is read from the environment variable `api_key_env` and passed to the client; it is never kept
on this object, logged, or written anywhere. A missing key is a `ConfigError` before anything loads
(an `EnvVar` requirement in `needs`, checked by rlvr/config_check.py at start).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.optimizer_rules import optimizer_errors
from rlvr.backend.throttle import Throttle
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.loss.aggregation import AGGREGATIONS
from rlvr.loss.support import LossSupport
from rlvr.protocols import Needs
from rlvr.requirements import EnvVar, Package, Setting, pip_extra
from rlvr.types import LoraSpec, Rollouts, TrainBatch

if TYPE_CHECKING:
    from tinker.types import Datum, TensorData
    from torch import Tensor
    from torch import dtype as DType

tinker = lazy_import("tinker")  # the SDK's import costs ~5 s (it imports torch)
torch = lazy_import("torch")

log = logging.getLogger("rlvr")

STATE_FILE = "tinker_state.json"
RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce")
"""The SDK's `LossFnType` but custom and cross_entropy (tests/backend/test_tinker_backend.py checks it against the
installed SDK): named here so that checking a config need not import the SDK."""
CLIPPING_LOSSES = ("ppo", "cispo")
CORRECTING_LOSSES = ("importance_sampling", "ppo", "cispo")
"""The loss_fns whose loss is per token, linear in its advantage, through its own ratio π_θ/π_old (clipped or not):
`corrected` turns a correction into π_old and a factor on each advantage, which means the correction's weights for
them only (dro, gspo and stable_reinforce are not that)."""
ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP = {"gate_proj", "up_proj", "down_proj"}


class TinkerCallError(RuntimeError):
    """A Tinker call failed for good (a non-transient error, or still failing after every retry)."""


def transient(err: BaseException) -> bool:
    """Worth retrying: the service or the path to it may recover."""
    if isinstance(err, (tinker.APIConnectionError, tinker.RateLimitError, tinker.InternalServerError, TimeoutError)):
        return True
    return isinstance(err, tinker.RequestFailedError) and str(err.category) == "server"


class Calls:
    """How every Tinker call is made: throttled, bounded in time, retried (see the module docstring)."""

    def __init__(self, timeout_s: float, retries: int, backoff_s: float, throttle: Throttle) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.throttle = throttle

    def call(self, what: str, submit: Callable[[], Any], idempotent: bool = True) -> Any:
        """`submit()` returns an SDK future (anything with `.result(timeout=)`); returns its result."""
        return self.call_all(what, [submit], idempotent)[0]

    def call_all(self, what: str, submits: Sequence[Callable[[], Any]], idempotent: bool = True) -> list[Any]:
        """Submit every request (they run concurrently on the service), then collect every result; a request
        that failed transiently is submitted again, alone with the others that failed. A request that is not
        `idempotent` (forward_backward accumulates gradients, optim_step applies them) is sent again only when
        it never left (its submit raised) or the service refused it (429): after a timeout or a lost
        connection it may have been applied, so the run stops instead, and `resume=auto` continues from the
        last checkpoint's saved state."""
        results: dict[int, Any] = {}
        last: BaseException | None = None
        pending = list(range(len(submits)))
        t0 = time.perf_counter()
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("tinker %s: %d of %d requests failed (%r); retry %d/%d in %.1f s", what, len(pending),
                            len(submits), last, attempt, self.retries, delay)
                time.sleep(delay)
            with self.throttle:
                done, errors, unsent = self._bounded([submits[i] for i in pending])
            failed = []
            for i, j in enumerate(pending):
                if i in done:
                    results[j] = done[i]
                    continue
                err = errors.get(i, TimeoutError(f"no answer within backend.call_timeout_s={self.timeout_s}"))
                if not idempotent and i not in unsent and not isinstance(err, tinker.RateLimitError):
                    raise TinkerCallError(
                        f"tinker {what} failed ({type(err).__name__}: {err}) after it was sent; not retried, since "
                        "the service may have applied it: the run stops, and resume=auto continues from the last "
                        "checkpoint"
                    ) from err
                if not transient(err):
                    raise TinkerCallError(f"tinker {what} failed: {type(err).__name__}: {err}") from err
                failed.append(j)
                last = err
            pending = failed
            if not pending:
                return [results[i] for i in range(len(submits))]
        raise TinkerCallError(
            f"tinker {what}: still failing after {self.retries + 1} tries over {time.perf_counter() - t0:.0f} s "
            f"(backend.retries={self.retries}, backend.call_timeout_s={self.timeout_s}): "
            f"{type(last).__name__}: {last}"
        ) from last

    def _bounded(self, submits: list[Callable[[], Any]]) -> tuple[dict[int, Any], dict[int, BaseException], set[int]]:
        """Run submit-then-resolve on a daemon thread and wait at most `timeout_s` for it: the SDK may block
        in the submit as well as in `.result`. A thread still blocked when the wait ends is abandoned (it
        ends with its own `.result` timeout, or with the process). Also returns the requests whose submit
        raised (never sent)."""
        done: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        unsent: set[int] = set()
        deadline = time.monotonic() + self.timeout_s

        def work() -> None:
            futures = {}
            for i, submit in enumerate(submits):
                try:
                    futures[i] = submit()
                except BaseException as err:  # noqa: BLE001 - reported to the caller, which decides
                    errors[i] = err
                    unsent.add(i)
            for i, future in futures.items():
                try:
                    done[i] = future.result(timeout=max(deadline - time.monotonic(), 0.0))
                except BaseException as err:  # noqa: BLE001
                    errors[i] = err

        thread = threading.Thread(target=work, daemon=True, name="tinker-call")
        thread.start()
        thread.join(self.timeout_s)
        return dict(done), dict(errors), set(unsent)  # copies: an abandoned thread may write into the originals


@dataclass(frozen=True)
class TinkerPolicy:
    """What `TinkerBackend.policy` hands the engine: the sampler of the latest weights, and the call policy
    (timeouts, retries, throttle) so sampling calls obey the same limits as training calls."""

    sampler: Any
    """A `tinker.SamplingClient`."""
    calls: Calls
    version: int
    """Optimizer steps taken when this sampler was made (0 = the initial weights)."""


TINKER_PACKAGE = Package("tinker", pip_extra("tinker"))
"""The Tinker SDK, which backend=tinker and engine=tinker call (engine=tinker needs backend=tinker)."""


class TinkerBackend:
    loss_support = LossSupport(forms=("ppo",), aggregations=AGGREGATIONS)
    """The service's loss_fn computes ppo's per-token ratio (clipped with a clipping loss_fn); every aggregation is
    sent as the advantages' weights (`datums_of`); no covariance mode, no entropy bonus, no user loss."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        loss_fn, base_model = settings["loss_fn"], settings["base_model"]
        clipping = frozenset({"ratio_clipping"}) if loss_fn in CLIPPING_LOSSES else frozenset()
        correcting = frozenset({"token_correction"}) if loss_fn in CORRECTING_LOSSES else frozenset()
        return Needs(
            provides=frozenset({"remote_policy"}) | clipping | correcting,
            errors=tuple(optimizer_errors(settings)),
            requires={"lora": "it trains LoRA adapters only"},
            machine=(
                TINKER_PACKAGE,
                EnvVar(settings["api_key_env"], "backend.api_key_env"),
                Setting("backend.base_model", bool(base_model), "backend.base_model is null: name the Tinker base "
                        "model (e.g. Qwen/Qwen3-4B-Instruct-2507; presets with model.name_or_path fill it in)"),
                Setting("backend.loss_fn", loss_fn in RL_LOSSES, f"backend.loss_fn={loss_fn!r}: expected one of "
                        f"{', '.join(RL_LOSSES)}"),
            ),
        )

    def __init__(
        self,
        lora: LoraSpec | None,
        lora_seed: int,
        base_model: str | None,
        api_key_env: str,
        base_url: str | None,
        loss_fn: str,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
        call_timeout_s: float,
        retries: int,
        backoff_s: float,
        max_concurrent: int,
        client: Callable[..., Any],
        throttle_dir: str | None = None,
    ) -> None:
        settings = {"loss_fn": loss_fn, "base_model": base_model, "api_key_env": api_key_env}
        problems = [f.detail for r in self.needs(settings).machine if (f := r.check()).status == "missing"]
        if lora is None:
            problems.append("model.lora=null: backend=tinker trains LoRA adapters only; choose a preset with lora")
        if problems or lora is None:  # lora None added its problem just above
            raise ConfigError("; ".join(problems))
        if call_timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ConfigError(f"backend.call_timeout_s={call_timeout_s} must be > 0, backend.retries={retries} and "
                              f"backend.backoff_s={backoff_s} >= 0")
        self.loss_fn = loss_fn
        self.betas, self.eps, self.weight_decay, self.grad_clip_norm = tuple(betas), eps, weight_decay, grad_clip_norm
        self.calls = Calls(call_timeout_s, retries, backoff_s, Throttle(throttle_dir, max_concurrent))
        self.rank = lora.rank
        self.steps = 0
        self._warned_temperature = False
        service = client(api_key=os.environ[api_key_env], base_url=base_url)
        targets = set(lora.target_modules)
        self.training = self.calls.call("create_lora_training_client", lambda: service.create_lora_training_client(
            base_model=base_model, rank=lora.rank, seed=lora_seed, train_mlp=bool(targets & MLP),
            train_attn=bool(targets & ATTENTION), train_unembed="lm_head" in targets,
        ))
        self._policy = self._new_policy()
        log.info("tinker training run on %s, LoRA rank %d, loss %s", base_model, lora.rank, loss_fn)

    @property
    def policy(self) -> TinkerPolicy:
        """The sampler of the latest weights (replaced after every optimizer step and every `load`)."""
        return self._policy

    def prepare_sampling(self) -> None:
        """Nothing to do: `policy` is always the latest weights' sampler (rlvr/protocols.py: Backend)."""

    @property
    def trainable_parameters(self) -> int:
        """Not reported by the service: 0."""
        return 0

    def _new_policy(self) -> TinkerPolicy:
        sampler = self.calls.call("save_weights_and_get_sampling_client",
                                  lambda: self.training.save_weights_and_get_sampling_client())
        return TinkerPolicy(sampler, self.calls, self.steps)

    def train_step(self, batch: TrainBatch, loss: PolicyLoss, lr: float) -> dict[str, float]:
        t0 = time.perf_counter()
        config = self.loss_config(loss)
        if batch.rollouts.temperature != 1.0 and not self._warned_temperature:
            self._warned_temperature = True
            log.warning("trainer.sampling.temperature=%g: the Tinker service computes training log-probabilities at "
                        "temperature 1, so the importance ratio is not 1 on-policy", batch.rollouts.temperature)
        train_lp_PG_T = self.train_logprobs(batch) if loss.correction.active else None
        datums, tokens = datums_of(batch, loss, train_lp_PG_T)
        fwd = self.calls.call("forward_backward", lambda: self.training.forward_backward(
            datums, loss_fn=self.loss_fn, loss_fn_config=config), idempotent=False)
        adam = tinker.types.AdamParams(learning_rate=lr, beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
                                weight_decay=self.weight_decay, grad_clip_norm=self.grad_clip_norm)
        opt = self.calls.call("optim_step", lambda: self.training.optim_step(adam), idempotent=False)
        self.steps += 1
        self._policy = self._new_policy()
        loss_value = float(fwd.metrics.get("loss:sum", float("nan")))
        return {
            "train/nonfinite_skip": 0.0,
            "loss": loss_value,
            "lr": lr,
            "rl/optimizer_nonzero_advantage_action_tokens": float(tokens),
            "tinker_train_rows": float(len(datums)),
            "tinker_train_wall_s": time.perf_counter() - t0,
            **{f"tinker/{k}": float(v) for k, v in fwd.metrics.items() if k != "loss:sum"},
            **{f"tinker/optim/{k}": float(v) for k, v in (opt.metrics or {}).items()},
        }

    def train_logprobs(self, batch: TrainBatch) -> Tensor:
        """log π_train (float [P·G, T]) of every token of the rows with a non-zero advantage at the current weights:
        one `forward` on the service (no gradient kept; cross_entropy with weight 0, as the SDK's own
        `forward_backward_custom` asks for log-probabilities); the engine's log-probabilities elsewhere."""
        ro = batch.rollouts
        train_lp_PG_T = ro.logprobs_PG_T.clone()
        where, datums = [], []
        for r in ((batch.adv_PG_T != 0) & ro.action_mask_PG_T).any(-1).nonzero().squeeze(-1).tolist():
            for a, b, prompt in ro.segments(r):
                if not prompt:
                    raise ValueError(f"row {r}: an empty prompt has no position to predict the first completion "
                                     "token from")
                tokens = list(prompt) + ro.tokens_PG_T[r, a:b].tolist()
                where.append((r, a, b, len(prompt)))
                datums.append(tinker.types.Datum(
                    model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tensor(tokens[1:], torch.int64),
                                    "weights": tensor([0.0] * (len(tokens) - 1), torch.float32)}))
        if datums:
            out = self.calls.call("forward", lambda: self.training.forward(datums, loss_fn="cross_entropy"))
            for (r, a, b, n), outputs in zip(where, out.loss_fn_outputs, strict=True):
                logprobs = outputs["logprobs"].tolist()  # input position i predicts token i + 1
                train_lp_PG_T[r, a:b] = torch.tensor(logprobs[n - 1:], dtype=train_lp_PG_T.dtype)
        return train_lp_PG_T

    def loss_config(self, loss: PolicyLoss) -> dict[str, float] | None:
        """The service loss_fn's config for `loss` (its clip thresholds); ConfigError for what the service does not
        compute (`loss_support`, and the reference KL)."""
        self.loss_support.refuse("backend=tinker", loss)
        if loss.reference_kl.active:
            raise ConfigError(f"algorithm.kl.coef={loss.reference_kl.coef} needs a reference pass and the local loss "
                              "(backend=local or fsdp): the Tinker service computes only its own loss_fn's")
        if loss.clip_eps == 0:
            return None
        if self.loss_fn not in CLIPPING_LOSSES:
            raise ConfigError(f"algorithm.loss.clip_eps={loss.clip_eps} asks for ratio clipping, which "
                              f"backend.loss_fn={self.loss_fn} does not do: set backend.loss_fn=ppo")
        return {"clip_low_threshold": 1.0 - loss.clip_eps, "clip_high_threshold": 1.0 + (loss.clip_eps_high or
                                                                                         loss.clip_eps)}

    def save(self, path: Path) -> None:
        """`tinker_state.json` in `path`: the service paths of the training state (weights + optimizer) and of
        the sampler weights, named after the checkpoint folder (`step_N`)."""
        path.mkdir(parents=True, exist_ok=True)
        found = re.search(r"step_\d+", path.name)
        name = found.group(0) if found else path.name
        state = self.calls.call("save_state", lambda: self.training.save_state(name, overwrite=True))
        sampler = self.calls.call("save_weights_for_sampler", lambda: self.training.save_weights_for_sampler(name))
        record = {"state_path": state.path, "sampler_path": sampler.path, "steps": self.steps, "rank": self.rank}
        (path / STATE_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def load(self, path: Path) -> None:
        """Continue from the training state `save` recorded: weights and Adam moments, then a fresh sampler."""
        record = json.loads((path / STATE_FILE).read_text())
        self.calls.call("load_state_with_optimizer",
                        lambda: self.training.load_state_with_optimizer(record["state_path"]))
        self.steps = int(record["steps"])
        self._policy = self._new_policy()
        log.info("tinker state %s loaded (%d optimizer steps)", record["state_path"], self.steps)


def datums_of(batch: TrainBatch, loss: PolicyLoss | None = None,
              train_lp_PG_T: Tensor | None = None) -> tuple[list[Datum], int]:
    """One Datum per completion row with a non-zero advantage (per sequence of a row a chat template split,
    `Rollouts.segments`; alignment in the module docstring), and N, the number of completion tokens with a non-zero
    advantage. With `train_lp_PG_T` (`TinkerBackend.train_logprobs`), the loss's correction as `corrected` says."""
    ro = batch.rollouts
    signal_PG_T = (batch.adv_PG_T != 0) & ro.action_mask_PG_T
    old_lp_PG_T, factor_PG_T, keep_PG_T = corrected(ro, loss, train_lp_PG_T)
    action_PG_T = signal_PG_T if keep_PG_T is None else signal_PG_T & keep_PG_T
    total = int(action_PG_T.sum())
    weight = None if loss is None else loss.token_weights(signal_PG_T, torch.arange(len(signal_PG_T)) // ro.group_size)
    adv_PG_T = batch.adv_PG_T.masked_fill(~ro.action_mask_PG_T, 0.0)
    adv_PG_T = adv_PG_T / max(total, 1) if weight is None else adv_PG_T * weight
    if factor_PG_T is not None:
        adv_PG_T = adv_PG_T * factor_PG_T
    datums = []
    for r in action_PG_T.any(-1).nonzero().squeeze(-1).tolist():
        for a, b, prompt in ro.segments(r):  # one sequence, or those a chat template split the row into
            if not action_PG_T[r, a:b].any():
                continue
            if not prompt:
                raise ValueError(f"row {r}: an empty prompt has no position to predict the first completion token from")
            completion = ro.tokens_PG_T[r, a:b].tolist()
            pad = [0.0] * (len(prompt) - 1)
            datums.append(tinker.types.Datum(
                model_input=tinker.types.ModelInput.from_ints(prompt + completion[:-1]),
                loss_fn_inputs={
                    "target_tokens": tensor(prompt[1:] + completion, torch.int64),
                    "logprobs": tensor(pad + old_lp_PG_T[r, a:b].tolist(), torch.float32),
                    "advantages": tensor(pad + adv_PG_T[r, a:b].tolist(), torch.float32),
                },
            ))
    return datums, total


def corrected(ro: Rollouts, loss: PolicyLoss | None, train_lp_PG_T: Tensor | None
              ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(π_old sent as the datums' `logprobs`, what each token's advantage is multiplied by, the tokens kept) under
    the loss's correction (rlvr/algorithm/correction.py), as the local loss computes them: π_old is the engine's
    log-probability (`bypass`) or π_train (`decoupled`); the service's ratio π_θ/π_old at the current weights is
    then ρ or 1, so a correction's weight w becomes the advantage's factor w/ρ or w, and a masked token's is 0 (it
    leaves N too). Without `train_lp_PG_T`: the engine's log-probabilities and no factor."""
    if train_lp_PG_T is None or loss is None:
        return ro.logprobs_PG_T, None, None
    sampled_PG_T = ro.action_mask_PG_T
    factor_PG_T, keep_PG_T = loss.correction.factors(train_lp_PG_T - ro.logprobs_PG_T, sampled_PG_T)
    old_lp_PG_T = ro.logprobs_PG_T if loss.correction.pi_old == "bypass" else train_lp_PG_T
    return old_lp_PG_T, factor_PG_T, keep_PG_T


def tensor(values: list, dtype: DType) -> TensorData:
    return tinker.types.TensorData.from_torch(torch.tensor(values, dtype=dtype))
