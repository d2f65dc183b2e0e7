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
