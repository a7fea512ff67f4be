import pytest

from rlvr.data.arithmetic import Arithmetic, carryless_sum


def task(seed=0, **kw):
    args = dict(seed=seed, digits=2, eval_size=1000, split_seed=0, carryless_fraction=0.8) | kw
    return Arithmetic(**args)


def test_carryless_sum():
    # 47+38: units (7+8) mod 10 = 5, tens (4+3) mod 10 = 7 → 75 (the true sum is 85)
    assert carryless_sum(47, 38, 2) == 75
    assert carryless_sum(99, 99, 2) == 88
    assert carryless_sum(12, 34, 2) == 46  # no carry: same as the sum


def test_prompts_and_references():
    ex = task().batch(0, 5)
    for e in ex:
        a, b = e.prompt[:-1].split("+")
        assert len(e.prompt) == 6 and e.prompt.endswith("=")
        assert e.reference == str(int(a) + int(b))


def test_held_out_is_disjoint_and_seed_independent():
    t0, t1 = task(seed=0), task(seed=1)
    held = {e.prompt for e in t0.eval_examples()}
    assert held == {e.prompt for e in t1.eval_examples()} and len(held) == 1000
    train = {e.prompt for step in range(1125) for e in t0.batch(step, 8)}  # 9,000 = one epoch
    assert len(train) == 9000 and not (train & held)


def test_training_order_depends_on_the_seed_only():
    assert task(seed=0).batch(7, 8) == task(seed=0).batch(7, 8)
    assert task(seed=0).batch(7, 8) != task(seed=1).batch(7, 8)


def test_demonstrations_are_noisy_at_the_configured_rate():
    demos = task().demonstrations()
    wrong = sum(int(d.completion) != sum(map(int, d.prompt[:-1].split("+"))) for d in demos)
    carries = sum(
        carryless_sum(*map(int, d.prompt[:-1].split("+")), 2) != sum(map(int, d.prompt[:-1].split("+")))
        for d in demos
    )
    # only problems with a carry can be labelled wrongly; about 80% of those are
    assert wrong / carries == pytest.approx(0.8, abs=0.03)


@pytest.mark.parametrize(
    "kw,key", [(dict(eval_size=0), "data.eval_size"), (dict(carryless_fraction=2), "data.carryless")]
)
def test_bad_knobs_name_the_key(kw, key):
    with pytest.raises(ValueError, match=key):
        task(**kw)


def test_eval_size_changes_the_evaluation_only():
    """A quicker evaluation (campaign=smoke's 200 of the 1,000 held-out pairs) leaves the training pairs and the
    warm-up demonstrations as they are, so the warm-up cached for the default serves it."""
    full, quick = task(eval_size=1000), task(eval_size=200)
    assert quick.eval_examples() == full.eval_examples()[:200]
    assert quick.demonstrations() == full.demonstrations()
    assert quick.batch(3, 8) == full.batch(3, 8)


@pytest.mark.parametrize("kw, key", [({"eval_size": 1001}, "data.eval_size"), ({"held_out": 0}, "data.held_out"),
                                     ({"held_out": 10_000}, "data.held_out")])
def test_bad_split_sizes_name_the_key(kw, key):
    with pytest.raises(ValueError, match=key):
        task(**kw)
