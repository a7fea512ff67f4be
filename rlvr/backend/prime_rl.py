"""`backend=prime_rl`: PRIME-RL's trainer computes the gradients; `engine=prime_rl` samples from its inference server.

rlvr takes the place of PRIME-RL's orchestrator: it samples, scores and assigns credit, then hands each step's
batch to a running PRIME-RL trainer (`uv run trainer @ …`, in its own process, usually on other GPUs) through
the folder both share, `backend.output_dir` (PRIME-RL's `output_dir`). Nothing of the model is loaded here: the
trainer loads only the tokenizer (`remote_policy`), as with backend=tinker.

Written against PRIME-RL's code at github.com/PrimeIntellect-ai/prime-rl, commit
559b44772e471d1538537b8805cc77f3824a5e64 (2026-08-21); the predecessor's bridge (`TrainingSample(prompt_ids,
completion_ids, advantage=<scalar>)` in a `TrainingBatch(examples, step)`) no longer matches it: the batch sender it
fed was replaced by the orchestrator packing micro-batches itself. The files read:

  src/prime_rl/transports/rollouts/types.py       `TrainingSample`, `MicroBatch` (msgspec structs, array_like)
  src/prime_rl/transports/rollouts/filesystem.py  `FileSystemMicroBatchSender/Receiver`: the batch files
  src/prime_rl/utils/pathing.py                   `rollouts/`, `broadcasts/`, `step_{n}`
  src/prime_rl/trainer/batch.py                   `prepare_sample`, `prepare_batch`, `pad_micro_batch`: packing
  src/prime_rl/orchestrator/train_sink.py         `_prune_zero_advantages`: zero-advantage tokens leave the rl loss
  src/prime_rl/trainer/rl/data.py, rl/train.py    the trainer's loop: wait for a batch, train, broadcast
  src/prime_rl/transports/weights/filesystem.py   `FileSystemWeightBroadcast`: the `STABLE` marker
  src/prime_rl/orchestrator/watcher.py, utils/client.py, inference/vllm/server.py   the weight update

The batch (one step). Each sequence rlvr trains on becomes one PRIME-RL `TrainingSample`: a row, or each of the
sequences `Rollouts.segments` splits a multi-turn row into (a chat template that re-rendered the conversation), as
prompt + completion tokens with, per token,

    mask (loss_mask)      False on the prompt and on observation tokens, True on the policy's sampled tokens
    logprobs              0 on the prompt, the engine's sampled-token log-probabilities after it
    temperatures          the temperature the rollouts were sampled at
    advantages            0 on the prompt, rlvr's token advantage (its credit, `TrainBatch.adv_PG_T`) after it
    rl_weights            present when an action token has advantage 0: weight 0 there, 1 on the other actions
                          (what PRIME-RL's orchestrator does, `_prune_zero_advantages`: rlvr leaves such tokens out
                          of the loss and its token count too); sequences with no non-zero advantage are not sent

The advantages are sent raw: PRIME-RL's loss normalises by its own token counts. The samples are packed as the
orchestrator's `prepare_batch` packs them (first fit by decreasing length into micro-batches of at most
`backend.seq_len` tokens, position ids restarting at 0 in each sample, `sequence_lengths`/`seq_lens` one per
sample, padded to `backend.pad_to_multiple_of`; the micro-batch count made a multiple of `backend.data_world_size`
with zero-loss copies, then dealt to the ranks so each gets as many), and written as PRIME-RL's filesystem transport
writes them: `{output_dir}/rollouts/step_{n}/rank_{r}.bin`, the msgpack of `list[MicroBatch]` (each struct an
array of all its 16 fields in order, nil for the ones rlvr does not fill, floats as float64: byte for byte what
msgspec encodes for PRIME-RL's `array_like` struct, checked against msgspec 0.23; PRIME-RL pins 0.21.1), written
to `rank_{r}.bin.tmp` and renamed (the trainer waits for the name). Steps count from 1, as PRIME-RL's do; a step
with nothing to train (every advantage 0) is not sent and does not advance the count.

The handshake. After step n the trainer writes `{output_dir}/broadcasts/step_{n}/` (safetensors, or the adapter
under LoRA) and then touches `STABLE` in it; at start it broadcasts its initial weights as step 0. `train_step`
waits for step n's marker (at most `backend.step_timeout_s`, polling every `backend.poll_s`; past it, an error
naming the marker and what to check), so an rlvr step includes the trainer's. `engine=prime_rl` then makes the
inference server load that folder (rlvr/engine/prime_rl.py). The step's `loss` is the trainer's `loss/mean` for step
n from its file monitor, `{output_dir}/metrics.jsonl` (the trainer's `monitors.file`, on by default), waited for at most
`backend.metrics_wait_s` after the marker (the trainer logs it just after broadcasting); NaN when it does not come
(file monitor off).

Sampling ahead. PRIME-RL bounds staleness in its orchestrator: `[orchestrator] max_off_policy_steps` (default 8,
>= 0; packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py), the version a batch trains on minus the
version that sampled it, past which rollouts are dropped. rlvr is the orchestrator here, so
`trainer.off_policy_steps` = k is that bound (exactly k in `fixed` mode, at most k in `bounded`, nothing dropped)
and k = 0 is `max_off_policy_steps = 0`; the PRIME-RL trainer reads no such key, so nothing is written for it.
Sampling ahead needs nothing more of this backend (`train_step` runs in the main thread while the engine samples):
each token's `logprobs` are the engine's, of the version that sampled it, and PRIME-RL's loss weighs each token by
its ratio to them (its trainer's `[loss]`, masking tokens whose ratio leaves its bounds) — the correction its
orchestrator's rollouts get at the same staleness. So this backend provides `off_policy_loss` itself, in place of
rlvr's decoupled correction (`correction=…`, which it refuses: the loss is the trainer's).

The trainer must use `weight_broadcast.type = "filesystem"` and `rollout_transport.type =
"filesystem"` (its default is zmq), and its inference server `weight_broadcast.type = "filesystem"` (ZMQ and NCCL
are not built here: `backend.transport` must be `filesystem`).

What cannot be expressed, and is refused at start (rlvr/config_check.py): the loss is PRIME-RL's, configured in its
trainer's `[loss]`, not rlvr's `algorithm.loss`, so this backend provides neither `ratio_clipping` (keep
algorithm.loss.clip_eps=0, the default: PRIME-RL masks by its own importance-ratio bounds), `token_correction`
(corrections), `local_loss` (echo=on) nor `reference_model` (algorithm.kl.coef=0), and its `loss_support`
(rlvr/loss/support.py) declares the ppo form and aggregation=token_mean alone (PRIME-RL normalises each loss component
by its token count): no kl_cov/clip_cov, gspo/cispo, entropy bonus or user loss. The learning rate and optimizer are
the trainer's too: `lr` is not sent (the row's `lr` is rlvr's schedule's value, which the trainer does not read).
LoRA: when the run's model preset has `model.lora`, the trainer must have `model.lora` with the same rank and targets
(its broadcast is then the adapter, which the engine loads by name); rlvr cannot set PRIME-RL's model.

Checkpoints: `save` writes `prime_rl_state.json` (the step count and output_dir); the weights and optimizer are
the PRIME-RL trainer's checkpoints (`ckpt.interval`), so a resumed rlvr run needs the trainer resumed at the same
step (`--resume.step N`), whose startup broadcast of step N the engine loads; `load` warns when
`broadcasts/step_N/STABLE` is not there yet.

Not run here: the `prime-rl` package is not on the package index and needs CUDA; the tests
(tests/backend/test_prime_rl_backend.py) decode the files with PRIME-RL's own struct definitions (msgspec) and play
its trainer and inference server on loopback.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.algorithm.loss import PolicyLoss
from rlvr.errors import ConfigError
from rlvr.loss.support import LossSupport
from rlvr.protocols import Finding, Needs
from rlvr.requirements import Setting
from rlvr.types import LoraSpec, TrainBatch

log = logging.getLogger("rlvr")

STATE_FILE = "prime_rl_state.json"
TRANSPORTS = ("filesystem",)
MICRO_BATCH_FIELDS = ("input_ids", "loss_mask", "advantages", "inference_logprobs", "position_ids",
                      "sequence_lengths", "temperatures", "env_names", "seq_lens", "ref_logprobs", "routed_experts",
                      "mm_kwargs", "mm_token_type_ids", "rl_weights", "ce_weights", "ref_kl_weights")
"""PRIME-RL's `MicroBatch` fields in declaration order (its msgpack array's order); the ones rlvr never fills
(`ref_logprobs` on, but `rl_weights`) are None."""
PAD_TOKEN = 1
"""The token id `pad_micro_batch` pads with (loss-masked)."""


def rollout_dir(output_dir: Path) -> Path:
    return output_dir / "rollouts"


def broadcast_dir(output_dir: Path) -> Path:
    return output_dir / "broadcasts"


def step_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step}"


@dataclass(frozen=True)
class PrimeRLPolicy:
    """What `PrimeRLBackend.policy` hands the engine: which broadcast of the trainer's weights to serve."""

    output_dir: Path
    version: int
    """Steps the trainer has been sent (0: its initial weights, `broadcasts/step_0`)."""
    lora: bool
    """The broadcasts are LoRA adapters (loaded by name), not full weights."""

    @property
    def folder(self) -> Path:
        return step_path(broadcast_dir(self.output_dir), self.version)


@dataclass
class Sample:
    """One PRIME-RL `TrainingSample` as this backend fills it (the fields it leaves unset are None there)."""

    token_ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    temperatures: list[float]
    advantages: list[float]
    rl_weights: list[float] | None = None


def samples_of(batch: TrainBatch) -> list[Sample]:
    """One sample per sequence with a non-zero advantage on an action token (see the module docstring)."""
    ro = batch.rollouts
    actions_PG_T = ro.action_mask_PG_T
    adv_PG_T = batch.adv_PG_T.masked_fill(~actions_PG_T, 0.0)
    samples = []
    for r in range(len(ro.tokens_PG_T)):
        for a, b, prompt in ro.segments(r):
            action = actions_PG_T[r, a:b].tolist()
            advantages = adv_PG_T[r, a:b].tolist()
            if not any(m and v != 0.0 for m, v in zip(action, advantages)):
                continue
            if not prompt:
                raise ValueError(f"row {r}: an empty prompt has no position to predict the first completion token from")
            n = len(prompt)
            sample = Sample(
                token_ids=list(prompt) + ro.tokens_PG_T[r, a:b].tolist(),
                mask=[False] * n + action,
                logprobs=[0.0] * n + ro.logprobs_PG_T[r, a:b].tolist(),
                temperatures=[float(ro.temperature)] * (n + b - a),
                advantages=[0.0] * n + advantages,
            )
            if any(m and v == 0.0 for m, v in zip(action, advantages)):
                sample.rl_weights = [0.0] * n + [1.0 if m and v != 0.0 else 0.0 for m, v in zip(action, advantages)]
            samples.append(sample)
    return samples


@dataclass
class MicroBatch:
    """PRIME-RL's `MicroBatch`: samples packed end to end into one sequence."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    inference_logprobs: list[float] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    sequence_lengths: list[int] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)
    env_names: list[str] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    rl_weights: list[float] | None = None

    def add(self, s: Sample, env_name: str) -> None:
        n, before = len(s.token_ids), len(self.input_ids)
        if s.rl_weights is not None and self.rl_weights is None:
            self.rl_weights = [1.0] * before  # PRIME-RL's fill for samples without the stream (STREAM_FILL)
        self.input_ids += s.token_ids
        self.loss_mask += s.mask
        self.advantages += s.advantages
        self.inference_logprobs += s.logprobs
        self.position_ids += list(range(n))
        self.sequence_lengths.append(n)
        self.temperatures += s.temperatures
        self.env_names += [env_name] * n
        self.seq_lens.append(n)
        if self.rl_weights is not None:
            self.rl_weights += s.rl_weights if s.rl_weights is not None else [1.0] * n

    def pad(self, multiple: int) -> None:
        """`pad_micro_batch`: loss-masked tokens up to a multiple of `multiple`, counted in the last sample."""
        k = -len(self.input_ids) % multiple
        if not k:
            return
        self.input_ids += [PAD_TOKEN] * k
        self.advantages += [0.0] * k
        self.loss_mask += [False] * k
        self.position_ids += list(range(k))
        self.sequence_lengths[-1] += k
        self.seq_lens[-1] += k
        self.inference_logprobs += [0.0] * k
        self.temperatures += [1.0] * k
        if self.rl_weights is not None:
            self.rl_weights += [0.0] * k
        self.env_names += [""] * k

    def dummy(self) -> MicroBatch:
        """`_make_dummy_batch`: the same tokens, nothing trained (fills a rank's share)."""
        n = len(self.input_ids)
        return MicroBatch(list(self.input_ids), [False] * n, [0.0] * n, list(self.inference_logprobs),
                          list(self.position_ids), list(self.sequence_lengths), list(self.temperatures),
                          list(self.env_names), list(self.seq_lens))

    def fields(self) -> list[Any]:
        """Its msgpack array: every field in PRIME-RL's order, nil for those rlvr does not fill."""
        return [getattr(self, name, None) for name in MICRO_BATCH_FIELDS]


def pack(samples: Sequence[Sample], seq_len: int, ranks: int, pad_to_multiple_of: int,
         env_name: str) -> list[list[MicroBatch]]:
    """`prepare_batch` for text samples: one list of micro-batches per data rank, each list as long."""
    too_long = [len(s.token_ids) for s in samples if len(s.token_ids) > seq_len]
    if too_long:
        raise ValueError(f"a sequence of {max(too_long)} tokens (prompt + completion) is longer than "
                         f"backend.seq_len={seq_len}, PRIME-RL's micro-batch length; raise it (and the trainer's "
                         "model.seq_len) or shorten trainer.sampling.max_tokens")
    bins: list[MicroBatch] = []
    for s in sorted(samples, key=lambda s: -len(s.token_ids)):
        home = next((b for b in bins if len(b.input_ids) + len(s.token_ids) <= seq_len), None)
        if home is None:
            home = MicroBatch()
            bins.append(home)
        home.add(s, env_name)
    for b in bins:
        b.pad(pad_to_multiple_of)
    if bins:
        bins += [bins[0].dummy() for _ in range(-len(bins) % ranks)]
    grid: list[list[MicroBatch]] = [[] for _ in range(ranks)]
    for i, b in enumerate(sorted(bins, key=lambda b: -len(b.input_ids))):
        turn, k = divmod(i, ranks)
        grid[k if turn % 2 == 0 else ranks - 1 - k].append(b)  # snake order: equal counts, loads near even
    return grid


def msgpack(value: Any) -> bytes:
    """The msgpack encoding of None, bool, int, float (as float64), str and lists of them."""
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def _encode(v: Any, out: bytearray) -> None:
    if v is None:
        out.append(0xC0)
    elif v is True or v is False:
        out.append(0xC3 if v else 0xC2)
    elif isinstance(v, int):
        if 0 <= v < 0x80:
            out.append(v)
        elif -32 <= v < 0:
            out.append(v & 0xFF)
        elif 0 <= v < 2**64:
            for code, fmt, top in ((0xCC, ">B", 2**8), (0xCD, ">H", 2**16), (0xCE, ">I", 2**32), (0xCF, ">Q", 2**64)):
                if v < top:
                    out += bytes([code]) + struct.pack(fmt, v)
                    break
        elif -(2**63) <= v < 0:
            for code, fmt, low in ((0xD0, ">b", -(2**7)), (0xD1, ">h", -(2**15)), (0xD2, ">i", -(2**31)),
                                   (0xD3, ">q", -(2**63))):
                if v >= low:
                    out += bytes([code]) + struct.pack(fmt, v)
                    break
        else:
            raise ValueError(f"msgpack: integer {v} out of range")
    elif isinstance(v, float):
        out += b"\xcb" + struct.pack(">d", v)
    elif isinstance(v, str):
        data = v.encode()
        n = len(data)
        out += (bytes([0xA0 | n]) if n < 32 else b"\xd9" + struct.pack(">B", n) if n < 2**8 else
                b"\xda" + struct.pack(">H", n) if n < 2**16 else b"\xdb" + struct.pack(">I", n)) + data
    elif isinstance(v, list):
        n = len(v)
        out += bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n) if n < 2**16 else \
            b"\xdd" + struct.pack(">I", n)
        for item in v:
            _encode(item, out)
    else:
        raise TypeError(f"msgpack: cannot encode {type(v).__name__}")


def write_step(output_dir: Path, step: int, grid: list[list[MicroBatch]]) -> int:
    """The step's files as FileSystemMicroBatchSender writes them; the bytes written."""
    folder = step_path(rollout_dir(output_dir), step)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for rank, micro_batches in enumerate(grid):
        data = msgpack([mb.fields() for mb in micro_batches])
        tmp = folder / f"rank_{rank}.bin.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, folder / f"rank_{rank}.bin")
        written += len(data)
    return written


class TrainerTimeout(RuntimeError):
    """The PRIME-RL trainer did not mark a step's weights ready in time."""


def wait_for_marker(marker: Path | Callable[[], bool], timeout_s: float, poll_s: float, what: str) -> float:
    """Wait until `marker` exists (or returns True); the seconds waited. TrainerTimeout naming `what` past
    `timeout_s`."""
    t0 = time.perf_counter()
    while not (marker.exists() if isinstance(marker, Path) else marker()):
        if time.perf_counter() - t0 > timeout_s:
            raise TrainerTimeout(
                f"{what}{f': {marker}' if isinstance(marker, Path) else ''} did not appear within {timeout_s:g} s. "
                "Is the PRIME-RL trainer running with this output_dir, weight_broadcast.type = \"filesystem\" and "
                "rollout_transport.type = \"filesystem\" (its log says why it stopped)?"
            )
        time.sleep(poll_s)
    return time.perf_counter() - t0


def newest_broadcast(folder: Path) -> int | None:
    """The newest step under `folder` (a `broadcasts/`) whose weights are marked STABLE; None if none is."""
    steps = [int(p.parent.name[5:]) for p in folder.glob("step_*/STABLE") if p.parent.name[5:].isdigit()]
    return max(steps, default=None)


def trainer_loss(metrics_file: Path, step: int) -> float | None:
    """The trainer's `loss/mean` of `step` from its file monitor's JSONL, or None if not (yet) there."""
    if not metrics_file.exists():
        return None
    found = None
    for line in metrics_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if isinstance(row, dict) and row.get("step") == step and "loss/mean" in row:
            found = float(row["loss/mean"])
    return found


@dataclass(frozen=True)
class TrainerBroadcasts:
    """`rlvr doctor`: the PRIME-RL trainer has broadcast weights into `output_dir` (it does at start: step 0)."""

    output_dir: str
    item: str = "prime-rl trainer"
    at_start: bool = False

    def check(self) -> Finding:
        newest = newest_broadcast(broadcast_dir(Path(self.output_dir)))
        if newest is None:
            return Finding("missing", f"no broadcasts/step_*/STABLE under {self.output_dir}: start the PRIME-RL "
                                      "trainer with this output_dir and rollout_transport.type = \"filesystem\" (it "
                                      "broadcasts step 0 at start)")
        return Finding("ok", f"{self.output_dir}: the trainer has broadcast step {newest}")


class PrimeRLBackend:
    loss_support = LossSupport(forms=("ppo",), aggregations=("token_mean",))
    """PRIME-RL's trainer computes its own loss: rlvr's ppo form alone, normalised by its token counts."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        transport = settings["transport"]
        return Needs(
            provides=frozenset({"remote_policy", "off_policy_loss"}),  # its loss: each token's ratio to the engine's
            machine=(
                Setting("backend.output_dir", bool(settings["output_dir"]), "backend.output_dir is null: name the "
                        "PRIME-RL trainer's output_dir (the folder it reads rollouts/ from and writes broadcasts/ to)"),
                Setting("backend.transport", transport in TRANSPORTS, f"backend.transport={transport!r}: only "
                        "filesystem is built (the trainer's rollout_transport.type = \"filesystem\"); PRIME-RL's zmq "
                        "transport is not"),
                *((TrainerBroadcasts(settings["output_dir"]),) if settings["output_dir"] else ()),
            ),
        )

    def __init__(
        self,
        lora: LoraSpec | None,
        lora_seed: int,
        output_dir: str | None,
        transport: str,
        data_world_size: int,
        seq_len: int,
        pad_to_multiple_of: int,
        env_name: str,
        step_timeout_s: float,
        poll_s: float,
        metrics_wait_s: float,
    ) -> None:
        settings = {"output_dir": output_dir, "transport": transport}
        at_start = [r for r in self.needs(settings).machine if r.at_start]  # not the doctor's trainer check
        problems = [f.detail for r in at_start if (f := r.check()).status == "missing"]
        rules = [("data_world_size", data_world_size, data_world_size >= 1, ">= 1 (the trainer's data ranks)"),
                 ("seq_len", seq_len, seq_len >= 1, ">= 1"),
                 ("pad_to_multiple_of", pad_to_multiple_of, pad_to_multiple_of >= 1, ">= 1"),
                 ("env_name", env_name, bool(env_name) and env_name != "all", "a name other than 'all' (PRIME-RL "
                  "reserves it)"),
                 ("step_timeout_s", step_timeout_s, step_timeout_s > 0, "> 0"),
                 ("poll_s", poll_s, poll_s > 0, "> 0"),
                 ("metrics_wait_s", metrics_wait_s, metrics_wait_s >= 0, ">= 0")]
        problems += [f"backend.{key}={value!r} must be {rule}" for key, value, ok, rule in rules if not ok]
        if problems:
            raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
        assert output_dir is not None  # checked just above
        self.output_dir = Path(output_dir)
        self.ranks, self.seq_len, self.pad_to_multiple_of = data_world_size, seq_len, pad_to_multiple_of
        self.env_name = env_name
        self.step_timeout_s, self.poll_s, self.metrics_wait_s = step_timeout_s, poll_s, metrics_wait_s
        self.lora = lora is not None
        self.steps = 0
        self._warned_loss = False
        log.info("backend=prime_rl: batches to %s (%d data rank(s)), %s weights from its broadcasts",
                 rollout_dir(self.output_dir), self.ranks, "LoRA" if self.lora else "full")

    @property
    def policy(self) -> PrimeRLPolicy:
        """The trainer's broadcast of the latest step sent (ready: `train_step` waited for it)."""
        return PrimeRLPolicy(self.output_dir, self.steps, self.lora)

    @property
    def trainable_parameters(self) -> int:
        """Not reported by the PRIME-RL trainer: 0."""
        return 0

    def prepare_sampling(self) -> None:
        """Nothing to do: the engine loads the trainer's broadcast (rlvr/protocols.py: Backend)."""

    def train_step(self, batch: TrainBatch, loss: PolicyLoss, lr: float) -> dict[str, float]:
        t0 = time.perf_counter()
        check_loss(loss)
        if batch.echo_PG_T is not None:
            raise ConfigError("echo=on adds a loss on observation tokens, which PRIME-RL's trainer does not compute")
        samples = samples_of(batch)
        grid = pack(samples, self.seq_len, self.ranks, self.pad_to_multiple_of, self.env_name)
        written, waited, trainer_loss_value = 0, 0.0, float("nan")
        if samples:
            step = self.steps + 1
            written = write_step(self.output_dir, step, grid)
            waited = wait_for_marker(step_path(broadcast_dir(self.output_dir), step) / "STABLE", self.step_timeout_s,
                                     self.poll_s, f"backend=prime_rl step {step}")
            self.steps = step
            trainer_loss_value = self._trainer_loss(step)
        else:
            log.warning("backend=prime_rl: no token has a non-zero advantage; nothing sent to the trainer this step")
        actions = (batch.adv_PG_T != 0) & batch.rollouts.action_mask_PG_T
        return {
            "train/nonfinite_skip": 0.0,
            "loss": trainer_loss_value,
            "lr": lr,
            "rl/optimizer_nonzero_advantage_action_tokens": float(int(actions.sum())),
            "prime_rl/step": float(self.steps),
            "prime_rl/samples": float(len(samples)),
            "prime_rl/loss_mask_tokens": float(sum(sum(s.mask) for s in samples)),
            "prime_rl/micro_batches_per_rank": float(len(grid[0])),
            "prime_rl/bytes_written": float(written),
            "prime_rl/trainer_wait_s": waited,
            "prime_rl/step_wall_s": time.perf_counter() - t0,
        }

    def _trainer_loss(self, step: int) -> float:
        deadline = time.perf_counter() + self.metrics_wait_s
        metrics_file = self.output_dir / "metrics.jsonl"
        while (value := trainer_loss(metrics_file, step)) is None and time.perf_counter() < deadline:
            time.sleep(self.poll_s)
        if value is None:
            if not self._warned_loss:
                self._warned_loss = True
                log.warning("backend=prime_rl: no loss/mean for step %d in %s within backend.metrics_wait_s=%g s "
                            "(the trainer's monitors.file is off?): the step's loss is NaN", step, metrics_file,
                            self.metrics_wait_s)
            return float("nan")
        return value

    def save(self, path: Path) -> None:
        """`prime_rl_state.json`: the steps sent and the folder they went to (the weights are the trainer's)."""
        path.mkdir(parents=True, exist_ok=True)
        record = {"steps": self.steps, "output_dir": str(self.output_dir), "lora": self.lora}
        (path / STATE_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def load(self, path: Path) -> None:
        """Continue counting from the saved step; the PRIME-RL trainer must be resumed at it (`--resume.step`)."""
        record = json.loads((path / STATE_FILE).read_text())
        self.steps = int(record["steps"])
        marker = self.policy.folder / "STABLE"
        if not marker.exists():
            log.warning("backend=prime_rl: resumed at step %d, but %s is not there yet: resume the PRIME-RL trainer "
                        "from its step-%d checkpoint (--resume.step %d)", self.steps, marker, self.steps, self.steps)


def check_loss(loss: PolicyLoss) -> None:
    """What rlvr's loss settings ask that PRIME-RL's trainer would not do (config_check refuses them earlier, by
    capability and by `PrimeRLBackend.loss_support`; this guards a backend built by hand)."""
    PrimeRLBackend.loss_support.refuse("backend=prime_rl", loss)
    if loss.reference_kl.active or loss.clip_eps:
        raise ConfigError(
            f"algorithm.loss.clip_eps={loss.clip_eps}, algorithm.kl.coef={loss.reference_kl.coef}: PRIME-RL's trainer "
            "clips and regularises with its own [loss] settings: backend=prime_rl needs algorithm.loss.clip_eps=0 "
            "and algorithm.kl.coef=0"
        )
