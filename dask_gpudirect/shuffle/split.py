"""How partitions are cut into pieces by destination, and how pieces become output partitions.

Both run on the worker that holds the data, on the data's own device: cuDF and CuPy objects
stay on the GPU, pandas and NumPy on the host. The same code serves both; the one thing that
differs (where random permutations are made) comes from the target module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from dask.dataframe.dispatch import group_split_dispatch
from dask.dataframe.methods import concat
from dask.dataframe.shuffle import partitioning_index

from .. import targets


@dataclasses.dataclass(frozen=True)
class HashSplit:
    """Output partition ``j`` gets the rows whose hash of ``on`` modulo ``npartitions`` is ``j``.

    The hash is Dask's own (``partitioning_index``), so the result matches ``df.shuffle(on)``'s
    assignment of rows to partitions for the same backend.
    """

    on: list[str]
    npartitions: int
    meta: Any  # an empty partition: what an output partition with no rows looks like

    def split(self, index: int, part) -> dict[int, Any]:
        where = partitioning_index(part[self.on], self.npartitions)
        pieces = group_split_dispatch(part, where, self.npartitions, ignore_index=False)
        return {j: piece for j, piece in pieces.items() if len(piece)}

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

    def split(self, index: int, chunk) -> dict[int, Any]:
        shuffled = chunk[self._permutation(len(chunk), 0, index)]
        bounds = np.concatenate([[0], np.cumsum(self.counts[index])])
        return {
            j: shuffled[bounds[j] : bounds[j + 1]]
            for j in range(len(bounds) - 1)
            if bounds[j + 1] > bounds[j]
        }

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
