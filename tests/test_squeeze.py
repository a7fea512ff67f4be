"""LoRA-Squeeze (rlvr/squeeze.py): the variance table, the recommended rank, the compressed adapter
(its update is the truncated SVD of the original's; PEFT loads it) and `rlvr squeeze`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

from rlvr.cli.main import main
from rlvr.model.tiny import TinyLlama
from rlvr.squeeze import (
    LoraLayer,
    SqueezeError,
    analyze_adapter,
    analyze_layers,
    compress_adapter,
    compressed_config,
    default_target_ranks,
    find_adapter,
    retained_variance,
)
from rlvr.types import LoraSpec

ROOT = Path(__file__).resolve().parents[1]


def layer_with_spectrum(singular_values: list[float], r: int, out: int = 24, inp: int = 20, seed: int = 0,
                        name: str = "m") -> LoraLayer:
    """lora_B (out × r) and lora_A (r × in), both dense, with B·A = U·diag(s)·Vᵀ exactly: B = U·diag(s)·X and
    A = X⁺·Vᵀ for a random k × r matrix X (X·X⁺ = I_k), so the true rank is k = len(s) inside r."""
    g = torch.Generator().manual_seed(seed)
    k = len(singular_values)
    U, _ = torch.linalg.qr(torch.randn(out, k, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(inp, k, generator=g, dtype=torch.float64))
    X = torch.randn(k, r, generator=g, dtype=torch.float64)
    lora_B = U * torch.tensor(singular_values, dtype=torch.float64) @ X
    lora_A = torch.linalg.pinv(X) @ V.T
    return LoraLayer(name, lora_A.float(), lora_B.float(), (f"{name}.lora_A.weight", f"{name}.lora_B.weight"))


def test_retained_variance_arithmetic():
    # s = [3, 2, 1] → s² = [9, 4, 1], Σ = 14 → V(1) = 9/14, V(2) = 13/14, V(3) = V(8) = 1
    s = torch.tensor([3.0, 2.0, 1.0])
    assert [retained_variance(s, k) for k in (1, 2, 3, 8)] == pytest.approx([9 / 14, 13 / 14, 1.0, 1.0])
    assert retained_variance(torch.zeros(4), 1) == 1.0  # a layer that never moved loses nothing


def test_default_target_ranks_are_powers_of_two_below_r_then_r():
    assert default_target_ranks(16) == [1, 2, 4, 8, 16]
    assert default_target_ranks(12) == [1, 2, 4, 8, 12]
    assert default_target_ranks(1) == [1]


def test_a_true_rank_k_adapter_is_recommended_rank_k():
    # two layers of true rank 3 inside r = 16, spectra [3, 2, 1] and [1, 1, 1]:
    #   V(1) = 9/14 and 1/3 → mean 0.488;  V(2) = 13/14 and 2/3 → mean 0.798;  V(3) = 1 and 1 → 1.0
    layers = [layer_with_spectrum([3, 2, 1], 16, seed=1, name="a"), layer_with_spectrum([1, 1, 1], 16, seed=2,
                                                                                        name="b")]
    report = analyze_layers(layers, 0.95, target_ranks=list(range(1, 17)))
    assert report.recommended_rank == 3 and report.every_layer_rank == 3
    assert report.mean_variance[:3] == pytest.approx([(9 / 14 + 1 / 3) / 2, (13 / 14 + 2 / 3) / 2, 1.0], abs=1e-6)
    assert report.min_variance[1] == pytest.approx(2 / 3, abs=1e-6)
    assert report.max_variance[1] == pytest.approx(13 / 14, abs=1e-6)
    # retrain's default targets 1, 2, 4, 8, 16 skip 3: the smallest target with ≥ 95% is 4
    assert analyze_layers(layers, 0.95).recommended_rank == 4
    # a true rank-4 adapter with the default targets: exactly 4
    assert analyze_layers([layer_with_spectrum([4, 3, 2, 1], 16)], 0.95).recommended_rank == 4


def test_mean_rule_against_every_layer_rule():
    # spectra [1] (rank 1) and [1, 1] (rank 2): V(1) = 1 and 1/2 → mean 0.75 ≥ 0.7 → recommended 1 by the
    # retrain's mean rule, while every layer keeps ≥ 0.7 only from rank 2
    layers = [layer_with_spectrum([1], 4, seed=3, name="a"), layer_with_spectrum([1, 1], 4, seed=4, name="b")]
    report = analyze_layers(layers, 0.7)
    assert (report.recommended_rank, report.every_layer_rank) == (1, 2)


def test_zero_update_and_unreachable_threshold():
    zero = LoraLayer("z", torch.randn(8, 16), torch.zeros(12, 8), ("z.lora_A.weight", "z.lora_B.weight"))
    assert analyze_layers([zero], 0.95).recommended_rank == 1  # all V(k) = 1.0: a fresh adapter (B = 0)
    flat = layer_with_spectrum([1] * 8, 8)  # V(4) = 0.5: no target below r reaches 0.95 → the source rank
    assert analyze_layers([flat], 0.95).recommended_rank == 8
    with pytest.raises(SqueezeError, match="threshold=1.5"):
        analyze_layers([flat], 1.5)


def write_adapter(folder: Path, layers: list[LoraLayer], config: dict | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for layer in layers:
        tensors[layer.keys[0]], tensors[layer.keys[1]] = layer.lora_A.contiguous(), layer.lora_B.contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_compressed_update_is_the_truncated_svd_of_the_original(tmp_path):
    g = torch.Generator().manual_seed(0)
    layers = [
        LoraLayer(f"l{i}", 0.3 * torch.randn(8, 20, generator=g), 0.3 * torch.randn(24, 8, generator=g),
                  (f"l{i}.lora_A.weight", f"l{i}.lora_B.weight"))
        for i in range(3)
    ]
    src = write_adapter(tmp_path / "src", layers, {"r": 8, "lora_alpha": 16, "peft_type": "LORA"})
    config = compress_adapter(src, tmp_path / "out", 3)
    # alpha 16 at r 8 → scale 2; at k = 3: alpha' = 16·3/8 = 6 → scale 6/3 = 2, unchanged
    assert (config["r"], config["lora_alpha"]) == (3, 6)
    written = load_file(tmp_path / "out" / "adapter_model.safetensors")
    for layer in layers:
        lora_A, lora_B = written[layer.keys[0]], written[layer.keys[1]]
        assert lora_A.shape == (3, 20) and lora_B.shape == (24, 3)
        U, S, Vh = torch.linalg.svd(2.0 * layer.lora_B @ layer.lora_A)  # the full 24 × 20 update, directly
        truncated = U[:, :3] * S[:3] @ Vh[:3]
        torch.testing.assert_close(6 / 3 * lora_B @ lora_A, truncated, atol=1e-5, rtol=0)


def test_alpha_keeps_the_scale():
    # retrain: int(16·4/128) = int(0.5) = 0, a dead adapter; here 0.5 → scale 0.5/4 = 16/128
    assert compressed_config({"r": 128, "lora_alpha": 16}, 4)["lora_alpha"] == 0.5
    # rslora scale alpha/√r: 16/√64 = 2 → alpha' = 16·√(4/64) = 4, and 4/√4 = 2
    assert compressed_config({"r": 64, "lora_alpha": 16, "use_rslora": True}, 4)["lora_alpha"] == 4
    assert compressed_config(None, 4) == {"r": 4, "lora_alpha": 8}  # retrain's minimal config
    with pytest.raises(SqueezeError, match="rank_pattern"):
        compressed_config({"r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 4}}, 4)
    with pytest.raises(SqueezeError, match="DoRA"):
        compressed_config({"r": 8, "lora_alpha": 16, "use_dora": True}, 4)


TINY = TinyLlama(alphabet="0123456789+=", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                 max_positions=16, dtype="float32",
                 lora=LoraSpec(rank=8, alpha=16, dropout=0.0,
                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"]))
INPUT_IDS = torch.tensor([[3, 4, 13, 5, 6, 14], [7, 8, 13, 9, 10, 14]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT_IDS).logits


def peft_adapter(folder: Path, true_rank: int | None) -> dict[str, torch.Tensor]:
    """A tiny Llama + LoRA r = 8 with non-zero B (true rank `true_rank` per module when given), saved with
    `save_pretrained`; returns each module's update scale·B·A by module name."""
    model = get_peft_model(TINY.load(seed=0)[0], TINY.lora.to_peft())
    g = torch.Generator().manual_seed(1)
    updates = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            lora_A, lora_B = module.lora_A["default"].weight, module.lora_B["default"].weight
            new_B = 0.1 * torch.randn(lora_B.shape, generator=g)
            if true_rank is not None:
                new_B[:, true_rank:] = 0
            with torch.no_grad():
                lora_B.copy_(new_B)
            updates[name.removeprefix("base_model.model.")] = module.scaling["default"] * lora_B @ lora_A
    model.save_pretrained(folder)
    return {name: u.detach() for name, u in updates.items()}


def with_updates(updates: dict[str, torch.Tensor], rank: int | None):
    """The base model with each update (truncated to `rank` by a direct SVD) added to its weight."""
    model = TINY.load(seed=0)[0]
    for name, update in updates.items():
        if rank is not None:
            U, S, Vh = torch.linalg.svd(update.double())
            update = (U[:, :rank] * S[:rank] @ Vh[:rank]).float()
        with torch.no_grad():
            model.get_submodule(name).weight += update
    return model


def test_round_trip_through_peft_truncates_the_update(tmp_path):
    updates = peft_adapter(tmp_path / "src", true_rank=None)
    config = compress_adapter(tmp_path / "src", tmp_path / "out", 3)
    assert (config["r"], config["lora_alpha"]) == (3, 6)
    loaded = PeftModel.from_pretrained(TINY.load(seed=0)[0], tmp_path / "out")
    assert loaded.peft_config["default"].r == 3
    torch.testing.assert_close(logits(loaded), logits(with_updates(updates, rank=3)), atol=1e-5, rtol=0)
    assert not torch.allclose(logits(loaded), logits(with_updates(updates, rank=None)), atol=1e-3)


def test_round_trip_of_a_low_rank_adapter_keeps_its_outputs(tmp_path):
    peft_adapter(tmp_path / "src", true_rank=2)
    report = analyze_adapter(tmp_path / "src", 0.95)
    assert report.recommended_rank == 2 and report.num_layers == 2 * 7
    compress_adapter(tmp_path / "src", tmp_path / "out", 4)
    original = logits(PeftModel.from_pretrained(TINY.load(seed=0)[0], tmp_path / "src"))
    squeezed = logits(PeftModel.from_pretrained(TINY.load(seed=0)[0], tmp_path / "out"))
    torch.testing.assert_close(squeezed, original, atol=1e-5, rtol=0)


def test_find_adapter_accepts_run_folders_and_refuses_what_has_no_adapter(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4):
        write_adapter(run / "checkpoints" / f"step_{step}", [layer_with_spectrum([1], 4)], {"r": 4, "lora_alpha": 8})
        (run / "checkpoints" / f"step_{step}" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "latest").write_text("step_4\n")
    expected = run / "checkpoints" / "step_4" / "adapter_model.safetensors"
    assert find_adapter(run) == find_adapter(run / "checkpoints") == find_adapter(expected.parent) == expected
    (tmp_path / "tinker").mkdir()
    (tmp_path / "tinker" / "tinker_state.json").write_text(json.dumps({"sampler_path": "tinker://x/step_4"}))
    with pytest.raises(SqueezeError, match="Tinker checkpoint.*tinker://x/step_4"):
        find_adapter(tmp_path / "tinker")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model.safetensors").write_bytes(b"")
    with pytest.raises(SqueezeError, match="full weights"):
        find_adapter(tmp_path / "full")
    with pytest.raises(SqueezeError, match="no such file"):
        find_adapter(tmp_path / "missing")


def test_rlvr_squeeze_prints_the_table_and_writes_the_adapter(tmp_path, capsys):
    layers = [layer_with_spectrum([4, 3, 2, 1], 16, seed=i, name=f"m{i}") for i in range(2)]
    src = write_adapter(tmp_path / "src", layers, {"r": 16, "lora_alpha": 32})
    assert main(["squeeze", str(src), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Rank  Mean Var%   Min Var%   Max Var%" in out
    assert "     4     100.00     100.00     100.00  <--" in out
    assert "Recommended rank: 4 (>= 95% variance retained)" in out
    assert "wrote the rank-4 adapter (lora_alpha 8)" in out  # 32·4/16 = 8
    assert json.loads((tmp_path / "out" / "adapter_config.json").read_text())["r"] == 4

    assert main(["squeeze", str(src), "--ranks", "1-3", "--threshold", "0.9", "--json"]) == 0
    # s² = [16, 9, 4, 1], Σ = 30: V(1) = 16/30, V(2) = 25/30, V(3) = 29/30 ≥ 0.9
    report = json.loads(capsys.readouterr().out)
    assert report["recommended_rank"] == 3
    assert [row["mean"] for row in report["variance"]] == pytest.approx([16 / 30, 25 / 30, 29 / 30], abs=1e-6)


@pytest.mark.parametrize(("args", "message"), [
    (["--rank", "2"], "give --out DIR too"),
    (["--rank", "32", "--out", "OUT"], "rank=32 must be in [1, 16]"),
    (["--ranks", "a,b"], "--ranks 'a,b'"),
    (["--threshold", "0"], "threshold=0.0 must be in (0, 1]"),
])
def test_rlvr_squeeze_errors_name_the_problem(tmp_path, capsys, args, message):
    src = write_adapter(tmp_path / "src", [layer_with_spectrum([1], 16)], {"r": 16, "lora_alpha": 32})
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert main(["squeeze", str(src), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rlvr_help_still_imports_no_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlvr.cli.main", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "squeeze" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "safetensors", "peft", "transformers"}

