"""``dg.report``'s views after real loads and shuffles: per worker, per path, per shard, and
per time window (the windows also on hand-made records, where the times are known)."""

from __future__ import annotations

import dataclasses
import os

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import clear_ledgers, compute, shards_of

import dask_gpudirect as dg
from dask_gpudirect import ledger_report
from dask_gpudirect.ledger import Record

SUMS = ["count", "bytes", "seconds", "copies", "GB/s"]
REMOTE = {"tcp": "tcp-host", "ucxx": "ucx-host"}


@pytest.fixture
def loaded(client, tmp_path):
    """A load of 6 binary shards and a shuffle on the cluster, with only their records."""
    path = os.fspath(tmp_path / "a.npy")
    np.save(path, np.arange(36_000, dtype="<i8").reshape(12_000, 3))
    x = dg.read_binary(path, blocksize=24 * 2_000, client=client)
    pdf = pd.DataFrame({"k": np.arange(6_000) % 101, "v": 1.0})
    clear_ledgers(client)
    compute(client, x)
    dg.shuffle(dd.from_pandas(pdf, npartitions=3), "k", client=client)
    return x, ledger_report.records(client)


def test_default_view_is_per_worker_op_and_path(client, loaded):
    _, records = loaded
    report = dg.report(client)
    assert list(report.columns) == ["worker", "op", "path", *SUMS]
    expected = records.groupby(["worker", "op", "path"])["bytes"].sum()
    assert report.set_index(["worker", "op", "path"])["bytes"].to_dict() == expected.to_dict()
    assert report.equals(dg.report(client, by="worker"))


def test_path_view_sums_the_cluster(client, loaded):
    _, records = loaded
    report = dg.report(client, by="path")
    assert list(report.columns) == ["op", "path", *SUMS]
    got = report.set_index(["op", "path"])
    assert got["bytes"].to_dict() == records.groupby(["op", "path"])["bytes"].sum().to_dict()
    assert got.loc[("read", "posix-host"), "count"] == 6  # one read per shard
    protocol = client.scheduler.address.split("://")[0]
    assert got.loc[("shuffle", REMOTE[protocol]), "bytes"] > 0
    assert got.loc[("shuffle", "local"), "copies"] == 0


def test_shard_view_lists_loaded_shards_slowest_first(client, loaded):
    x, _ = loaded
    report = dg.report(client, by="shard")
    assert list(report.columns) == [
        "shard",
        "file",
        "worker",
        "path",
        "count",
        "bytes",
        "seconds",
        "GB/s",
    ]
    shards = {s.name: s for s in shards_of(x).values()}
    assert len(report) == len(shards) == 6  # reads only: no shuffle ids
    for row in report.itertuples():
        shard = shards[row.shard]
        assert (row.file, row.worker, row.bytes, row.count) == (
            shard.path,
            shard.worker,
            shard.nbytes,
            1,
        )
    assert report["GB/s"].is_monotonic_increasing
    assert (report["GB/s"] > 0).all()


def test_shard_view_tells_parquet_shards_apart(tcp, tmp_path):
    """Each Parquet shard is named by its row groups (its first byte range is the header)."""
    path = os.fspath(tmp_path / "t.parquet")
    pq.write_table(pa.table({"i": np.arange(6_000)}), path, row_group_size=2_000)
    df = dg.read_parquet(path, blocksize=1, client=tcp)
    clear_ledgers(tcp)
    compute(tcp, df)
    report = dg.report(tcp, by="shard")
    assert len(report) == df.npartitions == 3
    assert sorted(report["shard"]) == ["t.parquet@rg0", "t.parquet@rg1", "t.parquet@rg2"]


def test_a_window_longer_than_the_run_is_the_plain_view(client, loaded):
    for by in ("worker", "path"):
        report = dg.report(client, by=by, window="1000days")
        assert report.columns[0] == "window"
        assert report["window"].nunique() == 1
        assert report.drop(columns="window").equals(dg.report(client, by=by))


def fake_records(
    rows: list[tuple[str, str, str, int, float]], seconds: float = 1.0
) -> pd.DataFrame:
    """Records of (worker, op, path, bytes, time), ``seconds`` each, as ``records`` gives them."""
    return pd.DataFrame(
        [
            dataclasses.asdict(
                Record(
                    worker=w,
                    op=op,
                    path=p,
                    bytes=b,
                    seconds=seconds,
                    copies=1,
                    file=f"{w}.npy",
                    shard=f"{w}.npy[0]",
                    time=t,
                )
            )
            for w, op, p, b, t in rows
        ]
    )


def test_windows_split_by_record_time(monkeypatch):
    t0 = 1_700_000_000.0  # a multiple of 10 s
    records = fake_records(
        [
            ("a", "read", "gds", 100, t0 + 1),
            ("b", "read", "gds", 200, t0 + 9.9),
            ("a", "read", "gds", 400, t0 + 10),
            ("a", "shuffle", "ucx-device", 800, t0 + 35),
        ]
    )
    monkeypatch.setattr(ledger_report, "records", lambda client: records)
    report = dg.report(None, by="path", window="10s")
    start = pd.Timestamp(t0, unit="s", tz="UTC")
    assert report[["window", "op", "path", "count", "bytes"]].values.tolist() == [
        [start, "read", "gds", 2, 300],
        [start + pd.Timedelta("10s"), "read", "gds", 1, 400],
        [start + pd.Timedelta("30s"), "shuffle", "ucx-device", 1, 800],  # empty windows: none
    ]
    per_worker = dg.report(None, window=10)  # seconds as a number
    assert per_worker[["worker", "bytes"]].values.tolist() == [
        ["a", 100],
        ["b", 200],
        ["a", 400],
        ["a", 800],
    ]


def test_records_of_no_measured_time_have_no_rate(monkeypatch):
    """Bytes over no time are no rate: 0.0 GB/s read as the slowest shard, where the view sorts
    by rate."""
    quick = fake_records([("a", "read", "gds", 100, 0.0)], seconds=0.0)
    slow = fake_records([("b", "read", "gds", 100, 0.0)], seconds=1.0)
    monkeypatch.setattr(ledger_report, "records", lambda client: pd.concat([quick, slow]))
    assert dg.report(None, by="path")["GB/s"].tolist() == [200 / 1e9]
    by_shard = dg.report(None, by="shard")
    assert by_shard["worker"].tolist() == ["b", "a"]  # the slowest measured first
    assert by_shard["GB/s"].iloc[0] == 100 / 1e9 and np.isnan(by_shard["GB/s"].iloc[1])


def test_copies_are_per_byte_where_a_path_s_records_differ(monkeypatch):
    """Host-staged transfers cost 2 copies in a node and 5 across nodes: 9 bytes of the one
    and 1 of the other are 2.3 copies a byte (the counters' ratio), not the largest, 5."""
    records = fake_records([("a", "shuffle", "tcp-host-staged", 9, 0.0)] * 2)
    records["bytes"] = [9, 1]
    records["copies"] = [2, 5]
    monkeypatch.setattr(ledger_report, "records", lambda client: records)
    assert dg.report(None, by="path")["copies"].tolist() == [pytest.approx(2.3)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"by": "file"}, "by='file'"),
        ({"by": "shard", "window": "1s"}, "not by='shard'"),
        ({"window": "0s"}, "longer than zero"),
    ],
)
def test_bad_arguments_fail_before_asking_the_cluster(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dg.report(None, **kwargs)
