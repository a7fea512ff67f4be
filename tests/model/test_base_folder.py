"""`<run>/base/` (rlvr/model/base_folder.py): written whole, left alone when a resumed run has the same weights,
read back bit for bit, refused with a clear message when missing or changed; a pretrained model loaded
unchanged is a pointer, not a copy."""

import json

import pytest
import torch

from rlvr.model.base_folder import BaseFolderError, hub_commit, load_base, save_base
from rlvr.model.pretrained import Pretrained
from rlvr.model.tiny import TinyLlama

TINY = TinyLlama("0123456789+=", 64, 128, 1, 2, 32, "float32", None)
IDS = torch.tensor([[4, 5, 13, 6, 7, 14]])


def warmed(seed: int = 0):
    """A tiny model whose weights are not the preset's init (as after a warm-up)."""
    module, tokenizer = TINY.load(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.01)
    return module, tokenizer


def test_tiny_base_round_trips_bit_for_bit(tmp_path):
    module, tokenizer = warmed()
    save_base(tmp_path / "base", module, tokenizer, TINY, "key1")
    files = {p.name for p in (tmp_path / "base").iterdir()}
    assert {"base.json", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files
    record = json.loads((tmp_path / "base" / "base.json").read_text())
    assert record["weights"] == "model.safetensors" and len(record["sha256"]) == 64 and record["warmup_key"] == "key1"
    assert record["preset"]["class"] == "rlvr.model.tiny.TinyLlama" and record["attn_implementation"] == "eager"
    loaded, tok = load_base(tmp_path / "base")
    assert loaded.state_dict().keys() == module.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), module.state_dict().values()))
    assert torch.equal(loaded(IDS).logits, module.eval()(IDS).logits)
    assert tok.encode("12+3=", add_special_tokens=False) == tokenizer.encode("12+3=", add_special_tokens=False)
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 1, "left")
    assert loaded.generation_config.eos_token_id == 1 and loaded.generation_config.pad_token_id == 0
    assert not list(tmp_path.glob(".base*")), "no temporary folder left behind"


def test_same_weights_leave_the_folder_other_weights_replace_it(tmp_path):
    module, tokenizer = warmed()
    folder = save_base(tmp_path / "base", module, tokenizer, TINY, None)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns, (folder / "base.json").stat().st_ino
    save_base(folder, module, tokenizer, TINY, None)  # a resumed run without a warm-up: same bytes, kept
    assert ((folder / "model.safetensors").stat().st_mtime_ns, (folder / "base.json").stat().st_ino) == stamp
    save_base(folder, module, tokenizer, TINY, "key1")  # now with a key: rewritten once, with the key
    first = json.loads((folder / "base.json").read_text())
    assert first["warmup_key"] == "key1"
    stamp = (folder / "base.json").stat().st_ino
    other, _ = warmed(seed=1)
    save_base(folder, other, tokenizer, TINY, "key1")  # same key and preset: trusted without rewriting
    assert (folder / "base.json").stat().st_ino == stamp
    save_base(folder, other, tokenizer, TINY, "key2")  # another warm-up: replaced
    second = json.loads((folder / "base.json").read_text())
    assert second["warmup_key"] == "key2" and second["sha256"] != first["sha256"]
    assert torch.equal(load_base(folder)[0].lm_head.weight, other.lm_head.weight)


def test_missing_or_changed_weights_are_refused(tmp_path):
    with pytest.raises(BaseFolderError, match="base does not exist"):
        load_base(tmp_path / "base")
    module, tokenizer = warmed()
    folder = save_base(tmp_path / "base", module, tokenizer, TINY, "key1")
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(BaseFolderError, match="sha256 .* != .* recorded in .*base.json"):
        load_base(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(BaseFolderError, match="model.safetensors is missing"):
        load_base(folder)
    (folder / "base.json").write_text("{")
    with pytest.raises(BaseFolderError, match="no readable base.json"):
        load_base(folder)


def test_a_pretrained_model_loaded_unchanged_is_a_pointer(tmp_path):
    module, tokenizer = TINY.load(0)
    module.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    preset = Pretrained(str(tmp_path / "model"), None, "float32", "eager", None)
    pretrained, tok = preset.load(0)
    folder = save_base(tmp_path / "run" / "base", pretrained, tok, preset, None)
    record = json.loads((folder / "base.json").read_text())
    assert record["weights"] == {"name_or_path": str(tmp_path / "model"), "revision": None, "commit": None}
    assert record["sha256"] is None and not (folder / "model.safetensors").exists()
    loaded, _ = load_base(folder)
    assert torch.equal(loaded(IDS).logits, pretrained.eval()(IDS).logits)
    (tmp_path / "model").rename(tmp_path / "moved")  # another machine: the pointed-to folder is not there
    with pytest.raises(BaseFolderError, match=f"points to the pretrained weights {tmp_path / 'model'}"):
        load_base(folder)
    # warmed up, the same preset stores its weights
    stored = save_base(tmp_path / "run2" / "base", pretrained, tok, preset, "key1")
    assert json.loads((stored / "base.json").read_text())["weights"] == "model.safetensors"


def test_hub_pointer_records_the_cached_commit(tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--org--tiny"
    module, tokenizer = TINY.load(0)
    module.config.save_pretrained(repo / "snapshots" / commit)  # config.json only: no weights in this cache
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert hub_commit("org/tiny", None) == commit and hub_commit("org/other", None) is None
    preset = Pretrained("org/tiny", None, "float32", None, None)
    folder = save_base(tmp_path / "base", module, tokenizer, preset, None)
    assert json.loads((folder / "base.json").read_text())["weights"] == {
        "name_or_path": "org/tiny", "revision": None, "commit": commit}
    with pytest.raises(BaseFolderError, match=f"points to the pretrained weights org/tiny at {commit}"):
        load_base(folder)  # the cache holds config.json alone: no weights to load here
