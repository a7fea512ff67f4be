"""LoRA-Squeeze (retrain's): how much of a trained LoRA adapter's update each rank carries, the smallest rank
that keeps a given share of it, and the adapter re-factored at that rank.

For one adapted module PEFT stores `lora_A.weight` (r × in) and `lora_B.weight` (out × r); the update is
ΔW = scale · B·A (out × in), scale = lora_alpha / r (lora_alpha / √r with `use_rslora`). The out × in
product is never formed. In retrain's orientation A_s = lora_Aᵀ (in × r), B_s = lora_Bᵀ (r × out), with
reduced QR factorisations

    Q_A, R_A = qr(A_s)        Q_B, R_B = qr(B_sᵀ)        M = R_A · R_Bᵀ   (r × r)
    A_s · B_s = Q_A · M · Q_Bᵀ

so ΔW's singular values are scale · svd(M) (Q_A, Q_B have orthonormal columns). Cost per layer:
O((in + out)·r² + r³) instead of O(in·out·min(in, out)).

    V(k) = Σ_{i<min(k,r)} s_i² / Σ_i s_i²        (1.0 when every s_i = 0: a layer that never moved)

`mean_variance[k]` is the unweighted mean of V(k) over layers (modules sorted by name); the recommended rank
is the smallest target rank (ascending) with mean_variance ≥ threshold, else the source rank. Target ranks
default to the powers of two below the source rank, plus the source rank. `every_layer_rank` (not in
retrain, reported beside it) is the smallest target rank at which *every* layer keeps ≥ threshold.

Compression to rank k: U, S, Vh = svd(M); A'_s = Q_A·U_k·diag(√S_k), B'_s = diag(√S_k)·Vh_k·Q_Bᵀ, saved
in PEFT orientation (lora_A' = A'_sᵀ, lora_B' = B'_sᵀ), so B'·A' is the best rank-k approximation of B·A
(Eckart–Young). Layers whose M has fewer than k singular values (in or out < k) get zero-padded factors.

Deliberate deviations from retrain's squeeze (docs/predecessor.md#lora-squeeze):
* alpha: retrain writes `lora_alpha = int(alpha·k/r)`, which changes the scale when alpha·k/r is not a
  whole number and gives 0 (a dead adapter) when alpha·k < r (alpha 16, r 128, k 4). Here
  lora_alpha' = alpha·k/r exactly (alpha·√(k/r) with rslora), kept an int when it is whole, so the scale
  and hence scale·B'A' is exactly the truncated update. PEFT reads a float alpha as-is.
* Adapters with `rank_pattern`/`alpha_pattern` (per-module ranks or scales) or DoRA (its magnitude vector
  renormalises by ‖W + ΔW‖, so truncating ΔW is not a truncation of the output) are analysed but not
  compressed: `compress_adapter` refuses them with the reason.
* With no adapter_config.json the compressed config is retrain's minimal `{r: k, lora_alpha: 2k}`
  (the original scale is unknown then).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<embedding>embedding_)?(?P<side>[AB])(?:\.[^.]+)?(?:\.weight)?$")
"""`<module>.lora_A.weight` as PEFT saves it; also `<module>.lora_A.<adapter>.weight` (a raw state dict)
and `<module>.lora_embedding_A` (an adapted embedding: same B·A structure)."""


class SqueezeError(ValueError):
    """The adapter cannot be analysed or compressed as asked; the message says why and what to do."""


@dataclass(frozen=True)
class LoraLayer:
    module: str
    lora_A: torch.Tensor
    """r × in, as PEFT stores `lora_A.weight`."""
    lora_B: torch.Tensor
    """out × r, as PEFT stores `lora_B.weight`."""
    keys: tuple[str, str]
    """The safetensors keys of lora_A and lora_B."""

    @property
    def rank(self) -> int:
        return self.lora_A.shape[0]


@dataclass(frozen=True)
class Factors:
    """B·A = Q_B · Mᵀ · Q_Aᵀ with M = U·diag(S)·Vh (retrain's orientation, see the module docstring)."""

    q_A: torch.Tensor  # in × p
    q_B: torch.Tensor  # out × q
    U: torch.Tensor
    S: torch.Tensor  # descending, min(p, q) values
    Vh: torch.Tensor


def factorize(lora_A: torch.Tensor, lora_B: torch.Tensor, device: str = "cpu") -> Factors:
    """QR of A_s = lora_Aᵀ and of B_sᵀ = lora_B, then the SVD of the small core M = R_A·R_Bᵀ (float32)."""
    if lora_A.shape[0] != lora_B.shape[1]:
        raise SqueezeError(f"lora_A is {tuple(lora_A.shape)} and lora_B {tuple(lora_B.shape)}: ranks differ")
    a_s = lora_A.to(device=device, dtype=torch.float32).T
    b_s_t = lora_B.to(device=device, dtype=torch.float32)
    q_A, r_A = torch.linalg.qr(a_s)  # reduced: in × p, p × r
    q_B, r_B = torch.linalg.qr(b_s_t)  # reduced: out × q, q × r
    U, S, Vh = torch.linalg.svd(r_A @ r_B.T, full_matrices=False)
    return Factors(q_A, q_B, U, S, Vh)


def singular_values(lora_A: torch.Tensor, lora_B: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    """svd(M) values only, for the analysis: the QRs need not form Q (`mode="r"`, about half the cost)."""
    if lora_A.shape[0] != lora_B.shape[1]:
        raise SqueezeError(f"lora_A is {tuple(lora_A.shape)} and lora_B {tuple(lora_B.shape)}: ranks differ")
    r_A = torch.linalg.qr(lora_A.to(device=device, dtype=torch.float32).T, mode="r")[1]
    r_B = torch.linalg.qr(lora_B.to(device=device, dtype=torch.float32), mode="r")[1]
    return torch.linalg.svdvals(r_A @ r_B.T)


def retained_variance(s: torch.Tensor, rank: int) -> float:
    """V(k) = Σ_{i<k} s_i² / Σ s_i² for singular values `s` (descending); 1.0 for an all-zero update."""
    energy = s.double() ** 2
    total = float(energy.sum())
    return 1.0 if total == 0.0 else float(energy[:rank].sum()) / total


def truncate(layer: LoraLayer, rank: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(lora_A', lora_B') of rank `rank` with B'·A' the best rank-`rank` approximation of B·A, both float32."""
    f = factorize(layer.lora_A, layer.lora_B, device)
    keep = min(rank, f.S.numel())
    root = f.S[:keep].sqrt()
    a_s = f.q_A @ f.U[:, :keep] * root  # in × keep
    b_s = root[:, None] * f.Vh[:keep] @ f.q_B.T  # keep × out
    lora_A, lora_B = a_s.T, b_s.T
    if keep < rank:  # fewer singular values than asked for (in or out < rank): the extra directions are zero
        lora_A = torch.cat([lora_A, lora_A.new_zeros(rank - keep, lora_A.shape[1])])
        lora_B = torch.cat([lora_B, lora_B.new_zeros(lora_B.shape[0], rank - keep)], dim=1)
    return lora_A.contiguous().cpu(), lora_B.contiguous().cpu()


@dataclass(frozen=True)
class Adapter:
    path: Path
    """The safetensors file."""
    config: dict | None
    """adapter_config.json next to it, if any."""
    layers: list[LoraLayer]
    """Sorted by module name."""
    other: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors that are not LoRA factors (modules_to_save, DoRA magnitudes), kept as they are."""
    metadata: dict[str, str] | None = None

    @property
    def source_rank(self) -> int:
        return int(self.config["r"]) if self.config and "r" in self.config else self.layers[0].rank


def find_adapter(path: Path) -> Path:
    """The adapter_model.safetensors meant by `path`: the file itself, a folder holding it (what PEFT's
    `save_pretrained` and rlvr's `checkpoints/step_N/` contain), a run folder or its `checkpoints/` (then the
    checkpoint `latest` names, as `rlvr/checkpoint.py` reads it)."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise SqueezeError(f"{path}: no such file or folder")
    if (path / ADAPTER_WEIGHTS).is_file():
        return path / ADAPTER_WEIGHTS
    if (path / "tinker_state.json").is_file():
        remote = json.loads((path / "tinker_state.json").read_text()).get("sampler_path")
        raise SqueezeError(f"{path} is a Tinker checkpoint: the adapter lives on the service ({remote}); "
                           f"download it to a folder and squeeze that")
    if (path / "model.safetensors").is_file():
        raise SqueezeError(f"{path} holds full weights (model.lora=null): there is no LoRA adapter to squeeze")
    for checkpoints in (path / "checkpoints", path):
        if checkpoints.is_dir() and any(checkpoints.glob("step_*")):
            from rlvr.checkpoint import Checkpoints

            latest = Checkpoints(checkpoints, keep_last=0).latest()
            if latest is not None:
                return find_adapter(latest)
    raise SqueezeError(f"{path}: no {ADAPTER_WEIGHTS} here, nor a checkpoints/step_N/ holding one")


def load_adapter(path: Path) -> Adapter:
    weights = find_adapter(path)
    config_file = weights.parent / ADAPTER_CONFIG
    config = json.loads(config_file.read_text()) if config_file.is_file() else None
    pairs: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    other: dict[str, torch.Tensor] = {}
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata()
        for key in f.keys():
            m = LORA_KEY.match(key)
            if m:
                pairs.setdefault(m["module"], {})[m["side"]] = (key, f.get_tensor(key))
            else:
                other[key] = f.get_tensor(key)
    unpaired = sorted(module for module, sides in pairs.items() if len(sides) != 2)
    if unpaired:
        raise SqueezeError(f"{weights}: {len(unpaired)} modules have lora_A without lora_B or the reverse "
                           f"(first: {unpaired[0]})")
    if not pairs:
        raise SqueezeError(f"{weights}: no lora_A/lora_B tensors")
    layers = [
        LoraLayer(module, sides["A"][1], sides["B"][1], (sides["A"][0], sides["B"][0]))
        for module, sides in sorted(pairs.items())
    ]
    return Adapter(weights, config, layers, other, metadata)


def default_target_ranks(source_rank: int) -> list[int]:
    """1, 2, 4, … below the source rank, then the source rank (retrain's default targets)."""
    ranks, k = [], 1
    while k < source_rank:
        ranks.append(k)
        k *= 2
    return [*ranks, source_rank]


@dataclass(frozen=True)
class SqueezeReport:
    adapter: str
    source_rank: int
    num_layers: int
    threshold: float
    ranks: list[int]
    mean_variance: list[float]
    min_variance: list[float]
    max_variance: list[float]
    recommended_rank: int
    every_layer_rank: int
    """Smallest target rank at which every layer keeps ≥ threshold (the source rank if none does)."""

    def table(self) -> str:
        lines = [
            f"{self.adapter}: {self.num_layers} LoRA layers, rank {self.source_rank}",
            f"{'Rank':>6}  {'Mean Var%':>9}  {'Min Var%':>9}  {'Max Var%':>9}",
        ]
        for k, mean, low, high in zip(self.ranks, self.mean_variance, self.min_variance, self.max_variance,
                                      strict=True):
            mark = "  <--" if k == self.recommended_rank else ""
            lines.append(f"{k:>6}  {100 * mean:>9.2f}  {100 * low:>9.2f}  {100 * high:>9.2f}{mark}")
        lines.append(f"Recommended rank: {self.recommended_rank} (>= {100 * self.threshold:g}% variance retained)")
        lines.append(f"Every layer keeps >= {100 * self.threshold:g}% from rank {self.every_layer_rank}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "adapter": self.adapter, "source_rank": self.source_rank, "num_layers": self.num_layers,
            "threshold": self.threshold, "recommended_rank": self.recommended_rank,
            "every_layer_rank": self.every_layer_rank,
            "variance": [
                {"rank": k, "mean": mean, "min": low, "max": high}
                for k, mean, low, high in zip(self.ranks, self.mean_variance, self.min_variance, self.max_variance,
                                              strict=True)
            ],
        }


def analyze_layers(layers: list[LoraLayer], threshold: float = 0.95, target_ranks: list[int] | None = None,
                   source_rank: int | None = None, name: str = "", device: str = "cpu") -> SqueezeReport:
    if not 0 < threshold <= 1:
        raise SqueezeError(f"threshold={threshold} must be in (0, 1]")
    source = source_rank or layers[0].rank
    ranks = sorted(set(target_ranks)) if target_ranks else default_target_ranks(source)
    if ranks[0] < 1:
        raise SqueezeError(f"target ranks {ranks} must be >= 1")
    spectra = [singular_values(layer.lora_A, layer.lora_B, device) for layer in layers]
    variance_L_K = torch.tensor([[retained_variance(s, k) for k in ranks] for s in spectra], dtype=torch.float64)
    mean_K, min_K, max_K = variance_L_K.mean(0), variance_L_K.min(0).values, variance_L_K.max(0).values
    # comparisons get a 1e-9 slack: a layer of true rank k retains 1 - O(float32 eps) at rank k, not exactly 1
    ok_mean = [k for k, v in zip(ranks, mean_K.tolist(), strict=True) if v >= threshold - 1e-9]
    ok_all = [k for k, v in zip(ranks, min_K.tolist(), strict=True) if v >= threshold - 1e-9]
    return SqueezeReport(
        adapter=name, source_rank=source, num_layers=len(layers), threshold=threshold, ranks=ranks,
        mean_variance=mean_K.tolist(), min_variance=min_K.tolist(), max_variance=max_K.tolist(),
        recommended_rank=ok_mean[0] if ok_mean else source, every_layer_rank=ok_all[0] if ok_all else source,
    )


def analyze_adapter(path: Path | Adapter, threshold: float = 0.95, target_ranks: list[int] | None = None,
                    device: str = "cpu") -> SqueezeReport:
    adapter = path if isinstance(path, Adapter) else load_adapter(path)
    return analyze_layers(adapter.layers, threshold, target_ranks, adapter.source_rank, str(adapter.path.parent),
                          device)


def compressed_config(config: dict | None, rank: int) -> dict:
    """adapter_config.json at `rank` with the same scale (see the module docstring for the alpha rule)."""
    if config is None:
        return {"r": rank, "lora_alpha": 2 * rank}
    patterns = [k for k in ("rank_pattern", "alpha_pattern") if config.get(k)]
    if patterns:
        raise SqueezeError(f"adapter_config.json sets {' and '.join(patterns)} (per-module ranks or scales): "
                           "compressing such an adapter to one rank is not supported")
    if config.get("use_dora"):
        raise SqueezeError("a DoRA adapter (use_dora: true) renormalises by ‖W + ΔW‖, so a truncated ΔW is not "
                           "a truncated output: compressing it is not supported (the analysis is)")
    old_rank, alpha = int(config["r"]), config.get("lora_alpha", 8)
    factor = math.sqrt(rank / old_rank) if config.get("use_rslora") else rank / old_rank
    new_alpha = alpha * factor
    if abs(new_alpha - round(new_alpha)) < 1e-9:
        new_alpha = int(round(new_alpha))
    return {**config, "r": rank, "lora_alpha": new_alpha}


def compress_adapter(path: Path | Adapter, out: Path, rank: int, device: str = "cpu") -> dict:
    """Write `out/adapter_model.safetensors` + `out/adapter_config.json` at `rank` (≤ the source rank),
    loadable by `PeftModel.from_pretrained`; factors keep the source dtype. Returns the written config."""
    adapter = path if isinstance(path, Adapter) else load_adapter(path)
    largest = max(layer.rank for layer in adapter.layers)
    if not 1 <= rank <= largest:
        raise SqueezeError(f"rank={rank} must be in [1, {largest}] (the adapter's rank)")
    config = compressed_config(adapter.config, rank)
    out = Path(out)
    if out.resolve() == adapter.path.parent.resolve():
        raise SqueezeError(f"--out {out} is the adapter's own folder: write the compressed adapter elsewhere")
    tensors = dict(adapter.other)
    for layer in adapter.layers:
        lora_A, lora_B = truncate(layer, rank, device)
        tensors[layer.keys[0]] = lora_A.to(layer.lora_A.dtype)
        tensors[layer.keys[1]] = lora_B.to(layer.lora_B.dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata=adapter.metadata or {"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return config
