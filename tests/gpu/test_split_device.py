"""The shuffle's bookkeeping per segment on the GPU: the receiver's segments made with CuPy (as
for a thousand partitions) list the same rows as those made with NumPy (the CPU tests check
NumPy's against the rows)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_gpudirect.shuffle import split

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_device_segments_equal_host_segments(monkeypatch, interleaved):
    rng = np.random.default_rng(5)
    outputs = range(3, 40)
    senders = [tuple(range(w, 60, 2)) if interleaved else tuple(range(30 * w, 30 * w + 30))
               for w in range(2)]  # fmt: skip
    pieces = []
    for inputs in senders:
        for chunk in (inputs[:10], inputs[10:]):
            counts = rng.integers(0, 4, (len(chunk), len(outputs)))
            counts[:, 5] = 0  # an output no row of this chunk goes to
            pieces.append((chunk, outputs.start, counts))
    pieces.sort(key=lambda piece: piece[0][0])
    host, host_sizes = split.assembly_segments(pieces, outputs, "host")
    monkeypatch.setattr(split, "DEVICE_SEGMENTS", 0)  # this table is small: made on the GPU
    device, device_sizes = split.assembly_segments(pieces, outputs, "device")
    assert device_sizes.tolist() == host_sizes.tolist()
    assert device.starts.get().tolist() == host.starts.tolist()
    assert device.lengths.get().tolist() == host.lengths.tolist()
    assert device.positions("device").get().tolist() == host.positions("host").tolist()
