import torch

from rlvr.data.arithmetic import Arithmetic
from rlvr.model.tiny import TinyLlama
from rlvr.warmup import Warmup

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
DEMOS = Arithmetic(0, 2, 100, 0, 0.8).demonstrations()[:256]


def test_warmup_lowers_the_loss_and_is_cached(tmp_path):
    warmup = Warmup(steps=30, batch_size=32, lr=3e-3, cache_dir=str(tmp_path / "cache"))
    key = warmup.cache_key(TINY, 0, DEMOS)
    rows = []
    model, tok = TINY.load(0)
    info = warmup.run(model, tok, DEMOS, 0, key, rows.append)
    assert not info["cached"] and len(rows) == 30
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"]
    # a second run with the same inputs loads the trained weights instead of training
    again, _ = TINY.load(0)
    rows2 = []
    info2 = warmup.run(again, tok, DEMOS, 0, key, rows2.append)
    assert info2["cached"] and len(rows2) == 1
    for (n, p), q in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), n


def test_cache_key_changes_with_every_input():
    w = Warmup(steps=30, batch_size=32, lr=3e-3, cache_dir=None)
    base = w.cache_key(TINY, 0, DEMOS)
    assert base == w.cache_key(TINY, 0, DEMOS)
    assert base != w.cache_key(TINY, 1, DEMOS)
    assert base != w.cache_key(TINY, 0, DEMOS[:-1])
    assert base != Warmup(31, 32, 3e-3, None).cache_key(TINY, 0, DEMOS)
    assert base != w.cache_key(TinyLlama("0123456789+=", 64, 128, 3, 2, 32, "float32", None), 0, DEMOS)


def test_no_cache_dir_always_trains(tmp_path):
    w = Warmup(steps=2, batch_size=8, lr=1e-3, cache_dir=None)
    model, tok = TINY.load(0)
    assert not w.run(model, tok, DEMOS, 0, "k", lambda r: None)["cached"]
    assert not w.run(model, tok, DEMOS, 0, "k", lambda r: None)["cached"]
