"""Which examples a training step sees: a pure function of (seed, step), so a resumed or relaunched
run sees exactly the prompts it would have seen.

Position k of the stream (k = step·batch_size + i) is example `perm_e[k mod N]` of epoch e = k // N,
where `perm_e` is a permutation drawn from `random.Random(f"{seed}:{e}")`: every example is seen once
per epoch, and each epoch has its own order. The predecessor walked MATH subject by subject with no
shuffle (spec §1.3 step 5); a seeded shuffle avoids training on one subject at a time, and
`data.shuffle: false` keeps the old order for a like-for-like replication.
"""

from __future__ import annotations

import random
from functools import lru_cache

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
    `batch_indices` under the source's `seed` and `shuffle`, `_eval` held out, no demonstrations."""

    seed: int
    shuffle: bool
    _train: list[Example]
    _eval: list[Example]

    def batch(self, step: int, size: int) -> list[Example]:
        return [self._train[i] for i in batch_indices(step, size, len(self._train), self.seed, self.shuffle)]

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def demonstrations(self) -> list[Demonstration]:
        return []
