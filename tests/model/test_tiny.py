import torch

from rlvr.model.pretrained import Pretrained
from rlvr.model.prompt_encoding import encode_prompts, eos_ids
from rlvr.model.tiny import TinyLlama, build_char_tokenizer
from rlvr.types import LoraSpec

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)


def test_char_tokenizer_round_trips_every_character():
    tok = build_char_tokenizer("0123456789+= \nab")
    text = "12+34= a\nb"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character, no BOS
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text


def test_unknown_characters_map_to_unk():
    tok = build_char_tokenizer("01")
    assert tok.encode("0x1", add_special_tokens=False) == [3, tok.unk_token_id, 4]


def test_same_seed_same_weights_other_seed_other_weights():
    a, _ = TINY.load(0)
    b, _ = TINY.load(0)
    c, _ = TINY.load(1)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_saved_tiny_model_loads_through_from_pretrained(tmp_path):
    model, tok = TINY.load(0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lora = LoraSpec(4, 8, 0.0, ["q_proj"])
    loaded, loaded_tok = Pretrained(str(tmp_path), None, "float32", "eager", lora).load(seed=123)
    ids = torch.tensor([encode_prompts(tok, ["12+34="])[0]])
    assert encode_prompts(loaded_tok, ["12+34="]) == encode_prompts(tok, ["12+34="])
    assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert eos_ids(loaded_tok, loaded.generation_config.eos_token_id) == [tok.eos_token_id]
