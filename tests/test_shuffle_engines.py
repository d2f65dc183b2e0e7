"""``gpudirect.shuffle.engine``: which exchange moves a shuffle's pieces, and its errors.

On CPU only the ``distributed`` engine can run: asking for ``rapidsmpf`` (by argument or by
config) for pandas partitions is refused in the user's process, and the cluster keeps
working. The RapidsMPF engine itself runs in tests/gpu
(test_shuffle_device.py). The op ids that keep concurrent RapidsMPF shuffles apart are given
out by the real scheduler plugin here.
"""

from __future__ import annotations

from importlib.util import find_spec

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal
from util import partitions

import dask_gpudirect as dg
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.errors import InputError, ShuffleError
from dask_gpudirect.shuffle import engines


def _frame() -> dd.DataFrame:
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"k": rng.integers(0, 50, 1000), "v": np.arange(1000)})
    return dd.from_pandas(pdf, npartitions=4)


def test_rapidsmpf_on_pandas_partitions_is_a_clear_error(tcp):
    df = _frame()
    with pytest.raises(InputError, match="'rapidsmpf' shuffles cuDF partitions on GPU workers"):
        dg.shuffle(df, "k", client=tcp, engine="rapidsmpf")
    with dask.config.set({"gpudirect.shuffle.engine": "rapidsmpf"}):
        with pytest.raises(InputError, match="use engine='distributed' or 'auto'"):
            dg.shuffle(df, "k", client=tcp)
    assert len(partitions(tcp, dg.shuffle(df, "k", client=tcp))) == 4  # still usable


def test_unknown_engine_names_the_choices(tcp):
    with pytest.raises(InputError, match=r"unknown shuffle engine 'nccl': use 'auto', 'distri"):
        dg.shuffle(_frame(), "k", client=tcp, engine="nccl")
    with dask.config.set({"gpudirect.shuffle.engine": "nccl"}):  # the key named: no engine=
        with pytest.raises(InputError, match=r"'nccl' \(gpudirect.shuffle.engine\): use 'auto'"):
            dg.shuffle(_frame(), "k", client=tcp)


def test_auto_and_distributed_give_the_default_partitions(tcp):
    df = _frame()
    default = partitions(tcp, dg.shuffle(df, "k", npartitions=3, client=tcp))
    for engine in ("auto", "distributed"):
        got = partitions(tcp, dg.shuffle(df, "k", npartitions=3, client=tcp, engine=engine))
        for a, b in zip(got, default, strict=True):
            assert_frame_equal(a, b)


@pytest.mark.parametrize(
    ("target", "partitions", "keep_order"),
    [("host", 4, False), ("device", 4, True), ("device", 33, False), ("device", 4, False)],
)
def test_auto_keeps_the_package_exchange_unless_rapidsmpf_can_and_is_faster(
    target, partitions, keep_order
):
    """``auto`` never picks RapidsMPF for pandas, for rows that must keep their order, for more
    partitions than it was measured faster at, nor where it is not installed (the last case;
    tests/gpu shows it picked where it is)."""
    if (target, partitions, keep_order) == ("device", 4, False) and find_spec("rapidsmpf"):
        pytest.skip("RapidsMPF is installed: tests/gpu checks that auto picks it")
    meta = _frame()._meta
    assert engines.choose("auto", target, meta, True, partitions, keep_order) == ("distributed",)


def test_only_the_package_exchange_spills_to_disk():
    """A worker's share beyond its GPU room: RapidsMPF spills it to host memory, the package's
    exchange to host memory and disk; without spilling (what ``auto`` asks of RapidsMPF) only
    the GPU's room counts."""
    room = {"device": 100, "host": 50, "disk": 50}
    for engine in engines.ENGINES:
        assert engines.holds(engine, 100, room, spilling=False)
        assert not engines.holds(engine, 101, room, spilling=False)
    assert engines.holds("rapidsmpf", 150, room) and not engines.holds("rapidsmpf", 151, room)
    assert engines.holds("distributed", 200, room) and not engines.holds("distributed", 201, room)


def test_auto_prefers_rapidsmpf_only_where_it_need_not_spill():
    """The plan takes ``auto``'s RapidsMPF only where every share fits its GPU room, else the
    package's exchange; an explicit RapidsMPF spills to host, and past that is refused, saying
    why and what to do."""
    from dask_gpudirect.shuffle.coordinator import _engine_that_holds

    rooms = {
        "a": {"device": 100, "host": 50, "disk": 1000},
        "b": {"device": 200, "host": 0, "disk": 0},
    }
    auto = ("rapidsmpf", "distributed")
    assert _engine_that_holds(auto, {"a": 100, "b": 100}, rooms) == "rapidsmpf"
    assert _engine_that_holds(auto, {"a": 101, "b": 100}, rooms) == "distributed"
    assert _engine_that_holds(("rapidsmpf",), {"a": 150, "b": 200}, rooms) == "rapidsmpf"
    with pytest.raises(
        ShuffleError, match="worker a .* 'rapidsmpf' engine spills to host memory, not to disk"
    ):
        _engine_that_holds(("rapidsmpf",), {"a": 151, "b": 0}, rooms)


def test_rapidsmpf_op_ids_are_unique_while_in_flight_and_given_back(tcp):
    ensure_plugins(tcp, need_readers=[], readers=False)  # as a shuffle sets them up

    def reserve(shuffle_id: str, limit: int = 2) -> int:
        return tcp.sync(
            tcp.scheduler.gpudirect_shuffle_op_id, shuffle_id=shuffle_id, client=tcp.id, limit=limit
        )

    assert (reserve("a"), reserve("b")) == (0, 1)
    with pytest.raises(ShuffleError, match="2 RapidsMPF shuffles are in flight"):
        reserve("c")
    tcp.sync(tcp.scheduler.gpudirect_shuffle_end, shuffle_id="a")
    assert reserve("c") == 0
    for shuffle_id in ("b", "c"):
        tcp.sync(tcp.scheduler.gpudirect_shuffle_end, shuffle_id=shuffle_id)
    assert reserve("d") == 0
    tcp.sync(tcp.scheduler.gpudirect_shuffle_end, shuffle_id="d")
