"""Engine/trainer mismatch correction (rlvr/algorithm/correction.py, docs/algorithms.md#mismatch-correction):
each kind's factors worked out by hand, then the local backend's gradients against a loss written out directly,
and the step's `mismatch/*` telemetry."""

import math

import pytest
import torch

from composing import compose_config
from rlvr.algorithm.correction import Correction, mismatch_metrics, mismatch_sums
from rlvr.algorithm.loss import PolicyLoss
from rlvr.backend.local import LocalBackend
from rlvr.config_check import check
from rlvr.errors import ConfigError
from rlvr.model.tiny import TinyLlama
from rlvr.types import LoraSpec, Rollouts, TrainBatch

LN = math.log
# two rows of three sampled tokens; log ρ = log π_train − log π_engine
LOG_RHO = torch.tensor([[LN(1.0), LN(3.0), LN(0.25)], [LN(1.5), LN(1.2), 0.0]])
SAMPLED = torch.tensor([[True, True, True], [True, True, False]])  # row 1's last position is padding


def factors(**settings):
    factor, keep = Correction(**settings).factors(LOG_RHO, SAMPLED)
    return [[round(v, 6) for v in row] for row in factor.tolist()], keep.tolist()


def test_token_tis_truncates_each_weight_at_the_cap():
    # decoupled: the ratio is π_θ/sg(π_θ) (value 1), so the factor is the weight itself: min(ρ, 2)
    assert factors(kind="token_tis", pi_old="decoupled") == ([[1.0, 2.0, 0.25], [1.5, 1.2, 1.0]],
                                                             [[True] * 3, [True] * 3])
    # bypass: the ratio π_θ/π_engine already carries ρ, so the factor is min(ρ, 2)/ρ: only ρ = 3 changes (2/3)
    assert factors(kind="token_tis")[0] == [[1.0, round(2 / 3, 6), 1.0], [1.0, 1.0, 1.0]]


def test_seq_tis_gives_every_token_the_rows_truncated_product():
    # row 0: 1 · 3 · 0.25 = 0.75 (under the cap); row 1: 1.5 · 1.2 = 1.8 (padding is not a token)
    assert factors(kind="seq_tis", pi_old="decoupled")[0] == [[0.75] * 3, [1.8] * 3]
    assert factors(kind="seq_tis", pi_old="decoupled", cap=1.5)[0] == [[0.75] * 3, [1.5] * 3]
    # bypass: 0.75/ρ_t per token of row 0: 0.75, 0.25, 3.0
    assert factors(kind="seq_tis")[0][0] == [0.75, 0.25, 3.0]


def test_token_mask_keeps_the_band_and_weighs_nothing():
    # [0.5, 2]: ρ = 3 and 0.25 leave; bypass keeps the ratio's own ρ (factor 1), decoupled weighs nothing (1)
    for pi_old in ("bypass", "decoupled"):
        factor, keep = factors(kind="token_mask", pi_old=pi_old)
        assert keep == [[True, False, False], [True, True, True]]
        assert factor == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_seq_geo_mask_drops_whole_rows_outside_the_band():
    # geometric means: row 0 (1·3·0.25)^(1/3) = 0.9086, row 1 (1.5·1.2)^(1/2) = 1.3416
    assert factors(kind="seq_geo_mask", low=0.9, high=1.1)[1] == [[True] * 3, [False] * 3]
    assert factors(kind="seq_geo_mask", low=0.95, high=1.5)[1] == [[False] * 3, [True] * 3]


def test_decoupled_without_a_correction_ignores_the_mismatch():
    assert factors(kind="none", pi_old="decoupled")[0] == [[1.0] * 3, [1.0] * 3]


@pytest.mark.parametrize("bad", [{"kind": "tis"}, {"pi_old": "recompute"}, {"cap": 0.5}, {"low": 1.0},
                                 {"high": 0.9}])
def test_bad_settings_name_the_key(bad):
    with pytest.raises(ValueError, match="algorithm.loss.correction"):
        Correction(**bad)


def test_the_telemetry_of_a_known_mismatch():
    keep = torch.tensor([[True, False, False], [True, True, True]])
    signal = torch.tensor([[True, True, True], [True, False, False]])  # tokens with an advantage
    m = mismatch_metrics(mismatch_sums(LOG_RHO, SAMPLED, keep, signal))
    rho = [1.0, 3.0, 0.25, 1.5, 1.2]
    assert m["mismatch/kl"] == pytest.approx(sum(r - 1 - LN(r) for r in rho) / 5)  # k3, ≥ 0
    assert m["mismatch/ratio_mean"] == pytest.approx(sum(rho) / 5)
    assert (m["mismatch/ratio_max"], m["mismatch/ratio_min"]) == pytest.approx((3.0, 0.25))
    assert m["mismatch/seq_ratio_max"] == pytest.approx(1.8)  # max(0.75, 1.8)
    assert m["mismatch/masked_frac"] == pytest.approx(2 / 4)  # 2 of the 4 tokens with signal were masked


# --- the backend: gradients against the loss written out ----------------------------------------------------

TINY = TinyLlama("0123456789+=", 32, 64, 2, 2, 32, "float32", None)
PROMPTS = [[3, 4], [5]]


def batch(model, tok, noise: float) -> TrainBatch:
    """4 rows (2 prompts × 2), 5 tokens each, the last row shorter; the engine's log-probs are the trainer's own
    plus a fixed perturbation of up to ±`noise` (a mismatch, as a bfloat16 engine would have)."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 12, (4, 5), generator=gen)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[3, 3:] = False
    backend = LocalBackend(model, None, 0, tok.pad_token_id, "cpu", (0.9, 0.999), 1e-8, 0.0, 0.0, 0, False)
    rows = [p for p in PROMPTS for _ in range(2)]
    ids, attn, Lp = backend.trainee.rows(rows, tokens, mask)
    with torch.no_grad():
        train_lp = backend.completion_logprobs(ids, attn, Lp, tokens, 1.0)
    engine_lp = (train_lp + noise * (2 * torch.rand(4, 5, generator=gen) - 1)) * mask
    ro = Rollouts(prompt_ids_P=PROMPTS, group_size=2, tokens_PG_T=tokens, logprobs_PG_T=engine_lp, mask_PG_T=mask,
                  finished_PG=torch.ones(4, dtype=torch.bool), temperature=1.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(4, 5) * mask
    return TrainBatch(ro, adv.contiguous())


def gradients(correction: Correction, micro_batch_size: int, noise: float = 0.8) -> tuple[dict, dict]:
    model, tok = TINY.load(0)
    b = batch(model, tok, noise)
    backend = LocalBackend(model, None, 0, tok.pad_token_id, "cpu", (0.9, 0.999), 1e-8, 0.0, 0.0, micro_batch_size,
                           False)
    t = backend.trainee
    rows = t.step_rows(b)
    loss = PolicyLoss(0.0, 0.0, 0.0, correction=correction)
    sums = t.accumulate(loss, rows, t.micro_batches(rows, range(4)), None, 1.0)
    scale = t.kept_scale(sums, rows)
    got = {n: p.grad.clone() * scale for n, p in model.named_parameters() if p.grad is not None}
    return got, {"sums": sums, "rows": rows, "model": model, "batch": b, "backend": backend}


def reference_gradients(model, backend, b: TrainBatch, weight, keep) -> dict:
    """∇ of Σ_kept −w_t·A_t·log π_θ(t) / (kept tokens): the corrected policy gradient written out."""
    model.zero_grad()
    t = backend.trainee
    rows = t.step_rows(b)
    lp = t.logprobs(rows, [0, 1, 2, 3])
    kept = rows.action & keep
    (-(weight * rows.adv * lp)[kept].sum() / kept.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("micro_batch_size", [4, 1])
@pytest.mark.parametrize("pi_old", ["bypass", "decoupled"])
def test_token_tis_gradient_is_the_truncated_importance_weighted_policy_gradient(pi_old, micro_batch_size):
    got, ctx = gradients(Correction("token_tis", pi_old, cap=1.2), micro_batch_size)
    rows = ctx["rows"]
    rho = torch.exp(ref_lp(ctx) - rows.engine_lp)
    assert bool((rho[rows.sampled] > 1.2).any()), "the cap must bite somewhere in this batch"
    expected = reference_gradients(ctx["model"], ctx["backend"], ctx["batch"], rho.clamp(max=1.2),
                                   torch.ones_like(rows.action))
    assert_close(got, expected)


@pytest.mark.parametrize("micro_batch_size", [4, 1])
def test_token_mask_removes_tokens_from_the_loss_and_from_its_count(micro_batch_size):
    got, ctx = gradients(Correction("token_mask", "decoupled", low=0.7, high=1.3), micro_batch_size)
    rows = ctx["rows"]
    rho = torch.exp(ref_lp(ctx) - rows.engine_lp)
    keep = (rho >= 0.7) & (rho <= 1.3)
    assert 0 < int((rows.action & ~keep).sum()) < int(rows.action.sum()), "some tokens masked, not all"
    assert ctx["sums"]["kept"] == int((rows.action & keep).sum())
    expected = reference_gradients(ctx["model"], ctx["backend"], ctx["batch"], torch.ones_like(rho), keep)
    assert_close(got, expected)
    # every ratio the loss still sees is inside the band
    assert bool(((rho[rows.action & keep] >= 0.7) & (rho[rows.action & keep] <= 1.3)).all())


def test_no_correction_in_bypass_is_the_loss_of_before():
    """correction=none, pi_old=bypass: ℓ = −r·A with r = π_θ/π_engine, the full (untruncated) importance weight."""
    got, ctx = gradients(Correction(), 4)
    rows = ctx["rows"]
    rho = torch.exp(ref_lp(ctx) - rows.engine_lp)
    expected = reference_gradients(ctx["model"], ctx["backend"], ctx["batch"], rho, torch.ones_like(rows.action))
    assert_close(got, expected)


def ref_lp(ctx) -> torch.Tensor:
    rows, t = ctx["rows"], ctx["backend"].trainee
    with torch.no_grad():
        return t.logprobs(rows, [0, 1, 2, 3])


def test_a_train_step_reports_the_mismatch():
    model, tok = TINY.load(0)
    b = batch(model, tok, noise=0.8)
    backend = LocalBackend(model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"]), 0, tok.pad_token_id, "cpu",
                           (0.9, 0.999), 1e-8, 0.0, 0.0, 0, False)
    row = backend.train_step(b, PolicyLoss(0.0, 0.0, 0.0, correction=Correction("token_mask", low=0.7, high=1.3)),
                             1e-3)
    assert row["mismatch/kl"] > 0 and row["mismatch/ratio_max"] > 1.3 and row["mismatch/ratio_min"] < 0.7
    assert 0 < row["mismatch/masked_frac"] < 1
    on_policy = backend.train_step(batch(model, tok, noise=0.0), PolicyLoss(0.0, 0.0, 0.0), 1e-3)
    assert on_policy["mismatch/kl"] < 1e-4 and on_policy["mismatch/masked_frac"] == 0.0


def test_a_backend_that_cannot_correct_is_refused_at_start():
    with pytest.raises(ConfigError, match="correction=token_tis"):
        check(compose_config(["backend=tinker", "backend.loss_fn=gspo", "correction=token_tis"]))
    check(compose_config(["correction=token_tis"]))


def test_the_decoupled_pi_old_is_what_a_no_grad_pass_of_the_trainer_gives():
    """rlvr takes one optimizer step per batch: the gradient pass's own log-probabilities (detached), micro-batch by
    micro-batch in train mode, are the trainer's π_old that verl's decoupled mode computes in an extra no-grad pass."""
    model, tok = TINY.load(0)
    b = batch(model, tok, noise=0.3)
    backend = LocalBackend(model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"]), 0, tok.pad_token_id, "cpu",
                           (0.9, 0.999), 1e-8, 0.0, 0.0, 2, False)
    t = backend.trainee
    rows = t.step_rows(b)
    model.eval()
    with torch.no_grad():
        extra_pass = t.logprobs(rows, [0, 1, 2, 3])
    model.train()
    in_pass = torch.cat([t.logprobs(rows, b).detach() for b in t.micro_batches(rows, range(4))])
    torch.testing.assert_close(in_pass[rows.sampled], extra_pass[rows.sampled], rtol=0, atol=1e-6)
    # and decoupled without a correction trains the on-policy gradient: weight 1, whatever the engine said
    got, ctx = gradients(Correction("none", "decoupled"), 2)
    expected = reference_gradients(ctx["model"], ctx["backend"], ctx["batch"], torch.ones_like(ctx["rows"].adv),
                                   torch.ones_like(ctx["rows"].action))
    assert_close(got, expected)
