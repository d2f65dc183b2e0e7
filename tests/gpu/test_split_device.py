"""The shuffle's bookkeeping per segment on the GPU: the receiver's segments made with CuPy (as
for a thousand partitions) list the same rows as those made with NumPy (the CPU tests check
NumPy's against the rows)."""

from __future__ import annotations

import pytest
from util import received_pieces

from dask_gpudirect.shuffle import split

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_device_segments_equal_host_segments(monkeypatch, interleaved):
    outputs = range(3, 40)
    pieces = received_pieces(outputs, inputs=60, interleaved=interleaved, seed=5)
    host, host_sizes = split.assembly_segments(pieces, outputs, "host")
    monkeypatch.setattr(split, "DEVICE_SEGMENTS", 0)  # this table is small: made on the GPU
    device, device_sizes = split.assembly_segments(pieces, outputs, "device")
    assert device_sizes.tolist() == host_sizes.tolist()
    assert device.starts.get().tolist() == host.starts.tolist()
    assert device.lengths.get().tolist() == host.lengths.tolist()
    assert device.positions("device").get().tolist() == host.positions("host").tolist()
