"""algorithm.loss.mode=kl_cov and clip_cov (rlvr/algorithm/loss.py, spec §4.3–4.5): which tokens the covariance
selects, the per-token losses, micro-batch invariance (the selection is made over the whole step), clip_cov's
seeded draws, and 4-step runs on the tiny model with a checkpoint round trip."""

import functools
import json
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from composing import FAST, MIXED, compose_config
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend, selection_generator
from rlvr.config_check import config_problems
from rlvr.engine.pytorch import PyTorchEngine
from rlvr.model.tiny import TinyLlama
from rlvr.outputs import NONDETERMINISTIC_KEYS
from rlvr.run import run
from rlvr.seeds import prompt_seeds
from rlvr.types import LoraSpec, Rollouts, SamplingParams, TrainBatch


def loss(mode: str, **knobs) -> PolicyLoss:
    return PolicyLoss(**({"clip_eps": 0.0, "clip_eps_high": 0.0, "adv_clip_max": 0.0, "mode": mode} | knobs))


# The hand-made step: 2 rows, 5 valid tokens (row 1's last position is padding).
#   A   = [[+1, +1, +1], [−1, −1, ·]]  → mean A = (3 − 2)/5 = 0.2 → A − mean = [[0.8, 0.8, 0.8], [−1.2, −1.2]]
#   new = [[−1, −2, −3], [−1, −3, ·]]  → mean new = −10/5 = −2    → new − mean = [[1, 0, −1], [1, −1]]
#   cov = (A − mean A)·(new − mean new) = [[0.8, 0, −0.8], [−1.2, 1.2]]
NEW = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -3.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
LOG2, LOG3 = math.log(2.0), math.log(3.0)


@pytest.mark.parametrize(("percent", "expected"), [
    (20.0, [[0, 0, 0], [0, 1, 0]]),   # k = max(1, int(5·20/100)) = 1 → cov 1.2 at (1, 1)
    (40.0, [[1, 0, 0], [0, 1, 0]]),   # k = int(5·40/100) = 2 → 1.2 at (1, 1), then 0.8 at (0, 0)
    (0.2, [[0, 0, 0], [0, 1, 0]]),    # the default: int(5·0.2/100) = int(0.01) = 0 → max(1, 0) = 1
    (0.0, [[0, 0, 0], [0, 1, 0]]),    # 0 % still selects one token (the spec's max(1, …))
    (100.0, [[1, 1, 1], [1, 1, 0]]),  # every valid token, never the padding
])
def test_kl_cov_selects_the_largest_covariances_over_the_step(percent, expected):
    selected = loss("kl_cov", kl_cov_percent=percent).select_tokens(NEW, NEW, ADV, MASK)
    assert selected.int().tolist() == expected


def test_kl_cov_adds_the_abs_log_ratio_on_selected_tokens_only():
    # old = new except δ = log 2 at (1, 1) (selected, A = −1) and at (0, 1) (not selected, A = +1):
    #   (1, 1): −r·A + coef·|δ| = −2·(−1) + 0.5·log 2 = 2 + 0.3466 = 2.3466
    #   (0, 1): −r·A = −2·1 = −2 (no penalty)     others: r = 1 → ℓ = −A
    # gradient w.r.t. new at (1, 1): d(−r·A)/dnew = −r·A = 2, plus coef·sign(δ) = 0.5 → 2.5; at (0, 1): −r·A = −2
    kl = loss("kl_cov", kl_cov_percent=20.0, kl_cov_coef=0.5)
    old = NEW.clone()
    old[1, 1] -= LOG2
    old[0, 1] -= LOG2
    selected = kl.select_tokens(NEW, old, ADV, MASK)
    new = NEW.clone().requires_grad_(True)
    tok, clipped = kl.token_losses(new, old, ADV, selected)
    expected = torch.tensor([[-1.0, -2.0, -1.0], [1.0, 2.0 + 0.5 * LOG2, 0.0]])
    assert torch.allclose(tok[MASK], expected[MASK], atol=1e-6) and not clipped.any()
    (tok * MASK).sum().backward()
    assert new.grad[1, 1].item() == pytest.approx(2.5, abs=1e-5) and new.grad[0, 1].item() == pytest.approx(-2.0)


def test_kl_cov_with_a_zero_ratio_change_is_the_standard_loss():
    # on-policy (old = new): |δ| = 0, so the selected token's loss is −A like every other token's
    tok, _ = loss("kl_cov", kl_cov_percent=100.0).token_losses(NEW, NEW, ADV, MASK)
    assert torch.equal(tok, loss("standard").token_losses(NEW, NEW, ADV)[0])


# clip_cov with clip_eps = 0: ε_lo = 1.0, ε_hi = ε_lo = 1.0 → clip(r, 0, 2). old puts r = 3 at (0, 0) (A = +1):
#   −r·A = −3 < −clip(r)·A = −2, so its clipped branch is active and it is never a candidate, whatever its cov.
OLD_R3 = NEW - torch.tensor([[LOG3, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(("band", "ratio", "expected"), [
    ((1.0, 5.0), 0.0002, [[0, 0, 0], [0, 1, 0]]),  # defaults: only cov 1.2 lies in (1, 5); max(int(0.001), 1) = 1
    ((0.5, 5.0), 1.0, [[0, 0, 0], [0, 1, 0]]),     # (0, 0)'s 0.8 is in the band but its clipped branch is active
    ((-1.0, 5.0), 1.0, [[0, 1, 1], [0, 1, 0]]),    # candidates 0, −0.8, 1.2 (not −1.2): n = min(int(1·5), 3) = 3
    ((0.5, 1.0), 1.0, [[0, 0, 0], [0, 0, 0]]),     # 1.2 is not < 1.0 and (0, 0) is excluded: no candidate
])
def test_clip_cov_candidates_lie_in_the_band_outside_the_clipped_branch(band, ratio, expected):
    clip = loss("clip_cov", clip_cov_min=band[0], clip_cov_max=band[1], clip_cov_ratio=ratio)
    selected = clip.select_tokens(NEW, OLD_R3, ADV, MASK, selection_generator(0, 0))
    assert selected.int().tolist() == expected


def test_clip_cov_zeroes_the_selected_tokens_and_reports_them_as_clipped():
    # ℓ = max(−r·A, −clip(r, 0, 2)·A): (0, 0): r = 3, A = +1 → max(−3, −2) = −2; (0, 1), (0, 2): −1;
    # (1, 0): r = 1, A = −1 → 1; (1, 1) selected → 0 with no gradient. clip_fraction counts the selected: 1 of 5.
    clip = loss("clip_cov")
    selected = clip.select_tokens(NEW, OLD_R3, ADV, MASK, selection_generator(0, 0))
    new = NEW.clone().requires_grad_(True)
    tok, clipped = clip.token_losses(new, OLD_R3, ADV, selected)
    assert tok[MASK].tolist() == pytest.approx([-2.0, -1.0, -1.0, 1.0, 0.0])
    assert torch.equal(clipped, selected) and int(clipped[MASK].sum()) == 1
    (tok * MASK).sum().backward()
    assert new.grad[1, 1].item() == 0.0 and new.grad[0, 0].item() == 0.0  # clipped branch: no gradient either
    assert new.grad[0, 1].item() == pytest.approx(-1.0)


def test_clip_cov_with_clip_eps_uses_it_for_both_bounds():
    # clip_eps = 0.2, clip_eps_high = 0 → clip(r, 0.8, 1.2): at (0, 0) r = 3, A = +1 → max(−3, −1.2) = −1.2
    tok, _ = loss("clip_cov", clip_eps=0.2).token_losses(NEW, OLD_R3, ADV, torch.zeros_like(MASK))
    assert tok[0, 0].item() == pytest.approx(-1.2)
    assert loss("clip_cov", clip_eps=0.2, clip_eps_high=0.28).clip_cov_bounds() == (0.2, 0.28)
    assert loss("clip_cov").clip_cov_bounds() == (1.0, 1.0)


@pytest.mark.parametrize("mode", ["kl_cov", "clip_cov", "standard"])
def test_degenerate_steps(mode):
    # no valid token: nothing. All-equal advantages: cov ≡ 0, outside clip_cov's default band (1, 5); kl_cov still
    # takes its top 1
    empty = torch.zeros_like(MASK)
    assert not loss(mode).select_tokens(NEW, NEW, ADV, empty, selection_generator(0, 0)).any()
    flat = loss(mode).select_tokens(NEW, NEW, torch.ones_like(ADV), MASK, selection_generator(0, 0))
    assert int(flat.sum()) == (1 if mode == "kl_cov" else 0)  # kl_cov's top 1 of an all-zero cov


def test_clip_cov_draws_repeat_for_a_seed_and_step_and_differ_across_steps():
    # 400 valid tokens, every one a candidate (band (−∞-ish, ∞-ish), r = 1): n = int(0.05·400) = 20 drawn
    g = torch.Generator().manual_seed(7)
    new, adv = -torch.rand(20, 20, generator=g) * 3, torch.randn(20, 20, generator=g)
    mask = torch.ones(20, 20, dtype=torch.bool)
    clip = loss("clip_cov", clip_cov_ratio=0.05, clip_cov_min=-1e9, clip_cov_max=1e9)

    def pick(seed, step):
        return clip.select_tokens(new, new, adv, mask, selection_generator(seed, step))

    assert int(pick(0, 3).sum()) == 20
    assert torch.equal(pick(0, 3), pick(0, 3))
    assert not torch.equal(pick(0, 3), pick(0, 4)) and not torch.equal(pick(0, 3), pick(1, 3))


@pytest.mark.parametrize(("knob", "value"), [
    ("mode", "kl"), ("kl_cov_percent", 100.5), ("kl_cov_percent", -1.0), ("kl_cov_coef", -0.1),
    ("clip_cov_ratio", 1.5), ("clip_cov_min", 5.0),
])
def test_bad_knobs_fail_naming_the_key(knob, value):
    with pytest.raises(ValueError, match=f"algorithm.loss.{knob}="):
        PolicyLoss(**{"clip_eps": 0.0, "clip_eps_high": 0.0, "adv_clip_max": 0.0, knob: value})


def test_the_covariance_modes_need_their_whole_step_mask():
    with pytest.raises(ValueError, match="algorithm.loss.mode=kl_cov: the loss needs the whole step's selected"):
        loss("kl_cov").token_losses(NEW, NEW, ADV)


def test_the_covariance_modes_are_refused_by_the_backends_that_do_not_compute_them():
    settings_ = {"clip_eps": 0.0, "clip_eps_high": 0.0, "adv_clip_max": 0.0}
    for mode in ("standard", "kl_cov", "clip_cov"):
        assert PolicyLoss.needs(settings_ | {"mode": mode}).requires == {}
    assert getattr(LocalBackend, "loss_support", None) is None  # it calls the loss itself: every form


@pytest.mark.parametrize("mode", ["kl_cov", "clip_cov"])
def test_tinker_refuses_the_covariance_modes_before_anything_starts(mode):
    _, errors = config_problems(compose_config([f"algorithm.loss.mode={mode}", "backend=tinker"]), at_start=False)
    assert any(f"algorithm.loss.mode={mode}: backend <rlvr.backend.tinker.TinkerBackend> computes the form(s) ppo "
               "only" in e for e in errors), errors
    _, local = config_problems(compose_config([f"algorithm.loss.mode={mode}"]), at_start=False)
    assert not any("algorithm.loss.mode" in e for e in local)


# ---- the local backend on the tiny model ----

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
# knobs that make both modes select several tokens of a 12-row step of the tiny model (the defaults pick 1 or 0)
KNOBS = {"kl_cov": {"kl_cov_percent": 10.0}, "clip_cov": {"clip_eps": 0.2, "clip_cov_ratio": 0.1, "clip_cov_min": 0.0}}


def backend(micro_batch_size=0):
    model, tok = TINY.load(0)
    return LocalBackend(model, LORA, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, micro_batch_size, False)


@functools.cache
def sampled() -> Rollouts:
    model, tok = TINY.load(0)
    engine = PyTorchEngine(model, [tok.eos_token_id], tok.pad_token_id, 256, merge_lora=False)
    return engine.sample(PROMPTS, 4, SamplingParams(1.0, 1.0, 6), seeds=prompt_seeds(0, len(PROMPTS)))


def off_policy_batch(adv_seed: int) -> TrainBatch:
    """The 12 sampled rows with their old log-probabilities lowered by 0..0.3 (so δ ≠ 0 and its sign is not float
    noise) and one random advantage per row."""
    ro = sampled()
    g = torch.Generator().manual_seed(adv_seed)
    old = (ro.logprobs_PG_T - 0.3 * torch.rand(ro.logprobs_PG_T.shape, generator=g)) * ro.mask_PG_T
    adv = torch.randn(ro.tokens_PG_T.shape[0], 1, generator=g) * ro.mask_PG_T
    return TrainBatch(replace(ro, logprobs_PG_T=old), adv)


def step_with_gradients(b: LocalBackend, batch: TrainBatch, pl: PolicyLoss) -> tuple[dict, dict]:
    """train_step's metrics and the gradients it handed the optimizer."""
    grads, step = {}, b.trainee.optimizer.step

    def record(*args, **kwargs):
        grads.update({n: p.grad.clone() for n, p in b.policy.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    b.trainee.optimizer.step = record
    return b.train_step(batch, pl, lr=1e-3), grads


@settings(max_examples=12, deadline=None)
@given(mode=st.sampled_from(["kl_cov", "clip_cov"]), micro_batch_size=st.sampled_from([1, 2, 12]),
       adv_seed=st.integers(0, 2**16))
def test_micro_batch_size_never_changes_the_loss_or_the_gradient(mode, micro_batch_size, adv_seed):
    batch, pl = off_policy_batch(adv_seed), loss(mode, **KNOBS[mode])
    whole, whole_grads = step_with_gradients(backend(0), batch, pl)
    split, split_grads = step_with_gradients(backend(micro_batch_size), batch, pl)
    assert whole["policy/cov_fraction"] > 0 and split["policy/cov_fraction"] == whole["policy/cov_fraction"]
    assert split["clip_fraction"] == whole["clip_fraction"]
    assert split["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert whole_grads.keys() == split_grads.keys() and whole_grads
    for n, g in whole_grads.items():
        assert torch.allclose(g, split_grads[n], atol=1e-6, rtol=1e-4), n


def test_clip_cov_repeats_its_draws_from_a_checkpoint(tmp_path):
    # two backends of one seed draw the same tokens at step 0; the step counter survives save/load, so a loaded
    # backend's next draw is the uninterrupted one's
    batch, pl = off_policy_batch(1), loss("clip_cov", **KNOBS["clip_cov"])
    a, b = backend(), backend()
    first_a, first_b = a.train_step(batch, pl, lr=1e-3), b.train_step(batch, pl, lr=1e-3)
    assert first_a["loss"] == first_b["loss"] and first_a["clip_fraction"] > 0
    a.save(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "local_state.json").read_text()) == {"train_steps": 1}
    resumed = backend()
    resumed.load(tmp_path / "ckpt")
    assert resumed.trainee.train_steps == 1
    assert resumed.train_step(batch, pl, lr=1e-3)["loss"] == a.train_step(batch, pl, lr=1e-3)["loss"]


# ---- 4-step runs through rlvr.run.run ----

RUN_KNOBS = {"kl_cov": [], "clip_cov": ["algorithm.loss.clip_cov_ratio=0.05", "algorithm.loss.clip_cov_min=0.0"]}


def training_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_KEYS} for r in rows if "loss" in r]


@pytest.mark.parametrize("mode", ["kl_cov", "clip_cov"])
def test_four_steps_train_and_resume_exactly(mode, tmp_path):
    """4 uninterrupted steps; 2 steps then 2 more resumed from the step-2 checkpoint: the same training rows."""
    overrides = FAST + MIXED + [f"algorithm.loss.mode={mode}", *RUN_KNOBS[mode]]
    run(compose_config(overrides + ["trainer.max_steps=4"]), tmp_path / "whole")
    steps = training_rows(tmp_path / "whole")
    trained = [r for r in steps if not r["skipped"]]
    assert [r["step"] for r in steps] == [0, 1, 2, 3] and trained
    assert all(math.isfinite(r["loss"]) and r["policy/cov_fraction"] > 0 for r in trained)
    if mode == "clip_cov":
        assert all(r["clip_fraction"] == r["policy/cov_fraction"] for r in trained)
    adapter = load_file(tmp_path / "whole" / "checkpoints" / "step_4" / "adapter_model.safetensors")
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # LoRA B starts at 0: it moved
    run(compose_config(overrides + ["trainer.max_steps=2"]), tmp_path / "resumed")
    run(compose_config(overrides + ["trainer.max_steps=4"]), tmp_path / "resumed")
    assert training_rows(tmp_path / "resumed") == steps
