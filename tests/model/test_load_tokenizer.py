"""`load_tokenizer`: what a remote backend (Tinker) needs locally — the tokenizer and every EOS id — without
reading any weights."""

from rlvr.model.pretrained import Pretrained
from rlvr.model.tiny import TinyLlama


def tiny() -> TinyLlama:
    return TinyLlama(alphabet="0123456789+=", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                     max_positions=16, dtype="float32", lora=None)


def test_tiny_tokenizer_and_eos():
    tokenizer, eos = tiny().load_tokenizer()
    assert eos == [tokenizer.eos_token_id] == [1] and tokenizer.encode("12+3", add_special_tokens=False)


def test_pretrained_reads_generation_config_eos_without_weights(tmp_path):
    model, tokenizer = tiny().load(seed=0)
    model.generation_config.eos_token_id = [1, 2]  # a chat model ends turns with a second id
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()  # no weights: load_tokenizer must not need them
    preset = Pretrained(name_or_path=str(tmp_path), revision=None, dtype="float32", attn_implementation=None, lora=None)
    loaded, eos = preset.load_tokenizer()
    assert eos == [1, 2] and loaded.encode("7=", add_special_tokens=False) == tokenizer.encode("7=",
                                                                                            add_special_tokens=False)
