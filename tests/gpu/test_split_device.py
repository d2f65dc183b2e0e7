"""The shuffle's bookkeeping on the GPU against the host's NumPy (which the CPU tests check
against the rows): the split's group order, the segments' positions and the join's RangeIndex
labels, made with libcudf."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n", [1, 8, 300, 70_000])
@pytest.mark.parametrize("lengths", [[1000], [0, 5000, 3], [4096] * 64, [0]], ids=str)
def test_device_group_order_equals_host(n, lengths):
    """libcudf's group order (the stable order by output, and rows per input and output) is
    NumPy's, for one to more outputs than a 16-bit sort key holds, with empty inputs."""
    import cudf
    import dask_cudf  # noqa: F401  (cuDF's hash for partitioning_index)
    from dask.dataframe.shuffle import partitioning_index

    from dask_gpudirect.targets import device, host

    keys = np.random.default_rng(n).integers(0, 2**62, sum(lengths))
    where = partitioning_index(cudf.DataFrame({"key": keys}), n)
    order, counts = device.group_order(where, lengths, n)
    want_order, want_counts = host.group_order(where.to_numpy(), lengths, n)
    assert order.get().tolist() == want_order.tolist()
    assert counts.tolist() == want_counts.tolist()


def test_device_positions_equal_host():
    """The rows segments list, from NumPy or CuPy starts and lengths, empty segments among
    them, as NumPy lists them; no segments, no rows."""
    import cupy

    from dask_gpudirect.targets import device, host

    starts = np.array([40, 0, 7, 7, 100], dtype=np.int64)
    lengths = np.array([3, 0, 5, 2, 1], dtype=np.int64)
    want = host.positions(starts, lengths).tolist()
    assert want == [40, 41, 42, 7, 8, 9, 10, 11, 7, 8, 100]
    assert device.positions(starts, lengths).get().tolist() == want
    assert device.positions(cupy.asarray(starts), cupy.asarray(lengths)).get().tolist() == want
    assert device.positions(starts[:0], lengths[:0]).get().tolist() == []


def test_device_join_labels_range_indexes_as_pandas():
    """Frames with RangeIndexes of any start and step (an empty one among them) joined on the
    GPU keep each frame's labels, as pandas' concat does."""
    import cudf
    import pandas as pd

    from dask_gpudirect.targets import device

    frames = [
        pd.DataFrame({"x": np.arange(5.0)}, index=pd.RangeIndex(10, 15)),
        pd.DataFrame({"x": np.arange(0.0)}, index=pd.RangeIndex(3, 3)),
        pd.DataFrame({"x": np.arange(4.0)}, index=pd.RangeIndex(100, 92, -2)),
        pd.DataFrame({"x": np.arange(3.0)}, index=pd.RangeIndex(0, 9, 3)),
    ]
    joined = device.concat_frames(
        [cudf.from_pandas(f) for f in frames], cudf.from_pandas(frames[0].iloc[:0])
    )
    want = pd.concat(frames)
    assert joined.index.to_numpy().tolist() == want.index.tolist()
    assert joined["x"].to_numpy().tolist() == want["x"].tolist()


@pytest.mark.parametrize(
    "lengths", [[1], [1000], [0, 5, 1000, 1, 0, 300], [7] * 1500], ids=lambda v: str(v)[:30]
)
def test_device_permutations_shuffle_each_run_by_its_own_seed(lengths):
    """``dg.shuffle_array``'s permutations on the GPU: each run is a permutation of its own
    rows, the same seed gives the same order, and a run's order depends on its seed and length
    alone, not on the runs around it (so a chunk's order does not depend on which worker, or
    which other chunks, it was split with)."""
    from dask_gpudirect.targets import device

    lengths = np.array(lengths, dtype=np.int64)
    seeds = np.random.default_rng(0).integers(0, 2**63, len(lengths), dtype=np.uint64)
    got = device.permutations(lengths, seeds).get()
    starts = np.cumsum(lengths) - lengths
    runs = [got[s : s + n] - s for s, n in zip(starts, lengths, strict=True)]
    for run, n in zip(runs, lengths, strict=True):
        assert sorted(run.tolist()) == list(range(n))  # a permutation of the run's own rows
    np.testing.assert_array_equal(device.permutations(lengths, seeds).get(), got)
    big = int(np.argmax(lengths))
    alone = device.permutations(lengths[big : big + 1], seeds[big : big + 1]).get()
    np.testing.assert_array_equal(alone, runs[big])
    if lengths[big] >= 300:
        assert (runs[big] != np.arange(lengths[big])).mean() > 0.9
        other = device.permutations(lengths[big : big + 1], seeds[big : big + 1] + 1).get()
        assert (other != alone).mean() > 0.9


def test_device_permutations_are_uniform():
    """Where each of 8 rows lands, over 4000 seeds: every place equally often (a chi-square
    test at the 0.1 % level for each row, 7 degrees of freedom), as a random permutation puts
    it."""
    from dask_gpudirect.targets import device

    n, draws = 8, 4000
    lengths = np.full(draws, n, dtype=np.int64)  # one run a seed: all drawn in one call
    seeds = np.random.default_rng(1).integers(0, 2**63, draws, dtype=np.uint64)
    places = device.permutations(lengths, seeds).get().reshape(draws, n) % n
    for row in range(n):
        seen = np.bincount(np.argmax(places == row, axis=1), minlength=n)
        expected = draws / n
        assert ((seen - expected) ** 2 / expected).sum() < CHI2_7_AT_0_1_PERCENT, (row, seen)


#: The chi-square statistic with 7 degrees of freedom that chance exceeds 0.1 % of the time.
CHI2_7_AT_0_1_PERCENT = 24.32
