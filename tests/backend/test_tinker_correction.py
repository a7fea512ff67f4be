"""`backend=tinker` computes the loss's mismatch correction (rlvr/algorithm/correction.py) on the service: one
`forward` gives π_train of the sampled tokens at the current weights; the datums then carry π_old (the engine's
under `bypass`, π_train under `decoupled`) and each advantage times the correction's factor, masked tokens leaving
the loss and N. Against the fake SDK (tests/fake_tinker.py), whose training weights give `train_logprob`."""

import math

import fake_tinker
import pytest
import torch

from composing import OVERLAP, compose_config
from rlvr.algorithm.correction import Correction
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.tinker import RL_LOSSES, TinkerBackend
from rlvr.config_check import config_problems
from rlvr.types import LoraSpec, Rollouts, TrainBatch

LORA = LoraSpec(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
ENGINE_LP = [[-0.5, -0.25, -0.125], [-1.0, -2.0, 0.0]]


pytestmark = pytest.mark.usefixtures("fake_service")  # tests/conftest.py


def backend() -> TinkerBackend:
    return fake_tinker.backend(call_timeout_s=5.0)


def batch() -> TrainBatch:
    """One prompt [5, 6, 7] × G=2: row 0 completion [3, 4, 1] advantage 1, row 1 [8, 1] advantage −1. N = 5."""
    tokens = torch.tensor([[3, 4, 1], [8, 1, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    ro = Rollouts(prompt_ids_P=[[5, 6, 7]], group_size=2, tokens_PG_T=tokens, logprobs_PG_T=torch.tensor(ENGINE_LP),
                  mask_PG_T=mask, finished_PG=torch.tensor([True, True]), temperature=1.0)
    return TrainBatch(ro, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]) * mask)


def sent() -> list[tuple[list[float], list[float]]]:
    """The completion part of each datum forward_backward got: (logprobs, advantages)."""
    (fwd,) = fake_tinker.calls("forward_backward")
    return [(d.loss_fn_inputs["logprobs"].tolist()[2:], d.loss_fn_inputs["advantages"].tolist()[2:])
            for d in fwd["data"]]


def loss(kind: str, pi_old: str, **bounds) -> PolicyLoss:
    return PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0, correction=Correction(kind, pi_old, **bounds))


TRAIN = [[fake_tinker.train_logprob(t, 0) for t in row] for row in ([3, 4, 1], [8, 1])]


def test_decoupled_token_tis_sends_pi_train_and_truncated_weights():
    backend().train_step(batch(), loss("token_tis", "decoupled", cap=2.0), lr=1e-4)
    (forward,) = fake_tinker.calls("forward")
    assert [d.model_input.to_ints() for d in forward["data"]] == [[5, 6, 7, 3, 4], [5, 6, 7, 8]]
    assert forward["loss_fn"] == "cross_entropy"
    signs = [1.0, -1.0]
    for (logprobs, advantages), train, engine, sign in zip(sent(), TRAIN, ENGINE_LP, signs):
        assert logprobs == pytest.approx(train)
        weights = [min(math.exp(t - e), 2.0) for t, e in zip(train, engine)]
        assert advantages == pytest.approx([sign * w / 5 for w in weights])


def test_bypass_token_tis_keeps_the_engine_ratio_and_divides_the_weight_by_it():
    backend().train_step(batch(), loss("token_tis", "bypass", cap=2.0), lr=1e-4)
    for (logprobs, advantages), train, engine, sign in zip(sent(), TRAIN, ENGINE_LP, [1.0, -1.0]):
        assert logprobs == pytest.approx(engine[:len(train)])
        rho = [math.exp(t - e) for t, e in zip(train, engine)]
        assert advantages == pytest.approx([sign * min(r, 2.0) / r / 5 for r in rho])


def test_a_mask_removes_tokens_from_the_loss_and_from_n():
    backend().train_step(batch(), loss("token_mask", "decoupled", low=0.5, high=2.0), lr=1e-4)
    rho = [[math.exp(t - e) for t, e in zip(train, engine)] for train, engine in zip(TRAIN, ENGINE_LP)]
    kept = [[0.5 <= r <= 2.0 for r in row] for row in rho]
    assert 0 < sum(map(sum, kept)) < 5  # the fake's weights mask some tokens, not all
    n = sum(map(sum, kept))
    sent_rows = sent()
    expected = [(k, sign) for k, sign in zip(kept, [1.0, -1.0]) if any(k)]
    assert [a for _, a in sent_rows] == [[sign / n if keep else 0.0 for keep in k] for k, sign in expected]


def test_without_a_correction_no_forward_is_asked():
    backend().train_step(batch(), PolicyLoss(clip_eps=0.0, clip_eps_high=0.0, adv_clip_max=0.0), lr=1e-4)
    assert fake_tinker.calls("forward") == []
    assert [lp for lp, _ in sent()] == [ENGINE_LP[0], ENGINE_LP[1][:2]]  # binary fractions: exact in float32


def test_the_correction_is_granted_with_a_per_token_loss_fn_and_refused_naming_them_otherwise():
    """A correction requires `token_correction`: the per-token loss_fns give it (rlvr/backend/tinker.py
    `CORRECTING_LOSSES`); under dro, gspo or stable_reinforce the factors would not mean the correction's weights."""
    settings = {"base_model": "fake/base", "api_key_env": "TINKER_API_KEY"}
    granted = {fn for fn in RL_LOSSES
               if "token_correction" in TinkerBackend.needs({**settings, "loss_fn": fn}).provides}
    assert granted == {"importance_sampling", "ppo", "cispo"}
    ahead = ["backend=tinker", "trainer.warmup.steps=0", "trainer.off_policy_steps=1", *OVERLAP]
    _, errors = config_problems(compose_config(ahead), at_start=False)
    assert errors == []
    _, errors = config_problems(compose_config([*ahead, "backend.loss_fn=gspo"]), at_start=False)
    assert any("correction=token_tis (pi_old=decoupled)), which no chosen component gives" in e and
               "backend.loss_fn=importance_sampling, ppo or cispo" in e for e in errors), errors
