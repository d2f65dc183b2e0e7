"""How a partition is ordered by destination, and how received rows become output partitions.

Both run on the worker that holds the data, on the data's own device: cuDF and CuPy objects
stay on the GPU, pandas and NumPy on the host. ``split`` reorders a partition so that the rows of
each output partition are contiguous (in output order) and says how many there are, so the rows
bound for one worker are a single slice: one message of a few large buffers per destination
instead of a small buffer per output partition (UCX pays a fixed cost per buffer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from dask.dataframe.dispatch import concat
from dask.dataframe.shuffle import partitioning_index

from .. import targets


@dataclasses.dataclass(frozen=True)
class HashSplit:
    """Output partition ``j`` gets the rows whose hash of ``on`` modulo ``npartitions`` is ``j``.

    The hash is Dask's own (``partitioning_index``, dispatched to pandas or cuDF), so a user can
    tell which partition holds a key with the same function.
    """

    on: list
    npartitions: int
    target: str
    meta: Any  # an empty partition: what an output partition with no rows looks like

    def split(self, index: int, part) -> tuple[Any, np.ndarray]:
        where = partitioning_index(part[self.on], self.npartitions)
        order, counts = targets.module(self.target).group_order(where, self.npartitions)
        return part.take(order), counts

    def rows(self, part, start: int, stop: int):
        return part.iloc[start:stop]

    def combine(self, j: int, pieces: list) -> Any:
        return concat(pieces) if pieces else self.meta


@dataclasses.dataclass(frozen=True)
class PermutationSplit:
    """A uniform random permutation of records (axis 0) across all chunks.

    ``counts[i, j]`` records of input chunk ``i`` go to output chunk ``j``; drawn on the client
    as a random contingency table with the chunk sizes as margins (what a uniformly random
    permutation of all records induces). Each input chunk is permuted before it is cut, and each
    output chunk after its pieces are joined, so every order of the records is equally likely.
    """

    seed: int
    counts: np.ndarray
    target: str
    meta: Any

    def split(self, index: int, chunk) -> tuple[Any, np.ndarray]:
        return chunk[self._permutation(len(chunk), 0, index)], self.counts[index]

    def rows(self, chunk, start: int, stop: int):
        return chunk[start:stop]

    def combine(self, j: int, pieces: list) -> Any:
        if not pieces:
            return self.meta
        joined = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        return joined[self._permutation(len(joined), 1, j)]

    def _permutation(self, n: int, phase: int, index: int):
        seed = np.random.SeedSequence(self.seed, spawn_key=(phase, index)).generate_state(
            1, np.uint64
        )[0]
        return targets.module(self.target).permutation(n, int(seed))


def contingency(seed: int, sizes: list[int]) -> np.ndarray:
    """How many records of each input chunk go to each output chunk (same sizes both ways)."""
    rng = np.random.default_rng(seed)
    remaining = np.array(sizes, dtype=np.int64)
    counts = np.zeros((len(sizes), len(sizes)), dtype=np.int64)
    for i, n in enumerate(sizes):
        counts[i] = rng.multivariate_hypergeometric(remaining, n)
        remaining -= counts[i]
    return counts
