"""The Qwen3.5 and Gemma 4 presets (conf/model/qwen3_5_0_8b.yaml, gemma4_e2b.yaml) on tiny random checkpoints of
those architectures, built here from the installed transformers' own config classes and saved as the published
checkpoints are: the multimodal class (a vision tower beside the language model) with a tokenizer. The preset is
composed as `model=<preset> model.name_or_path=<that folder>` and read offline: LoRA on the language model alone
(rlvr/model/lora.py TextOnlyLora), a few steps of the local backend with engine=pytorch under LoRA and under full
fine-tuning, and the checkpoint back through `open_checkpoint` and `rlvr export`."""

import json
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from composing import CONF_DIR, FAST, MIXED, compose_config
from rlvr.cli.from_checkpoint import open_checkpoint
from rlvr.cli.main import main
from rlvr.model.lora import TextOnlyLora
from rlvr.model.tiny import build_char_tokenizer
from rlvr.run import run
from rlvr.types import LoraSpec

ALPHABET = "0123456789+="
PRESETS = {"qwen3_5": "qwen3_5_0_8b", "gemma4": "gemma4_e2b"}
HUB_IDS = {"qwen3_5": "Qwen/Qwen3.5-0.8B", "gemma4": "google/gemma-4-E2B-it"}

def text_config(tokenizer, **extra) -> dict:
    """A 2-layer language model of 32 hidden units over the character tokenizer's vocabulary."""
    return dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **extra)


def checkpoint(family: str, folder: Path, tie_in_text_config: bool = True) -> Path:
    """A tiny random checkpoint of `family` (its multimodal class, seeded) and the character tokenizer, saved with
    save_pretrained into `folder`."""
    import transformers

    tokenizer = build_char_tokenizer(ALPHABET)
    if family == "qwen3_5":  # one linear-attention (Gated DeltaNet) layer, one full-attention layer
        text = text_config(tokenizer, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                           linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                           linear_conv_kernel_dim=4, **({"tie_word_embeddings": True} if tie_in_text_config else {}))
        config = transformers.Qwen3_5Config(
            text_config=text, tie_word_embeddings=True,
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32))
        cls = transformers.Qwen3_5ForConditionalGeneration
    else:  # one sliding-window layer, one global one; a vision tower, no audio tower
        text = text_config(tokenizer, layer_types=["sliding_attention", "full_attention"], global_head_dim=16,
                           vocab_size_per_layer_input=len(tokenizer), hidden_size_per_layer_input=8, sliding_window=16)
        config = transformers.Gemma4Config(
            text_config=text, audio_config=None,
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, head_dim=16, position_embedding_size=64))
        cls = transformers.Gemma4ForConditionalGeneration
    torch.manual_seed(0)
    cls(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def preset(family: str, folder: Path, *overrides: str):
    """The family's model preset as `train.py model=… model.name_or_path=folder` composes it, on a CPU's dtype."""
    cfg = compose_config([f"model={PRESETS[family]}", f"model.name_or_path={folder}", "model.dtype=float32",
                          "model.attn_implementation=eager", *overrides])
    return instantiate(cfg.model)


def linear_names(module: torch.nn.Module) -> set[str]:
    return {name for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def test_the_presets_name_the_smallest_checkpoints_with_lora_on_the_language_model():
    for family, name in PRESETS.items():
        model = instantiate(compose_config([f"model={name}"]).model)
        assert model.name_or_path == HUB_IDS[family] and model.dtype == "bfloat16"
        assert type(model.lora) is TextOnlyLora and (model.lora.rank, model.lora.alpha) == (32, 64)
        assert model.lora.target_modules[:7] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"]
        assert instantiate(compose_config([f"model={name}", "model.lora=null"]).model).lora is None
    qwen = instantiate(compose_config(["model=qwen3_5_0_8b"]).model)
    assert qwen.lora.target_modules[7:] == ["in_proj_qkv", "in_proj_z", "out_proj"]  # its linear-attention layers


@pytest.mark.parametrize("family", PRESETS)
def test_text_only_lora_adapts_the_language_models_projections_alone(family, tmp_path):
    import peft
    from safetensors.torch import load_file

    folder = checkpoint(family, tmp_path / family)
    model, tokenizer = preset(family, folder).load(seed=0)
    saved = load_file(folder / "model.safetensors")
    assert any(k.startswith(("model.visual.", "model.vision_tower.")) for k in saved)  # the checkpoint is multimodal
    # every weight the model has came from the checkpoint (Qwen3.5: its language model's, renamed)
    for name, weight in model.state_dict().items():
        stored = saved.get(name, saved.get(name.replace("model.", "model.language_model.", 1)))
        if stored is None and name == "lm_head.weight":  # tied: stored once, as the embedding
            stored = saved.get("model.language_model.embed_tokens.weight")
        assert stored is not None and torch.equal(weight, stored), name
    lora = preset(family, folder).lora
    suffixes = tuple(f".{s}" for s in lora.target_modules)
    decoder = "model.layers." if family == "qwen3_5" else "model.language_model.layers."
    expected = {n for n in linear_names(model) if n.startswith(decoder) and n.endswith(suffixes)}
    adapted = peft.get_peft_model(model, lora.to_peft())
    got = {n.removeprefix("base_model.model.").removesuffix(".lora_A")
           for n, m in adapted.named_modules() if n.endswith(".lora_A")}
    assert got == expected and len(got) == {"qwen3_5": 13, "gemma4": 14}[family]
    if family == "qwen3_5":  # transformers reads the text model alone out of the multimodal checkpoint
        assert type(model).__name__ == "Qwen3_5ForCausalLM"
        assert {"linear_attn.in_proj_qkv", "linear_attn.out_proj", "self_attn.q_proj"} <= {
            n.split(".", 3)[3] for n in got}
    else:  # the whole multimodal model: the vision tower's q_proj … down_proj are left alone
        assert type(model).__name__ == "Gemma4ForConditionalGeneration"
        assert [n for n, _ in model.named_modules() if "vision_tower" in n and n.endswith(suffixes)]
        assert not any("lora_" in n for n, _ in adapted.named_parameters() if "vision" in n)
        plain = LoraSpec(lora.rank, lora.alpha, lora.dropout, list(lora.target_modules))
        fresh, _ = preset(family, folder).load(seed=0)
        with pytest.raises(ValueError, match="is not supported"):  # suffixes alone reach the tower's wrappers
            peft.get_peft_model(fresh, plain.to_peft())


def test_a_text_only_load_that_leaves_weights_at_random_is_refused(tmp_path):
    """A Qwen3.5 checkpoint whose text config does not say its embeddings are tied: the text-only class would get a
    randomly initialised lm_head."""
    folder = checkpoint("qwen3_5", tmp_path / "untied", tie_in_text_config=False)
    with pytest.raises(ValueError, match=r"1 weight\(s\) of Qwen3_5ForCausalLM are not in the checkpoint and would "
                                         r"start at random \(lm_head.weight\)"):
        preset("qwen3_5", folder).load(seed=0)


def test_the_sync_check_probes_a_multimodal_model(tmp_path):
    from rlvr.engine.sync_check import probe_prompts

    model, tokenizer = preset("gemma4", checkpoint("gemma4", tmp_path / "gemma4")).load(seed=0)
    prompts = probe_prompts(model, [tokenizer.eos_token_id])
    assert len(prompts) == 2 and all(len(p) == 4 and max(p) < len(tokenizer) for p in prompts)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("family", ["qwen3_5", "gemma4"])
def test_a_few_steps_train_and_the_checkpoint_round_trips(family, lora, tmp_path, capsys):
    """Two steps of GRPO (local backend, engine=pytorch) from the tiny checkpoint, then the final checkpoint opened
    as `rlvr eval` opens it and exported: the export loads with from_pretrained and gives the checkpoint's logits."""
    from transformers import AutoModelForCausalLM

    folder = checkpoint(family, tmp_path / family)
    overrides = [*FAST, *MIXED, f"model={PRESETS[family]}", f"model.name_or_path={folder}", "model.dtype=float32",
                 "model.attn_implementation=eager", "trainer.max_steps=2", "trainer.batch_size=2",
                 "trainer.group_size=4", "data.eval_size=4",
                 *(["model.lora.rank=4", "model.lora.alpha=8", "trainer.lr=1e-2"] if lora else
                   ["model.lora=null", "trainer.lr=1e-3"])]
    summary = run(compose_config(overrides), tmp_path / "run")
    assert summary["steps"] == 2
    step = tmp_path / "run" / "checkpoints" / "step_2"
    base, _ = preset(family, folder).load(seed=0)
    if lora:
        adapter = json.loads((step / "adapter_config.json").read_text())
        assert adapter["target_modules"].startswith("(?:model\\.language_model|model)\\.layers\\.")
        assert summary["trainable_parameters"] == {"qwen3_5": 4032, "gemma4": 4096}[family]
    else:
        assert summary["trainable_parameters"] == sum(p.numel() for p in base.parameters())
    opened = open_checkpoint(tmp_path / "run", [], CONF_DIR)
    trained = dict(opened.backend.policy.named_parameters())
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")]) == 0
    assert ("LoRA r=4" if lora else "its full weights") in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    ids = torch.tensor([[4, 5, 13, 6, 7, 14], [3, 3, 13, 11, 10, 14]])
    with torch.no_grad():
        reference = opened.backend.policy.eval()(ids).logits
        assert torch.allclose(exported(ids).logits, reference, atol=1e-5)
        assert not torch.allclose(base(ids).logits, reference, atol=1e-5)  # the two steps changed the policy
    if family == "gemma4" and not lora:  # the vision tower got no gradient: as loaded
        tower = {n: p for n, p in trained.items() if "vision_tower" in n}
        assert tower and all(torch.equal(p, dict(base.named_parameters())[n]) for n, p in tower.items())
