"""data=repeat (rlvr/data/repeat.py): the long-tailed task of `bench.overlap --tasks long_tail`."""

import statistics

import pytest

from composing import compose_config
from rlvr.data.repeat import Repeat, prompt
from rlvr.labels import task_name

SETTINGS = dict(long_fraction=0.1, long_min=24, long_max=26, eval_size=200, split_seed=0, miscount_fraction=0.5)


def test_a_few_completions_are_ten_times_the_median():
    data = Repeat(seed=0, **SETTINGS)
    lengths = [len(e.reference) + 1 for step in range(50) for e in data.batch(step, 8)]  # + EOS
    # 1 or 2 copies (2 or 3 tokens) nine times in ten: the median is at most 3; the tail 25–27 tokens
    assert statistics.median(lengths) <= 3 and max(lengths) == 27
    assert 0.05 < sum(n >= 25 for n in lengths) / len(lengths) < 0.15
    assert all(e.reference == e.prompt[0] * int(e.prompt[2:4]) for e in data.batch(0, 64))


def test_the_held_out_set_is_every_seeds_and_the_order_each_seeds_own():
    one, two = Repeat(seed=1, **SETTINGS), Repeat(seed=2, **SETTINGS)
    assert one.eval_examples() == two.eval_examples() and len(one.eval_examples()) == 200
    assert one.batch(0, 8) != two.batch(0, 8) and one.batch(3, 8) == Repeat(seed=1, **SETTINGS).batch(3, 8)


def test_the_supervisor_miscounts_by_one_copy_half_the_time():
    demos = Repeat(seed=0, **SETTINGS).demonstrations()
    off = {d.prompt: [] for d in demos}
    for d in demos:
        off[d.prompt].append(len(d.completion) - int(d.prompt[2:4]))
    ones = [o for p, offs in off.items() if int(p[2:4]) == 1 for o in offs]
    more = [o for p, offs in off.items() if int(p[2:4]) > 1 for o in offs]
    assert set(ones) == {0} and set(more) == {-1, 0, 1}  # one copy is never miscounted (none would be empty)
    assert 0.45 < sum(o != 0 for o in more) / len(more) < 0.55
    assert demos[0].prompt == prompt(int(demos[0].prompt[0]), int(demos[0].prompt[2:4]))


@pytest.mark.parametrize("key, value, message", [
    ("long_fraction", 1.5, "data.long_fraction=1.5 must be in [0, 1]"),
    ("long_min", 2, "expected 3 <= long_min <= long_max <= 99"),
    ("eval_size", 0, "data.eval_size=0 must be at least 1"),
])
def test_bad_settings_name_their_key(key, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Repeat(seed=0, **{**SETTINGS, key: value})


def test_the_option_composes_and_names_its_task():
    cfg = compose_config(["data=repeat", "trainer.sampling.max_tokens=27", "trainer.eval_max_tokens=27"])
    assert task_name(cfg) == "repeat-exact-tiny" and cfg.data.long_fraction == 0.1
