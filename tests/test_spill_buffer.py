"""The tiers a worker keeps received shuffle pieces in (``SpillBuffer``): fast memory, then
serialized in host memory, then files. The device target's three tiers take pandas pieces here
too (their serialization is Dask's, whatever the piece): every piece comes back equal, through
whichever tiers the limits sent it, each move a ledger record, and the files go at ``close``."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from dask.sizeof import sizeof

from dask_gpudirect.errors import ShuffleError
from dask_gpudirect.ledger import Ledger
from dask_gpudirect.shuffle.buffer import SpillBuffer


def pieces(n: int) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(n)
    return {
        f"p{i}": pd.DataFrame({"k": rng.integers(0, 1 << 40, 20_000), "s": [f"r{i}"] * 20_000})
        for i in range(n)
    }


def buffer(tmp_path, *, device: bool, fast: int, host: int, disk: int = 1 << 30, full=False):
    ledger = Ledger("worker", 10_000)
    spill = SpillBuffer(
        directory=str(tmp_path / "spill"),
        ledger=ledger,
        shuffle="s",
        device=device,
        fast_limit=fast,
        host_limit=host,
        disk_limit=disk,
        host_full=lambda: full,
    )
    return spill, ledger


def spilled(ledger: Ledger) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in ledger.records():
        out[r["path"]] = out.get(r["path"], 0) + r["bytes"]
    return out


@pytest.mark.parametrize(
    ("fast", "host", "paths"),
    [
        (1 << 30, 1 << 30, set()),  # all fit the first tier
        (1, 1 << 30, {"device-to-host"}),  # every piece serialized into host memory
        (1, 1, {"device-to-host", "host-to-disk"}),  # and on to disk
        (1 << 20, 1 << 20, {"device-to-host", "host-to-disk"}),  # some in each tier
    ],
)
def test_three_tiers_give_every_piece_back(tmp_path, fast, host, paths):
    given = pieces(8)
    spill, ledger = buffer(tmp_path, device=True, fast=fast, host=host)
    for key, piece in given.items():
        spill.update({key: piece})
    assert set(spilled(ledger)) == paths
    for key in reversed(list(given)):  # back out of every tier, the last written first
        pd.testing.assert_frame_equal(spill.pop(key), given[key])
    spill.close()
    assert not os.path.exists(tmp_path / "spill")


def test_host_tier_goes_to_disk_when_the_process_is_past_its_threshold(tmp_path):
    given = pieces(4)
    spill, ledger = buffer(tmp_path, device=True, fast=1, host=1 << 30, full=True)
    for key, piece in given.items():
        spill.update({key: piece})
    moved = spilled(ledger)
    assert moved["host-to-disk"] >= 0.9 * moved["device-to-host"]  # all of it, serialized
    for key, piece in given.items():
        pd.testing.assert_frame_equal(spill.pop(key), piece)


def test_host_target_spills_straight_to_disk_within_its_limit(tmp_path):
    given = pieces(4)
    spill, ledger = buffer(tmp_path, device=False, fast=1 << 30, host=1)
    spill.update(given)
    assert set(spilled(ledger)) == {"host-to-disk"}
    for key, piece in given.items():
        pd.testing.assert_frame_equal(spill.pop(key), piece)
    small, _ = buffer(tmp_path / "small", device=False, fast=1, host=1, disk=1000)
    with pytest.raises(ShuffleError, match="would pass the disk limit of 1000 bytes"):
        small.update({"p0": given["p0"]})


@pytest.mark.parametrize("device", [False, True])
def test_pieces_taken_back_are_not_spilled_again(tmp_path, device):
    """A spilled piece taken back is read from disk where it lies: zict moved it back into
    memory first, spilling other pieces to make room (written again, and counted against the
    disk limit again), and the limit counted every byte ever written rather than those on
    disk. A shuffle that never had its limit's bytes on disk failed."""
    given = pieces(16)
    room = 4 * sizeof(given["p0"])  # about four pieces in memory
    probe, _ = buffer(tmp_path / "probe", device=device, fast=1, host=room)
    probe.update(given)
    on_disk = sum(f.stat().st_size for f in (tmp_path / "probe" / "spill").iterdir())
    spill, ledger = buffer(tmp_path, device=device, fast=1, host=room, disk=int(on_disk * 1.05))
    spill.update(given)
    written = spilled(ledger)["host-to-disk"]
    assert written >= 0.9 * on_disk  # most pieces on disk, within 5 % of the limit
    for key, piece in given.items():
        pd.testing.assert_frame_equal(spill.pop(key), piece)
    assert spilled(ledger)["host-to-disk"] == written  # nothing written twice
    spill.close()


def test_a_closed_buffer_refuses_pieces_and_leaves_no_files(tmp_path):
    """A piece that arrives as its run ends (its store thread late) is refused, not written."""
    spill, _ = buffer(tmp_path, device=False, fast=1, host=1)
    spill.close()
    with pytest.raises(ShuffleError, match="shuffle s has ended here"):
        spill.update(pieces(1))
    assert not os.path.exists(tmp_path / "spill")
