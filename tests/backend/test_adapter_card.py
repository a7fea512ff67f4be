"""A LoRA checkpoint carries no model card: PEFT's `save_pretrained` writes a README.md whose every section is
"[More Information Needed]"; backend=local's save removes it, and puts back a README.md the folder had."""

from rlvr.backend.local import LocalBackend, save_adapter
from rlvr.model.tiny import TinyLlama
from rlvr.types import LoraSpec

TINY = TinyLlama("0123456789+=", 32, 64, 1, 2, 16, "float32", None)
LORA = LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"])


def backend() -> LocalBackend:
    model, tok = TINY.load(0)
    return LocalBackend(model, LORA, 0, tok.pad_token_id, "cpu", (0.9, 0.95), 1e-8, 0.0, 0.0, 0, False)


def test_a_saved_adapter_has_no_placeholder_model_card(tmp_path):
    local = backend()
    local.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "local_state.json", "optimizer.pt"]
    local.policy.save_pretrained(tmp_path / "peft")  # what PEFT alone writes
    assert "[More Information Needed]" in (tmp_path / "peft" / "README.md").read_text()


def test_a_readme_the_folder_had_is_kept_as_it_was(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "README.md").write_text("# my adapter\n")
    save_adapter(backend().policy, folder)
    assert (folder / "README.md").read_text() == "# my adapter\n"  # PEFT had rewritten it: put back
    assert (folder / "adapter_model.safetensors").is_file()
