"""backend=fsdp over 2 real processes (torchrun, gloo) against backend=local in one, on the same rows: the weights
after 3 steps agree to 1e-5 (LoRA and full fine-tuning, one micro-batch or several with an uneven split, PPO
clipping on with ε small enough that the stale ratios of steps 2-3 clip), and so do the step's loss, gradient norm
and clip fraction; kl_cov and clip_cov pick the same tokens over the whole step (gathered log-probabilities, the
same seeded draw); a token mask (correction=token_mask) divides by the tokens every rank kept. The rows: 11 of 12
with an advantage, so the ranks hold 6 and 5; with micro_batch_size=5 rank 0 runs 2 passes and rank 1 one pass plus
a zero-weight one. Packed (backend.packing, budget 24 tokens) the ranks hold rows balanced by tokens, in passes of
their own count, against the padded single process. A reference KL and an entropy bonus (full fine-tuning: the frozen
copy sharded as the policy; LoRA: the adapter disabled, packed) give the same weights and the same kl and entropy, and
the same reference log-probabilities (`algorithm.kl.where=reward`'s collective). Rows split in two sequences (a chat
template's rewrite, `Rollouts.segments_PG`) are shared over the ranks as sequences and train as one process does, and
so do ECHO's weights, with a row that trains for ECHO alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed.steps_worker import KNOBS, LORA, TINY, steps, trainable

from rlvr.backend.local import LocalBackend

WORKER = Path(__file__).with_name("steps_worker.py")
REPO = Path(__file__).resolve().parents[2]


def torchrun(nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


CASES = [  # (full, micro_batch_size, clip, mode, correction, packing, aggregation, kl, split, echo,
    # distill)
    (False, 0, 0.0, "standard", "none", 0, "token_mean", 0.0, False, False, False),
    (False, 5, 0.001, "standard", "none", 0, "seq_mean_token_mean", 0.0, False, False, False),
    (True, 0, 0.001, "standard", "none", 0, "token_mean", 0.0, False, False, False),
    (False, 5, 0.0, "kl_cov", "none", 0, "token_mean", 0.0, False, False, False),
    (False, 5, 0.2, "clip_cov", "none", 0, "token_mean", 0.0, False, False, False),
    (False, 5, 0.0, "standard", "token_mask", 0, "token_mean", 0.0, False, False, False),
    (True, 5, 0.0, "standard", "token_mask", 24, "prompt_mean", 0.0, False, False, False),
    # the frozen copy, sharded; the adapter disabled: reference passes paired over the ranks
    (True, 5, 0.0, "standard", "none", 0, "token_mean", 0.5, False, False, False),
    (False, 5, 0.0, "standard", "none", 24, "seq_mean_token_mean", 0.5, False, False, False),
    (False, 5, 0.0, "standard", "none", 0, "seq_mean_token_mean", 0.5, True, False, False),  # split rows
    (False, 5, 0.0, "standard", "none", 24, "token_mean", 0.0, False, True, False),  # ECHO, a row trained for it alone
    # the teacher's KL over the whole vocabulary (distill.estimator=full), a row trained for it alone
    (False, 5, 0.0, "standard", "none", 24, "token_mean", 0.0, False, False, True),
]
KEYS = ("full", "micro_batch_size", "clip", "mode", "correction", "packing", "aggregation", "kl", "split", "echo",
        "distill")
ROLLBACK = {"full": True, "micro_batch_size": 5, "nan_step": 1}
"""Full fine-tuning, the ranks' rows split unevenly, and step 2 of 3 with a NaN learning rate: its update is rolled
back (`test_two_ranks_roll_back_a_nonfinite_update_together`), the last case of the torchrun."""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every case on 2 ranks, in one torchrun start (tests/distributed/steps_worker.py)."""
    out = tmp_path_factory.mktemp("fsdp") / "fsdp.pt"
    proc = torchrun(2, str(WORKER), str(out), json.dumps([*(dict(zip(KEYS, c, strict=True)) for c in CASES), ROLLBACK]),
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize(KEYS, CASES)
def test_two_ranks_update_the_weights_as_one_process_does(two_ranks, full, micro_batch_size, clip, mode, correction,
                                                          packing, aggregation, kl, split, echo, distill):
    """Each case as one process and as two: the same weights and statistics. The aggregations other than token_mean
    weigh rows by counts over the whole step, which each rank must see whole."""
    assert two_ranks["world"] == 2
    fsdp = two_ranks["cases"][CASES.index((full, micro_batch_size, clip, mode, correction, packing, aggregation, kl,
                                           split, echo, distill))]
    torch.set_num_threads(1)
    model, tok = TINY.load(0)
    local = LocalBackend(model, None if full else LORA, 0, tok.pad_token_id, micro_batch_size=micro_batch_size,
                         reference=kl > 0, **KNOBS)
    before = trainable(local.policy)
    stats = steps(local, clip, mode, correction=correction, aggregation=aggregation, kl=kl, split=split, echo=echo,
                  distill=distill)
    weights = trainable(local.policy)
    assert set(fsdp["params"]) == set(weights)
    assert max(float((weights[n] - before[n]).abs().max()) for n in weights) > 1e-3, "the steps moved the weights"
    for name, value in weights.items():
        assert torch.allclose(fsdp["params"][name], value, rtol=0, atol=1e-5), name
    for mine, theirs in zip(stats, fsdp["stats"], strict=True):
        for key in ("loss", "grad_norm", "clip_fraction", "policy/abs_kl", "policy/ratio_max", "mismatch/kl",
                    "mismatch/ratio_max", "mismatch/ratio_min", "mismatch/masked_frac",
                    *(["policy/cov_fraction"] if mode != "standard" else []),
                    *(["policy/kl_ref", "policy/entropy", "ref_lp_sum"] if kl else []),
                    *(["echo/loss"] if echo else []), *(["distill/loss", "distill/support_kl"] if distill else [])):
            if key not in mine:  # the reference log-probabilities: the first step's alone
                continue
            assert theirs[key] == pytest.approx(mine[key], rel=1e-5, abs=1e-6), key
        tokens = "rl/optimizer_nonzero_advantage_action_tokens"
        assert theirs[tokens] == mine[tokens]
    if clip and mode == "standard":
        assert any(s["clip_fraction"] > 0 for s in stats), "the later steps' stale ratios are clipped"
    if mode != "standard":  # the pick over the whole step, split over the ranks and their micro-batches alike
        assert all(s["policy/cov_fraction"] > 0 for s in stats)
    if kl:  # the later steps' policy is off the reference
        assert stats[0]["policy/kl_ref"] == pytest.approx(0.0, abs=1e-6) and stats[-1]["policy/kl_ref"] > 1e-9
    if echo:  # −Σ w·log π over 24 tokens of weight 0.0125 (log π < 0): positive
        assert all(s["echo/loss"] > 0 for s in stats)
    if distill:  # a KL to a random teacher: positive
        assert all(s["distill/loss"] > 0 for s in stats)
    if correction == "token_mask":  # the later steps mask tokens of both ranks; the kept count is the whole step's
        assert 0 < stats[-1]["mismatch/masked_frac"] < 1


def test_two_ranks_roll_back_a_nonfinite_update_together(two_ranks):
    """Step 2's update makes every weight NaN (a NaN learning rate): each rank finds its own shards non-finite, and
    all of them roll back together (a rank that did not would leave the model half stepped). The weights after the 3
    steps are one process's, which rolled back the same step."""
    fsdp = two_ranks["cases"][len(CASES)]
    torch.set_num_threads(1)
    model, tok = TINY.load(0)
    local = LocalBackend(model, None, 0, tok.pad_token_id, micro_batch_size=5, **KNOBS)
    stats = steps(local, 0.0, nan_step=1)
    assert [s.get("train/nonfinite_weights", 0.0) for s in stats] == [0.0, 1.0, 0.0]
    assert [s.get("train/nonfinite_weights", 0.0) for s in fsdp["stats"]] == [0.0, 1.0, 0.0]
    weights = trainable(local.policy)
    assert all(bool(torch.isfinite(v).all()) for v in weights.values())
    for name, value in weights.items():
        assert torch.allclose(fsdp["params"][name], value, rtol=0, atol=1e-5), name
