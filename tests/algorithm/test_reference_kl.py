"""algorithm.kl and algorithm.entropy_coef (rlvr/algorithm/kl.py, docs/algorithms.md#reference-kl-and-entropy-bonus):
the k1/k2/k3 estimates by hand, the loss's gradient against autograd of the formula written out, the in-reward
penalty, validation, the needs that refuse backend=tinker, and the condition label."""

import math

import pytest
import torch

from composing import compose_config
from rlvr.algorithm.kl import NO_KL, ReferenceKL, estimate, kl_in_reward
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.tinker import TinkerBackend
from rlvr.errors import ConfigError
from rlvr.labels import condition_label
from rlvr.loss import LossInputs
from rlvr.types import Rollouts

LOGP = torch.tensor([-1.0, -2.0, -0.5])
REF = torch.tensor([-1.5, -1.0, -0.5])  # δ = logp − ref = [0.5, −1.0, 0.0]


def test_the_estimators_by_hand():
    # k1 = δ; k2 = ½δ²; k3 = exp(−δ) − 1 + δ: at δ = 0.5: e^−0.5 − 0.5 = 0.106531; at δ = −1: e − 2 = 0.718282
    torch.testing.assert_close(estimate("k1", LOGP, REF), torch.tensor([0.5, -1.0, 0.0]))
    torch.testing.assert_close(estimate("k2", LOGP, REF), torch.tensor([0.125, 0.5, 0.0]))
    torch.testing.assert_close(estimate("k3", LOGP, REF), torch.tensor([math.exp(-0.5) - 0.5, math.e - 2, 0.0]))
    # k3 is clamped to [−10, 10] as verl's low_var_kl: δ = −20 gives e^20 − 21 ≈ 4.9e8 → 10
    assert float(estimate("k3", torch.tensor([-20.0]), torch.tensor([0.0]))) == 10.0
    # auto: k3 in the loss, k1 in the reward (verl's defaults)
    assert ReferenceKL(0.1).kind == "k3" and ReferenceKL(0.1, where="reward").kind == "k1"
    assert ReferenceKL(0.1, "k2", "reward").kind == "k2"


def test_the_regularized_loss_has_the_formulas_gradient():
    # ℓ_t = −exp(new − old)·A + β·k3(new, ref) − c·H, token mean over A ≠ 0 (the last token: A = 0, left out)
    beta, c = 0.3, 0.05
    old = torch.tensor([-1.2, -0.7, -2.0, -1.0])
    adv = torch.tensor([1.0, -0.5, 2.0, 0.0])
    ref = torch.tensor([-1.0, -1.5, -1.9, -0.2])
    new = torch.tensor([-1.1, -0.9, -2.2, -0.4], requires_grad=True)
    ent = torch.tensor([0.8, 1.1, 0.3, 2.0], requires_grad=True)
    loss = PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(beta, "k3"), entropy_coef=c)
    m = adv != 0
    out = loss(LossInputs(new, old, adv, m, int(m.sum()), m, ref_logprobs=ref, entropies=ent))
    out.loss.backward()
    ours = new.grad.clone(), ent.grad.clone()

    new.grad, ent.grad = None, None
    d = new - ref
    direct = -torch.exp(new - old) * adv + beta * (torch.exp(-d) - 1 + d) - c * ent
    (direct * m).sum().div(m.sum()).backward()
    torch.testing.assert_close(ours[0], new.grad)
    torch.testing.assert_close(ours[1], ent.grad)
    # by hand: ∂/∂new = (−r·A + β·(1 − e^−δ))/3 on the counted tokens; ∂/∂H = −c/3
    r, delta = torch.exp(new.detach() - old), new.detach() - ref
    torch.testing.assert_close(ours[0], torch.where(m, (-r * adv + beta * (1 - torch.exp(-delta))) / 3, 0.0))
    torch.testing.assert_close(ours[1], torch.where(m, torch.tensor(-c / 3), 0.0))
    torch.testing.assert_close(out.metrics["kl_ref"], (torch.exp(-delta) - 1 + delta)[m].sum())
    torch.testing.assert_close(out.metrics["entropy"], ent.detach()[m].sum())


def test_the_defaults_leave_the_loss_untouched():
    loss = PolicyLoss(0.0, 0.0, 0.0)
    assert loss.reference_kl is NO_KL and loss.regularizers == () and loss.entropy_coef == 0
    cfg = compose_config([])
    assert cfg.algorithm.kl.coef == 0 and cfg.algorithm.entropy_coef == 0
    assert cfg.algorithm.loss.kl.coef == 0  # the loss reads the algorithm's (an interpolation)


@pytest.mark.parametrize(("knobs", "message"), [
    ({"coef": -0.1}, "algorithm.kl.coef=-0.1 must be >= 0"),
    ({"coef": 0.1, "estimator": "k4"}, "algorithm.kl.estimator='k4' must be one of k1, k2, k3, auto"),
    ({"coef": 0.1, "where": "advantage"}, "algorithm.kl.where='advantage' must be one of loss, reward"),
])
def test_bad_values_name_the_key(knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ReferenceKL(**knobs)


def test_a_non_finite_entropy_coef_is_refused():
    with pytest.raises(ValueError, match="algorithm.entropy_coef=nan must be a finite number"):
        PolicyLoss(0.0, 0.0, 0.0, entropy_coef=float("nan"))


def test_a_bad_value_in_the_config_is_a_config_error():
    from rlvr.build import build

    with pytest.raises(ConfigError, match=r"algorithm.kl.coef=-1.0 must be >= 0"):
        build(compose_config(["algorithm.kl.coef=-1.0"]), "algorithm")


def test_kl_in_the_reward_subtracts_beta_times_the_sequence_kl():
    # 1 prompt × 2 rows, T = 3; row 0 has 3 tokens, row 1 has 2. Sampler log π = [−1, −2, −0.5 | −1, −1], reference
    # [−1.5, −1, −0.5 | −2, −1]: k1 per token [0.5, −1, 0 | 1, 0], Σ = [−0.5, 1]; β = 0.2 → rewards − [−0.1, 0.2]
    mask = torch.tensor([[True, True, True], [True, True, False]])
    engine = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, 9.0]])  # 9.0 on padding: never read
    ro = Rollouts([[1, 2]], 2, torch.ones(2, 3, dtype=torch.long), engine, mask, torch.ones(2, dtype=torch.bool), 1.0)

    class Reference:
        def reference_logprobs(self, rollouts):
            return ref

    loss = PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.2, where="reward"))
    rewards, metrics = kl_in_reward(loss, Reference(), ro, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(rewards, torch.tensor([[1.1, -0.2]]))
    assert metrics["policy/kl_ref"] == pytest.approx(0.5 / 5) and metrics["policy/kl_coef"] == 0.2
    assert metrics["policy/kl_reward_penalty"] == pytest.approx(0.05)
    # in the loss, or off: the rewards themselves and no pass
    for off in (PolicyLoss(0.0, 0.0, 0.0), PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.2))):
        same, none = kl_in_reward(off, object(), ro, torch.tensor([[1.0, 0.0]]))
        assert none == {} and same.tolist() == [[1.0, 0.0]]


def test_tinker_refuses_kl_and_entropy_naming_the_key():
    needs = PolicyLoss.needs({"clip_eps": 0.0, "kl": {"coef": 0.1}, "entropy_coef": 0.01})
    assert needs.requires == {"reference_model": "algorithm.kl.coef=0.1"}
    tinker = TinkerBackend.needs({"loss_fn": "importance_sampling", "base_model": "x", "api_key_env": "K"})
    assert "reference_model" not in tinker.provides and not TinkerBackend.loss_support.entropy_bonus
    from rlvr.config_check import loss_support_errors, unmet_needs

    cfg = compose_config(["backend=tinker", "algorithm.kl.coef=0.1", "algorithm.entropy_coef=0.01"])
    errors = unmet_needs(cfg, {"algorithm": needs, "backend": tinker}) + loss_support_errors(cfg)
    assert any("algorithm.kl.coef=0.1" in e and "reference model" in e for e in errors)
    assert any("algorithm.entropy_coef=0.01" in e and "entropy bonus" in e for e in errors)
    backend = TinkerBackend.__new__(TinkerBackend)  # loss_config alone, should one get past the check
    with pytest.raises(ConfigError, match="algorithm.kl.coef=0.1 needs a reference pass"):
        backend.loss_config(PolicyLoss(0.0, 0.0, 0.0, kl=ReferenceKL(0.1)))
    with pytest.raises(ConfigError, match="algorithm.entropy_coef=0.01: backend=tinker computes no entropy bonus"):
        backend.loss_config(PolicyLoss(0.0, 0.0, 0.0, entropy_coef=0.01))


@pytest.mark.parametrize(("overrides", "label"), [
    ([], "grpo+none"),
    (["algorithm.kl.coef=0.0", "algorithm.kl.estimator=k2"], "grpo+none"),
    (["algorithm.kl.coef=0.001"], "grpo+none,kl=0.001"),
    (["algorithm.kl.coef=0.001", "algorithm.kl.estimator=k3"], "grpo+none,kl=0.001"),
    (["algorithm.kl.coef=0.05", "algorithm.kl.estimator=k1"], "grpo+none,kl=0.05/k1"),
    (["algorithm.kl.coef=0.05", "algorithm.kl.where=reward"], "grpo+none,kl=0.05/reward"),
    (["algorithm=maxrl", "algorithm.kl.coef=0.05", "algorithm.kl.where=reward", "algorithm.kl.estimator=k3"],
     "maxrl+none,kl=0.05/k3/reward"),
    (["algorithm.entropy_coef=0.001", "algorithm.loss.aggregation=prompt_mean"], "grpo+none,agg=prompt_mean,ent=0.001"),
])
def test_the_label_shows_kl_and_entropy_when_not_the_default(overrides, label):
    from omegaconf import OmegaConf

    assert condition_label(OmegaConf.to_container(compose_config(overrides), resolve=True)) == label


def test_rlvr_plan_counts_the_full_fine_tuning_copy(tmp_path):
    from rlvr.algorithm.kl import reference_memory
    from rlvr.campaign import planned_memory

    assert reference_memory({"algorithm": {"kl": {"coef": 0.0}}, "model": {"lora": None}}) == []
    lora = reference_memory({"algorithm": {"kl": {"coef": 0.1}}, "model": {"lora": {"rank": 8}}})
    assert len(lora) == 1 and "adapter disabled, no copy" in lora[0]
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 3 * 2**20)  # a 3 MiB checkpoint on this machine
    full = {"algorithm": {"kl": {"coef": 0.1}}, "model": {"lora": None, "name_or_path": str(tmp_path),
                                                          "dtype": "bfloat16"}}
    assert reference_memory(full) == ["reference model (algorithm.kl.coef=0.1): a frozen copy of the base beside the "
                                      "trained weights (full fine-tuning): 0.00293 GiB in bfloat16 (the size of its "
                                      "weight files)"]
    sharded = reference_memory(full | {"backend": {"_target_": "rlvr.backend.fsdp.FSDPBackend"}})
    assert sharded[0].endswith("sharded over the processes (each holds 1/N)")
    lines = planned_memory(compose_config(["algorithm.kl.coef=0.1", "model.lora=null"]))
    assert lines and "parameter count × 4 bytes (float32) more" in lines[0]
    assert planned_memory(compose_config([])) is None
