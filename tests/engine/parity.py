"""Engine ↔ trainer log-probability parity: what an engine returned for its sampled tokens against what the
trainer's own policy module gives them, so a policy that never reached the sampler (or a sampler that
reports another distribution) shows up as a large gap. Shared by the engine tests (vLLM, MLX, OpenAI-compatible,
SGLang), with the two stand-ins they move the policy by."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlvr.types import Rollouts


@torch.no_grad()
def policy_logprobs(policy: nn.Module, prompt: list[int], completion: list[int], temperature: float) -> Tensor:
    """log softmax(logits / T)[token] for each completion token: one un-cached, unpadded forward of
    prompt + completion (the distribution of the Rollouts contract: temperature-scaled, before top-p)."""
    was_training = policy.training
    policy.eval()
    try:
        logits = policy(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    finally:
        if was_training:
            policy.train()
    logp = torch.log_softmax(logits / max(temperature, 1e-7), -1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def max_logprob_gap(policy: nn.Module, rollouts: Rollouts) -> float:
    """max |engine logprob − policy logprob| over every real completion token of `rollouts`."""
    gap, G = 0.0, rollouts.group_size
    for row in range(rollouts.tokens_PG_T.shape[0]):
        n = int(rollouts.mask_PG_T[row].sum())
        if n == 0:
            continue
        expected = policy_logprobs(policy, rollouts.prompt_ids_P[row // G], rollouts.tokens_PG_T[row, :n].tolist(),
                                   rollouts.temperature)
        gap = max(gap, float((rollouts.logprobs_PG_T[row, :n] - expected).abs().max()))
    return gap


def trained_looking_adapter(policy: nn.Module, seed: int = 0) -> None:
    """Perturb every LoRA B (zero at init, which would hide an adapter that never reached the engine), seeded: the
    same adapter whichever tests ran before."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


def update(policy: nn.Module, names: str) -> None:
    """Stands in for an optimizer step: moves every trainable matrix whose name contains `names`."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if p.requires_grad and names in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
