"""`engine=mlx`: sampling in this process with Apple's MLX (`mlx` + `mlx-lm`; Metal on an Apple GPU, its CPU
back end on Linux through `mlx[cpu]`), from the trained policy's weights, synced in memory.

Start-up: the policy's base weights W0 (after the SFT warm-up) are written once to a folder under `workdir`
(`save_base`) and loaded with `mlx_lm.utils.load_model`, which picks mlx-lm's implementation of the model's
architecture from its config.json (Llama for the tiny model, Qwen2/Qwen3 for the presets); the folder is deleted
once loaded. Under LoRA every linear layer the PEFT adapter wraps is replaced by mlx-lm's `LoRALinear` (its rank
and the adapter's own scaling, alpha / r or alpha / √r under rsLoRA), then the adapter is synced.

`sync(policy)` moves the weights in memory (0 bytes written to files):
  LoRA: each PEFT pair (A: r × in, B: out × r) becomes `LoRALinear`'s (lora_a = Aᵀ, lora_b = Bᵀ); W0 stays.
      Measured on the tiny model (2 layers, 7 targets each): ~1 ms a sync on the 2-core CPU (README's table).
  full fine-tuning: every tensor `save_full` would write (a tied LM head once), through the model's own
      `sanitize` and `load_weights(strict=True)`, so a sync that leaves one of MLX's parameters out is refused.
Tensors go torch → NumPy → MLX (one copy each; bfloat16 through float32, NumPy having no bfloat16).

Sampling: prompt p's G rows are decoded together (its prompt repeated G times: one batch, no padding), with
mlx-lm's KV cache (`make_prompt_cache`), until every row has emitted one of the trainer's `eos_ids` or
`max_tokens` are out. Draws come from an explicit MLX key made from the group's seed and split at each step
(`mx.random.key`, `mx.random.split`), never from MLX's global generator: a group's draws depend on (its seed,
the weights) alone, and the same seeds give the same rollouts. Row p·G + g is row g of prompt p's batch.

Log-probabilities: the temperature is applied here. mlx-lm's `generate_step` yields log_softmax(logits), the
T = 1 distribution, whatever the sampler's temperature; this engine computes log_softmax(logits / T) in float32
from the model's logits and returns the sampled token's entry: rlvr's contract (temperature-scaled, before
top-p), at any T and top_p, with no refusal. top_p < 1 truncates the temperature-scaled distribution before
the draw (mlx-lm's `apply_top_p`, applied after the temperature as vLLM and transformers do; mlx-lm's own sampler
applies it before), and the returned log-probability is still the one before truncation. T = 0 is greedy
(the argmax, log-probability 0, the T → 0 limit).

Entropy is not given (its `needs` do not provide `entropy`); nothing is moved for overlapped sampling (MLX
evaluates its graphs in its own C++ threads).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlvr.engine.policy_files import is_lora, save_base
from rlvr.engine.rows import rollouts_from_rows
from rlvr.engine.vllm_weights import named_weights
from rlvr.errors import ConfigError
from rlvr.lazy import lazy_import
from rlvr.protocols import Finding, Needs
from rlvr.requirements import ChildProbe, Package, pip_extra
from rlvr.seeds import group_seeds
from rlvr.types import Rollouts, SamplingParams

np = lazy_import("numpy")

if TYPE_CHECKING:
    from peft import PeftModel
    from torch import Tensor, nn

MLX_PACKAGES = (Package("mlx", f"{pip_extra('mlx')} (on Linux it installs mlx[cpu])", ("mlx",)),
                Package("mlx_lm", pip_extra("mlx"), ("mlx-lm",)))
"""On the import path: checked by every engine=mlx run at start."""
MLX_IMPORT_TIMEOUT_S = 60.0
DTYPES = (None, "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class MLXBuild:
    """`import mlx.core` works and names the device it computes on (a Linux `mlx` without `mlx-cpu` installs but
    cannot load its library): checked by `rlvr doctor` in a child process."""

    item: str = "mlx build"
    at_start: bool = False

    def check(self) -> Finding:
        if any(p.check().status != "ok" for p in MLX_PACKAGES):
            return Finding("missing", f"not checked: mlx and mlx-lm are not both installed ({pip_extra('mlx')})")
        code = "import mlx.core as mx, mlx_lm; print(mx.__version__, mx.default_device())"
        found = ChildProbe("mlx", code, None, MLX_IMPORT_TIMEOUT_S).check()
        if found.status != "ok":
            return Finding("missing", f"mlx is installed but {found.detail} (on Linux: pip install 'mlx[cpu]')")
        return Finding("ok", f"mlx {found.detail}")


class MLXEngine:
    """Samples with an in-process MLX copy of the policy (module docstring)."""

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs(requires={"local_policy": "it loads the policy's weights into MLX and is given each step's"},
                     machine=(*MLX_PACKAGES, MLXBuild()))

    def __init__(self, policy: nn.Module, eos_ids: list[int], pad_id: int, workdir: str | None,
                 dtype: str | None) -> None:
        if dtype not in DTYPES:
            raise ConfigError(f"invalid config:\n  engine.dtype={dtype!r} must be one of {list(DTYPES)} (null: the "
                              "policy's own)")
        import mlx.core as mx
        from mlx_lm.utils import load_model

        self.eos_ids, self.pad_id = list(eos_ids), pad_id
        self.lora = is_lora(policy)
        self.policy = policy
        own = str(next(policy.parameters()).dtype).removeprefix("torch.")
        self.dtype = getattr(mx, dtype or own)
        if workdir is not None:
            Path(workdir).mkdir(parents=True, exist_ok=True)
        root = workdir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
        folder = Path(tempfile.mkdtemp(prefix="rlvr-mlx-", dir=root))
        try:
            self.model, self.config = load_model(save_base(policy, folder / "base"), strict=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.model.set_dtype(self.dtype)
        self.lora_layers: dict[str, Any] = {}
        """MLX module path → its LoRALinear, under LoRA."""
        if self.lora:
            self._attach_lora(policy)
        self.last_sync_s = 0.0
        self.sync(policy)

    # ---- weights --------------------------------------------------------------------------------------------

    def _attach_lora(self, policy: nn.Module) -> None:
        """Replace each linear layer the PEFT adapter wraps with mlx-lm's LoRALinear of its rank and scaling."""
        from mlx.utils import tree_unflatten
        from mlx_lm.tuner.lora import LoRALinear

        modules = dict(self.model.named_modules())
        replaced = []
        for path, layer in lora_layers(policy).items():
            linear = modules.get(path)
            if linear is None or type(linear).__name__ != "Linear":
                raise ConfigError(f"engine=mlx: the adapter wraps {path!r}, which mlx-lm's "
                                  f"{type(self.model).__module__} has no plain Linear layer at")
            rank = int(layer.r["default"])
            lora = LoRALinear.from_base(linear, r=rank, dropout=0.0, scale=float(layer.scaling["default"]))
            replaced.append((path, lora))
            self.lora_layers[path] = lora
        self.model.update_modules(tree_unflatten(replaced))
        self.model.eval()

    def connect(self) -> None:
        """Nothing to reach: the engine is ready once built."""

    def sync(self, policy: nn.Module) -> int:
        """Load `policy`'s adapter (LoRA) or full weights into the MLX model, in memory; returns 0 (no file)."""
        import mlx.core as mx

        if is_lora(policy) != self.lora:
            raise ValueError("engine=mlx: the policy switched between LoRA and full fine-tuning")
        t0 = time.perf_counter()
        self.policy = policy
        if self.lora:
            layers = lora_layers(policy)
            if layers.keys() != self.lora_layers.keys():
                changed = sorted(layers.keys() ^ self.lora_layers.keys())
                raise ValueError(f"engine=mlx: the adapter's layers changed ({changed})")
            for path, layer in layers.items():
                target = self.lora_layers[path]
                target.lora_a = self._array(layer.lora_A["default"].weight.T)
                target.lora_b = self._array(layer.lora_B["default"].weight.T)
                target.scale = float(layer.scaling["default"])
            mx.eval([(t.lora_a, t.lora_b) for t in self.lora_layers.values()])
        else:
            weights = {name: self._array(t) for name, t in named_weights(policy)}
            if hasattr(self.model, "sanitize"):
                weights = self.model.sanitize(weights)
            self.model.load_weights(list(weights.items()), strict=True)
            mx.eval(self.model.parameters())
        self.last_sync_s = time.perf_counter() - t0
        return 0

    def _array(self, tensor: Tensor):
        """A torch tensor as an MLX array of the engine's dtype (a copy)."""
        import mlx.core as mx

        host = tensor.detach().to("cpu")
        if str(host.dtype) not in ("torch.float32", "torch.float64"):
            host = host.float()
        return mx.array(host.numpy()).astype(self.dtype)

    def sleep(self) -> None:
        """Nothing to give back to the trainer: MLX's memory is host memory (unified memory on Apple)."""

    def sample_beside_training(self, beside: bool) -> None:
        """Nothing to move: MLX computes in its own threads."""

    def close(self) -> None:
        """Drop the MLX model."""
        self.__dict__.pop("model", None)
        self.lora_layers = {}

    # ---- sampling -------------------------------------------------------------------------------------------

    def sample(
        self,
        prompt_ids_P: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seeds: Sequence[int],
        with_entropy: bool = False,
    ) -> Rollouts:
        if with_entropy:
            raise ValueError("engine=mlx does not give full-distribution entropy")
        seeds = group_seeds(seeds, len(prompt_ids_P))
        rows = []
        for p, prompt in enumerate(prompt_ids_P):
            rows += self._sample_group(prompt, group_size, params, seeds[p])
        return rollouts_from_rows(prompt_ids_P, group_size, rows, self.pad_id, self.eos_ids, params.temperature)

    def _sample_group(self, prompt: list[int], G: int, params: SamplingParams,
                      seed: int) -> list[tuple[list[int], list[float]]]:
        """G completions of one prompt, decoded together: [(token ids, log-probabilities)], each ending at its
        first EOS id or after max_tokens."""
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import apply_top_p

        if not prompt:
            raise ValueError("engine=mlx: an empty prompt (MLX needs at least one token to start from)")
        greedy = params.temperature == 0
        key = mx.random.key(seed % 2**64)
        cache = make_prompt_cache(self.model)
        inputs = mx.array([list(prompt)] * G)
        eos = mx.array(self.eos_ids) if self.eos_ids else None
        tokens, logprobs = [], []
        done = mx.zeros((G,), dtype=mx.bool_)
        for _ in range(params.max_tokens):
            logits = self.model(inputs, cache=cache)[:, -1, :].astype(mx.float32)
            if greedy:
                token = mx.argmax(logits, axis=-1)
                logprob = mx.zeros((G,), dtype=mx.float32)
            else:
                scaled = logits / params.temperature
                scaled = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
                key, draw = mx.random.split(key)
                pool = apply_top_p(scaled, params.top_p) if params.top_p < 1 else scaled
                token = mx.random.categorical(pool, axis=-1, key=draw)
                logprob = mx.take_along_axis(scaled, token[:, None], axis=-1)[:, 0]
            if eos is not None:
                done = done | (token[:, None] == eos[None, :]).any(axis=-1)
            mx.eval(token, logprob, done)
            tokens.append(token)
            logprobs.append(logprob)
            if bool(done.all()):
                break
            inputs = token[:, None]
        ids_T_G = np.array(mx.stack(tokens)).T.tolist() if tokens else [[] for _ in range(G)]
        lps_T_G = np.array(mx.stack(logprobs)).T.tolist() if tokens else [[] for _ in range(G)]
        return [cut_at_eos(ids, lps, self.eos_ids) for ids, lps in zip(ids_T_G, lps_T_G)]


def cut_at_eos(ids: list[int], logprobs: list[float], eos_ids: list[int]) -> tuple[list[int], list[float]]:
    """The row up to and including its first EOS id (all of it when there is none)."""
    end = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), len(ids))
    return ids[:end], logprobs[:end]


def lora_layers(policy: nn.Module) -> dict[str, Any]:
    """PEFT's LoRA layers of a policy by their path in the Hugging Face model (as MLX names the same layers):
    `base_model.model.model.layers.0.self_attn.q_proj` → `model.layers.0.self_attn.q_proj`."""
    inner = cast("PeftModel", policy).get_base_model()
    found = {name: m for name, m in inner.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    if not found:
        raise ValueError("engine=mlx: the LoRA policy has no LoRA layer named 'default'")
    return found


def measure(repeats: int = 20) -> dict[str, float]:
    """The README's figures on the tiny model (conf/model/tiny.yaml's LoRA): a LoRA sync's and a full-weight sync's
    median seconds, and the largest |Δ| between the engine's log-probabilities and the policy's own."""
    import statistics

    import torch

    from rlvr.backend.local import LocalBackend
    from rlvr.engine.sync_check import local_logprobs
    from rlvr.model.tiny import TinyLlama
    from rlvr.seeds import prompt_seeds
    from rlvr.types import LoraSpec

    spec = LoraSpec(8, 16, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    figures: dict[str, float] = {}
    for name, lora in (("lora", spec), ("full", None)):
        model, tok = TinyLlama("0123456789+=", 128, 512, 2, 4, 32, "float32", None).load(0)
        policy = LocalBackend(model, lora, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False).policy
        engine = MLXEngine(policy, [tok.eos_token_id], tok.pad_token_id, None, None)
        times = []
        for _ in range(repeats):
            engine.sync(policy)
            times.append(engine.last_sync_s)
        figures[f"{name}_sync_ms"] = 1000 * statistics.median(times)
        if lora:  # a trained-looking adapter: B is zero at init
            with torch.no_grad():
                for key, p in policy.named_parameters():
                    if "lora_B" in key:
                        p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
            engine.sync(policy)
        prompts = [[4, 5, 13, 6], [3, 14]]
        ro = engine.sample(prompts, 4, SamplingParams(0.7, 1.0, 8), prompt_seeds(0, 2))
        for row in range(ro.tokens_PG_T.shape[0]):
            n = int(ro.mask_PG_T[row].sum())
            with torch.no_grad():
                _, own = local_logprobs(policy, [prompts[row // 4]], [ro.tokens_PG_T[row, :n].tolist()], 0.7)
            gap = float((own - ro.logprobs_PG_T[row, :n]).abs().max()) if n else 0.0
            figures[f"{name}_max_gap"] = max(figures.get(f"{name}_max_gap", 0.0), gap)
    return figures


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key}: {value:.3g}")
