import hydra
import torch
import transformers

from rlvr.data.maze import VOCABULARY, prompt
from rlvr.model.maze import MazeQwen2, build_maze_tokenizer
from tests.composing import compose_config


def test_tokenizer_round_trips_one_id_per_paper_token():
    tok = build_maze_tokenizer()
    text = prompt("#####/#S.G#/#####") + " RIGHT RIGHT DONE"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.split()) and tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text
    assert len(tok) == 3 + len(VOCABULARY) == 16


def test_the_papers_model_has_its_parameter_count_and_shape():
    model, _ = MazeQwen2(256, 1024, 4, 4, 2, 512, 1e6, 1e-6, "float32").load(0)
    n = sum(p.numel() for p in model.parameters())
    # embeddings 16 × 256 (tied) + 4 layers × (q 256² + k, v 256 × 128, o 256², their biases, MLP 3 × 256 × 1024,
    # two norms) + the final norm: 3.94M (the paper says "approximately 3M")
    assert n == 16 * 256 + 4 * (256 * 256 * 2 + 2 * 256 * 128 + 256 + 2 * 128 + 256 + 3 * 256 * 1024 + 2 * 256) + 256
    assert 3.9e6 < n < 4.0e6
    attn = model.model.layers[0].self_attn
    assert (attn.k_proj.out_features, model.config.num_key_value_heads, model.config.rms_norm_eps) == (128, 2, 1e-6)


def test_it_computes_what_qwen2_computes_on_the_same_weights():
    model, tok = MazeQwen2(64, 128, 2, 4, 2, 512, 1e6, 1e-6, "float32").load(3)
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("o_proj.bias")}
    assert all(torch.equal(v, torch.zeros_like(v)) for k, v in model.state_dict().items() if k.endswith("o_proj.bias"))
    qwen.load_state_dict(state)
    ids = torch.tensor([tok.encode(prompt("#######/#S#...#/#.#.###/#.....#/#.###.#/#.#..G#/#######"))])
    assert torch.allclose(model(ids).logits, qwen(ids).logits, atol=1e-5)


def test_a_saved_maze_model_reads_back_with_its_tokenizer(tmp_path):
    model, tok = MazeQwen2(64, 128, 2, 4, 2, 512, 1e6, 1e-6, "float32").load(0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    text = prompt("#####/#S.G#/#####")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path).encode(text) == tok.encode(text)


def test_the_presets_compose_with_the_task_full_fine_tuning_by_default():
    cfg = compose_config(["data=maze", "reward=maze", "model=maze_small"])
    small = hydra.utils.instantiate(cfg.model, _convert_="all")
    paper = hydra.utils.instantiate(compose_config(["model=maze"]).model, _convert_="all")
    assert (small.hidden_size, small.intermediate_size, small.num_layers, small.lora) == (128, 512, 4, None)
    assert (paper.hidden_size, paper.intermediate_size, paper.num_layers, paper.lora) == (256, 1024, 4, None)
    assert cfg.data.size == 17 and cfg.reward._target_ == "rlvr.reward.maze.MazeReward"
