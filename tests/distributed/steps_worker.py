"""Three train steps of backend=fsdp on fixed rollouts, for tests/distributed/test_fsdp_backend.py; run by torchrun:

    torchrun --nproc-per-node 2 tests/distributed/steps_worker.py OUT.pt CASES_JSON

CASES_JSON is a list of cases, each a dict of `case()`'s keyword arguments (full, micro_batch_size, clip, mode,
correction, packing, aggregation, kl, split, echo, distill). The cases run one after another in the same processes
(one torchrun start for them all: its processes' start-up is most of a case's time). Rank 0 saves, per case,
{"params": the full trainable weights after the steps, "stats": each step's train_step dict} to OUT.pt, with "world".
`steps(backend)` is the loop both sides run (the test runs it on backend=local in its own process)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, when run as a script

from rlvr.algorithm.correction import Correction  # noqa: E402
from rlvr.algorithm.kl import ReferenceKL  # noqa: E402
from rlvr.algorithm.loss import PolicyLoss  # noqa: E402
from rlvr.engine.pytorch import PyTorchEngine  # noqa: E402
from rlvr.model.tiny import TinyLlama  # noqa: E402
from rlvr.seeds import prompt_seeds  # noqa: E402
from rlvr.types import (  # noqa: E402
    LoraSpec,  # noqa: E402
    Rollouts,
    SamplingParams,
    TeacherSupport,
    TrainBatch,
)

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
PROMPTS = [[4, 5, 13, 6, 7, 14], [3, 14], [12, 12, 12, 13, 4]]
KNOBS = {"device": "cpu", "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "grad_clip_norm": 1.0,
         "gradient_checkpointing": False}


def steps(backend, clip: float, mode: str = "standard", n: int = 3, correction: str = "none",
          aggregation: str = "token_mean", kl: float = 0.0, split: bool = False, echo: bool = False,
          distill: bool = False, nan_step: int = -1) -> list[dict]:
    """`n` steps on one set of rollouts sampled before the first (so the later steps' ratios are not 1), 11 of its
    12 rows with an advantage (the row with 0 is dropped: an odd count splits unevenly over 2 ranks). AdamW divides
    each gradient element by its running RMS, so float noise in a near-zero element moves its weight by up to ~lr:
    at lr=1e-2 two summation orders differ by ~5e-5 in one LoRA weight after 3 steps, at 1e-3 by ~5e-6. `kl` > 0:
    a reference KL of that β (k3, in the loss) and an entropy bonus of β/10, and the first step's stats gain
    `ref_lp_sum`, the sum of `backend.reference_logprobs` (what `algorithm.kl.where=reward` reads). `split`: every row
    longer than 3 tokens is two sequences (`Rollouts.segments_PG`), the second behind its own context as its prompt,
    which must train as the whole row does. `echo`: ECHO weights (0.05 / 4 each) on the last 2 real tokens of every
    row, the row without an advantage included (it trains for ECHO alone). `distill`: a teacher's whole vocabulary at
    every action token (random log-probabilities, seeded), its KL weighted 0.5 / the action tokens
    (distill.estimator=full; the row without an advantage trains for it alone). `nan_step`: the step whose learning
    rate is NaN (its update makes every weight NaN, and is rolled back); -1: none."""
    engine = PyTorchEngine(backend.policy, [1], 0, 256, merge_lora=False)
    ro = engine.sample(PROMPTS, 4, SamplingParams(0.9, 1.0, 6), seeds=prompt_seeds(7, len(PROMPTS)))
    if split:
        ro = split_rows(ro, 3)
    adv = torch.linspace(-1.0, 1.0, 12)
    adv[5] = 0.0
    batch = TrainBatch(ro, adv[:, None] * ro.mask_PG_T)
    if echo:
        last_two = torch.arange(ro.mask_PG_T.shape[1])[None, :] >= ro.lengths_PG[:, None] - 2
        batch = TrainBatch(ro, batch.adv_PG_T, 0.0125 * (ro.mask_PG_T & last_two))
    if distill:
        gen = torch.Generator().manual_seed(3)
        V = len(TINY.alphabet) + 3
        teacher = torch.log_softmax(torch.randn(*ro.mask_PG_T.shape, V, generator=gen), -1)
        lp, ids = teacher.topk(V, dim=-1)
        weight = ro.action_mask_PG_T.float() * 0.5 / int(ro.action_mask_PG_T.sum())
        batch = TrainBatch(ro, batch.adv_PG_T, batch.echo_PG_T, TeacherSupport(ids, lp, weight))
    # kl_cov: the 10 % of tokens of largest covariance; clip_cov: 20 % drawn among all (a band wide enough for any)
    # token_mask: a band narrow enough that the later steps' stale ratios leave it (tokens masked on every rank)
    loss = PolicyLoss(clip, clip, 0.0, mode=mode, kl_cov_percent=10.0, clip_cov_ratio=0.2, clip_cov_min=-1e3,
                      clip_cov_max=1e3, correction=Correction(correction, low=0.999, high=1.001),
                      aggregation=aggregation, kl=ReferenceKL(kl, "k3"), entropy_coef=kl / 10)
    reference = {"ref_lp_sum": float(backend.reference_logprobs(ro).sum())} if kl else {}
    stats = [backend.train_step(batch, loss, lr=math.nan if i == nan_step else 1e-3)  # trainer.lr's default
             for i in range(n)]
    return [stats[0] | reference, *stats[1:]]


def split_rows(ro: Rollouts, at: int) -> Rollouts:
    """`ro` with each row longer than `at` tokens two sequences, the second from completion position `at`, behind
    the prompt and the row's first `at` tokens (the context it was sampled from) as its own prompt."""
    from dataclasses import replace

    return replace(ro, segments_PG=[
        [(at, ro.prompt_ids_P[r // ro.group_size] + ro.tokens_PG_T[r, :at].tolist())] if n > at else []
        for r, n in enumerate(ro.lengths_PG.tolist())])


def trainable(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def case(full: bool = False, micro_batch_size: int = 0, clip: float = 0.0, mode: str = "standard",
         correction: str = "none", packing: int = 0, aggregation: str = "token_mean", kl: float = 0.0,
         split: bool = False, echo: bool = False, distill: bool = False, nan_step: int = -1) -> dict:
    """One case on backend=fsdp over this torchrun's processes: the trainable weights after `steps` and its stats
    (full fine-tuning or LoRA; packing: backend.packing with that token budget, 0 padded; kl: algorithm.kl.coef, and
    entropy_coef = kl/10; split: the rows split in two sequences; echo: ECHO weights on every row's last 2 tokens;
    nan_step: `steps`')."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from rlvr.backend.fsdp import FSDPBackend
    from rlvr.distributed import World

    model, tok = TINY.load(0)
    backend = FSDPBackend(model, None if full else LORA, 0, tok.pad_token_id, micro_batch_size=micro_batch_size,
                          reshard_after_forward=True, timeout_s=120, world=World.from_env(), packing=packing > 0,
                          max_tokens_per_micro_batch=packing, reference=kl > 0, **KNOBS)
    stats = steps(backend, clip, mode, correction=correction, aggregation=aggregation, kl=kl, split=split,
                  echo=echo, distill=distill, nan_step=nan_step)
    full_state = get_model_state_dict(backend.policy, options=StateDictOptions(full_state_dict=True,
                                                                               cpu_offload=True,
                                                                               ignore_frozen_params=True))
    names = {n for n, p in backend.policy.named_parameters() if p.requires_grad}  # (a tied frozen head shows up too)
    return {"params": {n: v for n, v in full_state.items() if n in names}, "stats": stats}


def main() -> None:
    import json

    from rlvr.distributed import World

    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(1)
    results = [case(**c) for c in cases]
    if World.from_env().is_main:
        torch.save({"cases": results, "world": World.from_env().size}, out)


if __name__ == "__main__":
    main()
