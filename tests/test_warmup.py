import pytest
import torch

from rlvr.data.arithmetic import Arithmetic
from rlvr.model.base_folder import BaseFolderError, save_base
from rlvr.model.tiny import TinyLlama
from rlvr.warmup import Warmup

TINY = TinyLlama("0123456789+=", 64, 128, 2, 2, 32, "float32", None)
DEMOS = Arithmetic(0, 2, 100, 0, 0.8).demonstrations()[:256]


def same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_warmup_lowers_the_loss_and_is_cached(tmp_path):
    warmup = Warmup(steps=30, batch_size=32, lr=3e-3, cache_dir=str(tmp_path / "cache"))
    key = warmup.cache_key(TINY, 0, DEMOS)
    rows = []
    model, tok = TINY.load(0)
    info = warmup.run(model, tok, DEMOS, 0, key, rows.append)
    assert info["loaded_from"] is None and len(rows) == 30 and info["key"] == key
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"] and rows[-1]["steps"] == 30
    # a second run with the same inputs loads the trained weights instead of training
    again, _ = TINY.load(0)
    rows2 = []
    info2 = warmup.run(again, tok, DEMOS, 0, key, rows2.append)
    assert info2["loaded_from"] == str(tmp_path / "cache" / key) and len(rows2) == 1
    assert same_weights(model, again)


def test_the_key_of_demonstrations_with_tools_follows_how_tool_turns_are_encoded(monkeypatch):
    """A change to how tool calls and results are encoded raises TOOL_TURNS_ENCODING: a warm-up cached under the old
    encoding is then not loaded. Demonstrations without tools keep their key."""
    import rlvr.warmup
    from rlvr.tools.harness import ToolPrompt, ToolTurn
    from rlvr.types import Demonstration

    w = Warmup(steps=30, batch_size=32, lr=3e-3, cache_dir=None)
    schema = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    tools = [Demonstration(ToolPrompt("2+3=", schema), '<tool_call>{"name": "add"}</tool_call>',
                           (ToolTurn("", ["5"]), "5"))]
    keys = {name: w.cache_key(TINY, 0, demos) for name, demos in (("tools", tools), ("plain", DEMOS))}
    monkeypatch.setattr(rlvr.warmup, "TOOL_TURNS_ENCODING", rlvr.warmup.TOOL_TURNS_ENCODING + 1)
    assert w.cache_key(TINY, 0, tools) != keys["tools"] and w.cache_key(TINY, 0, DEMOS) == keys["plain"]


def test_cache_key_changes_with_every_input_that_changes_the_result(monkeypatch):
    w = Warmup(steps=30, batch_size=32, lr=3e-3, cache_dir=None)
    base = w.cache_key(TINY, 0, DEMOS)
    assert base == w.cache_key(TINY, 0, DEMOS)
    assert base != w.cache_key(TINY, 1, DEMOS)
    assert base != w.cache_key(TINY, 0, DEMOS[:-1])
    assert base != Warmup(31, 32, 3e-3, None).cache_key(TINY, 0, DEMOS)
    assert base != w.cache_key(TinyLlama("0123456789+=", 64, 128, 3, 2, 32, "float32", None), 0, DEMOS)
    # not the cache folder, nor the evaluation size (it changes neither the demonstrations nor the training)
    assert base == Warmup(30, 32, 3e-3, "/elsewhere").cache_key(TINY, 0, DEMOS)
    quick = Arithmetic(0, 2, 200, 0, 0.8).demonstrations()[:256]
    assert base == w.cache_key(TINY, 0, quick)
    # the thread count: the default run's warm-up measured 0.392 initial accuracy on 1 thread, 0.385 on 2
    import rlvr.warmup  # its lazily imported torch holds its own reference to get_num_threads

    threads = torch.get_num_threads()
    monkeypatch.setattr(rlvr.warmup.torch, "get_num_threads", lambda: threads + 1)
    assert base != w.cache_key(TINY, 0, DEMOS)


def test_no_cache_dir_always_trains(tmp_path):
    w = Warmup(steps=2, batch_size=8, lr=1e-3, cache_dir=None)
    model, tok = TINY.load(0)
    assert w.run(model, tok, DEMOS, 0, "k", lambda r: None)["loaded_from"] is None
    assert w.run(model, tok, DEMOS, 0, "k", lambda r: None)["loaded_from"] is None


def test_a_run_folder_brings_its_warm_up_to_a_machine_without_the_cache(tmp_path):
    """Machine A trains the warm-up and keeps it in the run's base/; on machine B (another, empty cache) the
    resumed run loads it from base/ instead of recomputing, and fills B's cache."""
    warmup_a = Warmup(steps=5, batch_size=8, lr=3e-3, cache_dir=str(tmp_path / "cache_a"))
    key = warmup_a.cache_key(TINY, 0, DEMOS)
    trained, tok = TINY.load(0)
    warmup_a.run(trained, tok, DEMOS, 0, key, lambda r: None)
    base = save_base(tmp_path / "run" / "base", trained, tok, TINY, key)

    warmup_b = Warmup(steps=5, batch_size=8, lr=3e-3, cache_dir=str(tmp_path / "cache_b"))
    rows, loaded = [], TINY.load(0)[0]
    info = warmup_b.run(loaded, tok, DEMOS, 0, key, rows.append, base)
    assert info["loaded_from"] == str(base) and rows == [{"step": 5, "steps": 5, "loaded_from": str(base)}]
    assert same_weights(trained, loaded)
    assert (tmp_path / "cache_b" / key / "model.safetensors").is_file()
    # another key (other warm-up settings) does not take the folder's weights
    assert Warmup(6, 8, 3e-3, None).run(TINY.load(0)[0], tok, DEMOS, 0, "other", lambda r: None, base)[
        "loaded_from"] is None


def test_a_damaged_run_copy_is_refused(tmp_path):
    warmup = Warmup(steps=2, batch_size=8, lr=3e-3, cache_dir=None)
    model, tok = TINY.load(0)
    base = save_base(tmp_path / "base", model, tok, TINY, "k")
    weights = base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(BaseFolderError, match="sha256"):
        warmup.run(TINY.load(0)[0], tok, DEMOS, 0, "k", lambda r: None, base)


def test_a_multi_turn_demonstration_supervises_its_actions_only():
    from rlvr.types import Demonstration
    from rlvr.warmup import _Encoded

    _, tok = TINY.load(0)
    demo = Demonstration("=", "5", ("+", "7", "=", "6"))  # guess 5, "higher", guess 7, "lower", guess 6
    ids, labels, attn = _Encoded(tok, [demo]).batch([0], torch.device("cpu"))
    eos, enc = tok.eos_token_id, (lambda s: tok.encode(s, add_special_tokens=False))
    # "=" | 5 EOS | + | 7 EOS | = | 6 EOS : the prompt and the two observations are not supervised
    assert ids[0].tolist() == enc("=") + enc("5") + [eos] + enc("+") + enc("7") + [eos] + enc("=") + enc("6") + [eos]
    assert labels[0].tolist() == [-100] + enc("5") + [eos] + [-100] + enc("7") + [eos] + [-100] + enc("6") + [eos]
    assert attn.all()
    w = Warmup(steps=1, batch_size=1, lr=1e-3, cache_dir=None)
    assert w.cache_key(TINY, 0, [demo]) != w.cache_key(TINY, 0, [Demonstration("=", "5")])


def test_a_run_waits_for_another_training_the_same_warm_up_and_loads_it(tmp_path, monkeypatch):
    """Two runs of one key start together (a grid's cells of one seed, a distributed run's ranks): the first trains
    and fills the cache under the entry's lock; the second waits (its `on_wait` called meanwhile), then loads the
    first's weights, training nothing. A wait that raises (a stop signal) leaves the lock to the first."""
    import threading

    import rlvr.warmup

    monkeypatch.setattr(rlvr.warmup, "LOCK_POLL_S", 0.01)
    warmup = Warmup(steps=3, batch_size=8, lr=3e-3, cache_dir=str(tmp_path / "cache"))
    key = warmup.cache_key(TINY, 0, DEMOS)
    (first, tok), (second, _) = TINY.load(0), TINY.load(0)
    first_rows, second_rows, waits, infos = [], [], [], {}
    second_waiting, go_on = threading.Event(), threading.Event()
    second_run = threading.Thread(target=lambda: infos.setdefault("second", warmup.run(
        second, tok, DEMOS, 0, key, second_rows.append, on_wait=wait)))

    def first_step(row: dict) -> None:
        first_rows.append(row)
        if row["step"] == 0:  # the first run is training: the second starts now, and must wait
            second_run.start()
            assert go_on.wait(30)

    def wait() -> None:
        waits.append(1)
        second_waiting.set()
        go_on.wait(30)

    def stopped() -> None:
        raise RuntimeError("stopped while waiting")

    def stopping_run() -> None:
        second_waiting.wait(30)
        # a third run of the key, stopped while it waits, gives up without training or taking the lock
        with pytest.raises(RuntimeError, match="stopped while waiting"):
            warmup.run(TINY.load(0)[0], tok, DEMOS, 0, key, lambda r: pytest.fail("trained"), on_wait=stopped)
        go_on.set()

    stopper = threading.Thread(target=stopping_run)
    stopper.start()
    infos["first"] = warmup.run(first, tok, DEMOS, 0, key, first_step)
    stopper.join(30)
    second_run.join(30)
    assert infos["first"]["loaded_from"] is None and [r["step"] for r in first_rows] == [0, 1, 2]
    assert waits and infos["second"]["loaded_from"] == str(tmp_path / "cache" / key)
    assert second_rows == [{"step": 3, "steps": 3, "loaded_from": str(tmp_path / "cache" / key)}]
    assert same_weights(first, second)
