"""Which examples a training step sees: a pure function of (seed, step), so a resumed or relaunched
run sees exactly the prompts it would have seen.

Position k of the stream (k = step·batch_size + i) is example `perm_e[k mod N]` of epoch e = k // N,
where `perm_e` is a permutation drawn from `random.Random(f"{seed}:{e}")`: every example is seen once
per epoch, and each epoch has its own order. The predecessor walked the examples round-robin in source
order with no shuffle, i.e. MATH subject by subject; a seeded shuffle avoids training on one subject at a time, and
`data.shuffle: false` keeps the old order for a like-for-like replication.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from rlvr.protocols import DataSource, Needs
from rlvr.types import Demonstration, Example


@lru_cache(maxsize=8)
def _epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


def batch_indices(step: int, size: int, n: int, seed: int, shuffle: bool = True) -> list[int]:
    """Indices into a list of n examples for training step `step` with `size` prompts per step.
    `shuffle=False` is the predecessor's order: the source's own order, round-robin (`data.shuffle`)."""
    if n <= 0:
        raise ValueError("cannot draw a batch from an empty dataset")
    out = []
    for k in range(step * size, (step + 1) * size):
        epoch, offset = divmod(k, n)
        out.append(_epoch_order(n, seed, epoch)[offset] if shuffle else offset)
    return out


class ExampleList:
    """The DataSource methods of a source that has read its examples into lists: `_train` drawn by
    `batch_indices` under the source's `seed` and `shuffle`, `_eval` held out, `_demos` the warm-up's
    demonstrations (none unless the source read a `data.demonstrations_path`)."""

    seed: int
    shuffle: bool
    _train: list[Example]
    _eval: list[Example]
    _demos: list[Demonstration] = []

    @classmethod
    def needs(cls, settings: Mapping[str, Any]) -> Needs:
        return Needs()

    def batch(self, step: int, size: int) -> list[Example]:
        return [self._train[i] for i in batch_indices(step, size, len(self._train), self.seed, self.shuffle)]

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def demonstrations(self) -> list[Demonstration]:
        return list(self._demos)


def prompts_at(data: DataSource, step: int, position: int, size: int) -> list[Example]:
    """The `size` training examples at positions position, position+1, … of the data stream, so a run whose
    batch size changes (back pressure) still sees every example once per epoch, in order. While every step
    had `size` prompts (position = step·size) this is `data.batch(step, size)`, the source's own call;
    otherwise position k is `data.batch(k, 1)`, which is position k for every source that orders by
    `rlvr.data.order.batch_indices` (all built-in ones): k = step·size + i with size 1."""
    if position == step * size:
        return data.batch(step, size)
    return [data.batch(k, 1)[0] for k in range(position, position + size)]
