import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlvr.data.order import batch_indices


def test_same_seed_and_step_give_same_indices() -> None:
    assert batch_indices(3, 4, 10, seed=7) == batch_indices(3, 4, 10, seed=7)


@given(n=st.integers(1, 40), size=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_every_example_once_per_epoch(n: int, size: int, seed: int) -> None:
    # Concatenated batches are the stream k = 0, 1, ...; each window [e·n, (e+1)·n) is one epoch.
    steps = (3 * n) // size + 1
    stream = [i for step in range(steps) for i in batch_indices(step, size, n, seed)]
    for epoch in range(len(stream) // n):
        assert sorted(stream[epoch * n : (epoch + 1) * n]) == list(range(n))


def test_epochs_have_their_own_order() -> None:
    epoch_0, epoch_1 = batch_indices(0, 50, 50, seed=0), batch_indices(1, 50, 50, seed=0)
    assert sorted(epoch_0) == sorted(epoch_1) and epoch_0 != epoch_1


def test_different_seeds_give_different_orders() -> None:
    orders = {tuple(batch_indices(0, 50, 50, seed=s)) for s in range(5)}
    assert len(orders) == 5


def test_empty_dataset_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        batch_indices(0, 1, 0, seed=0)
