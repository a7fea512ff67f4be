"""`backend=local`: gradients in this process with torch, LoRA through PEFT (or full fine-tuning).

Training rows are `prompt (left-padded) + completion (right-padded)`, the same layout the engine
decoded, so position ids match sampling. The log-probability of completion token t is read from the
logits at the position before it, divided by the rollouts' sampling temperature:

    new_lp = log_softmax(logits / max(T, 1e-7))[token]

the distribution the sampler drew from (see rlvr/types.py Rollouts). Optimizer: AdamW with the betas,
eps and weight decay of `conf/backend/local.yaml`; the learning rate is set by the trainer each step
(constant unless a schedule is configured there). `grad_clip_norm` > 0 clips the global gradient norm
(the predecessor had no clipping locally, spec §1.7); the pre-clip norm is always reported. One
optimizer update per step; micro-batches accumulate gradients with the token-share scaling of
spec §4.5, so `micro_batch_size` changes memory, not the objective.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from torch import Tensor, nn

from rlvr.algorithm.loss import PolicyLoss
from rlvr.model.lora import LoraSpec
from rlvr.types import TrainBatch


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class LocalBackend:
    def __init__(
        self,
        model: nn.Module,
        lora: LoraSpec | None,
        lora_seed: int,
        pad_id: int,
        device: str,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
        micro_batch_size: int,
    ) -> None:
        self.device = resolve_device(device)
        model = model.to(self.device)
        if lora is not None:
            torch.manual_seed(lora_seed)  # LoRA A matrices are drawn at wrap time
            config = LoraConfig(
                task_type="CAUSAL_LM", r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
            )
            model = get_peft_model(model, config)
        self._policy = model
        self.pad_id = pad_id
        self.grad_clip_norm = grad_clip_norm
        self.micro_batch_size = micro_batch_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, betas=tuple(betas), eps=eps, weight_decay=weight_decay)

    @property
    def policy(self) -> nn.Module:
        return self._policy

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.params)

    def train_step(self, batch: TrainBatch, loss: PolicyLoss, lr: float) -> dict[str, float]:
        t0 = time.perf_counter()
        ro = batch.rollouts
        ids, attn, P_len = self._rows(ro.prompt_ids_P, ro.group_size, ro.tokens_PG_T, ro.mask_PG_T)
        action = (batch.adv_PG_T != 0) & ro.mask_PG_T
        total = max(int(action.sum()), 1)
        N = ids.shape[0]
        mb = self.micro_batch_size or N
        self._policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clipped": 0.0, "abs_kl": 0.0, "ratio_max": 0.0}
        for s in range(0, N, mb):
            rows = slice(s, s + mb)
            new_lp = self.completion_logprobs(ids[rows], attn[rows], P_len, ro.tokens_PG_T[rows], ro.temperature)
            old_lp = ro.logprobs_PG_T[rows].to(self.device)
            adv = batch.adv_PG_T[rows].to(self.device)
            m = action[rows].to(self.device)
            tok_loss, clipped = loss.token_losses(new_lp, old_lp, adv)
            mb_loss = (tok_loss * m).sum() / total
            mb_loss.backward()
            with torch.no_grad():
                delta = (new_lp - old_lp)[m]
                sums["loss"] += float(mb_loss)
                sums["clipped"] += float(clipped[m].sum())
                sums["abs_kl"] += float(delta.abs().sum())
                if delta.numel():
                    sums["ratio_max"] = max(sums["ratio_max"], float(delta.max().exp()))
        max_norm = self.grad_clip_norm if self.grad_clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            "loss": sums["loss"],
            "clip_fraction": sums["clipped"] / total,
            "policy/abs_kl": sums["abs_kl"] / total,
            "policy/ratio_max": sums["ratio_max"],
            "grad_norm": grad_norm,
            "lr": lr,
            "rl/optimizer_nonzero_advantage_action_tokens": float(int(action.sum())),
            "local_train_wall_s": time.perf_counter() - t0,
        }

    def _rows(self, prompt_ids_P: list[list[int]], G: int, tokens_PG_T: Tensor, mask_PG_T: Tensor):
        """input ids [N, Lp+T] (prompts left-padded to Lp), attention mask, and Lp."""
        Lp = max(len(p) for p in prompt_ids_P)
        N = len(prompt_ids_P) * G
        prompt = torch.full((N, Lp), self.pad_id, dtype=torch.long)
        prompt_attn = torch.zeros((N, Lp), dtype=torch.long)
        for i, p in enumerate(prompt_ids_P):
            prompt[i * G : (i + 1) * G, Lp - len(p) :] = torch.tensor(p)
            prompt_attn[i * G : (i + 1) * G, Lp - len(p) :] = 1
        ids = torch.cat([prompt, tokens_PG_T], 1).to(self.device)
        attn = torch.cat([prompt_attn, mask_PG_T.long()], 1).to(self.device)
        return ids, attn, Lp

    def completion_logprobs(self, ids: Tensor, attn: Tensor, Lp: int, tokens_PG_T: Tensor, temperature: float):
        """[n, T] log-probabilities of the completion tokens under the temperature-scaled policy."""
        T = tokens_PG_T.shape[1]
        position = (attn.cumsum(-1) - 1).clamp(min=0)
        # logits at positions Lp−1 … Lp+T−2 predict completion tokens 0 … T−1
        logits = self._policy(input_ids=ids, attention_mask=attn, position_ids=position, logits_to_keep=T + 1).logits
        logp = torch.log_softmax(logits[:, :-1].float() / max(temperature, 1e-7), dim=-1)
        return logp.gather(-1, tokens_PG_T.to(self.device)[..., None]).squeeze(-1)

    def save(self, path: Path) -> None:
        """`save_pretrained` of the adapter (adapter_model.safetensors) or of the full model
        (model.safetensors), plus the optimizer state."""
        path.mkdir(parents=True, exist_ok=True)
        self._policy.save_pretrained(path)
        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")
