"""The ledger: every read recorded on the worker that did it; ``dg.report`` sums it."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import clear_ledgers, compute, shards_of

import dask_gpudirect as dg
from dask_gpudirect import ledger_report
from dask_gpudirect.ledger import COPIES, FIELDS, Ledger


@pytest.fixture
def files(tmp_path):
    pq_path = tmp_path / "t.parquet"
    n = 20_000
    pq.write_table(
        pa.table({"i": np.arange(n), "f": np.random.default_rng(0).random(n)}),
        pq_path,
        row_group_size=2_000,
    )
    npy_path = tmp_path / "a.npy"
    np.save(npy_path, np.arange(30_000, dtype="<i4").reshape(10_000, 3))
    return os.fspath(pq_path), os.fspath(npy_path)


def expected_bytes(*collections) -> dict[str, tuple[int, int]]:
    """Per worker: (number of shards, bytes they read), from the shards' placement."""
    out: dict[str, list[int]] = {}
    for c in collections:
        for shard in shards_of(c).values():
            count_bytes = out.setdefault(shard.worker, [0, 0])
            count_bytes[0] += 1
            count_bytes[1] += shard.nbytes
    return {w: tuple(v) for w, v in out.items()}


def test_report_matches_shards(client, files):
    pq_path, npy_path = files
    df = dg.read_parquet(pq_path, blocksize=1, client=client)
    x = dg.read_binary(npy_path, blocksize=12 * 1000, client=client)
    clear_ledgers(client)
    assert dg.report(client).empty
    compute(client, df)
    compute(client, x)

    report = dg.report(client)
    assert list(report.columns) == [
        "worker",
        "op",
        "path",
        "count",
        "bytes",
        "seconds",
        "copies",
        "GB/s",
    ]
    assert set(report["path"]) == {"posix-host"}
    assert set(report["op"]) == {"read"}
    assert set(report["copies"]) == {1}
    assert (report["seconds"] > 0).all() and (report["GB/s"] > 0).all()
    got = {r.worker: (r.count, r.bytes) for r in report.itertuples()}
    assert got == expected_bytes(df, x)
    assert len(got) == 2  # both workers read
    assert report["bytes"].sum() == sum(s.nbytes for c in (df, x) for s in shards_of(c).values())


def test_records_name_file_and_shard(tcp, files):
    pq_path, _ = files
    df = dg.read_parquet(pq_path, blocksize=1, client=tcp)
    clear_ledgers(tcp)
    compute(tcp, df)
    records = ledger_report.records(tcp)
    assert len(records) == df.npartitions == 10
    assert set(records["file"]) == {pq_path}
    assert set(records["shard"]) == {s.name for s in shards_of(df).values()}
    assert set(records["copies"]) == {COPIES["posix-host"]}


def test_a_failed_read_is_not_recorded(tcp, files, tmp_path):
    """A read that comes up short raises and leaves no record claiming the bytes."""
    _, npy_path = files
    x = dg.read_binary(npy_path, client=tcp)
    clear_ledgers(tcp)
    with open(npy_path, "r+b") as f:
        f.truncate(os.path.getsize(npy_path) - 12)
    with pytest.raises(dg.InputError, match="changed since it was planned"):
        compute(tcp, x)
    assert ledger_report.records(tcp).empty


def test_ledger_is_bounded():
    book = Ledger("tcp://w:1", max_records=3)
    for k in range(5):
        book.add(op="read", path="gds", nbytes=k, seconds=0.1, file="f", shard=f"s{k}")
    records = book.records()
    assert [r["bytes"] for r in records] == [2, 3, 4]  # the oldest were dropped
    assert {r["copies"] for r in records} == {1}
    book.clear()
    assert book.records() == []


def test_copies_per_route():
    """The copy counts of NVIDIA's GPUDirect write-ups, per path a byte can take."""
    assert COPIES == {
        "gds": 1,
        "kvikio-compat": 2,
        "posix-host": 1,
        "ucx-device": 1,
        "rapidsmpf-ucx": 1,
        "tcp-host-staged": 2,
        "ucx-host": 1,
        "tcp-host": 1,
        "local": 0,
        "device-to-host": 1,
        "host-to-disk": 1,
        "host-remote": 1,  # object store or HTTP server -> host memory
        "kvikio-remote": 2,  # object store or HTTP server -> host memory -> GPU
        "in-process": 0,  # between two workers of one process
    }


def test_a_shuffle_between_workers_of_one_process_copies_nothing():
    """``LocalCluster(processes=False)``: the pieces go worker to worker by reference
    (``inproc://``), not over a socket; the ledger says so, and no copy."""
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster

    pdf = pd.DataFrame({"k": np.arange(400) % 7, "v": np.arange(400.0)})
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
        plugins={dg.GPUDirectPlugin()},
    ) as cluster, Client(cluster, set_as_default=False) as client:  # fmt: skip
        assert all(a.startswith("inproc://") for a in client.scheduler_info()["workers"])
        out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", client=client)
        assert len(compute(client, out)) == 400
        moved = ledger_report.records(client)
        moved = moved[moved["op"] == "shuffle"]
        assert set(moved["path"]) == {"local", "in-process"}
        assert (moved["copies"] == 0).all()


def test_report_leaves_out_a_worker_that_does_not_answer(tmp_path):
    """A stopped worker (SIGSTOP) held dg.report for as long as it stayed stopped: now the
    others' rows come back after distributed.comm.timeouts.connect, with a warning naming it."""
    import dask
    from distributed import Client
    from util import start_cluster, stopped

    np.save(tmp_path / "a.npy", np.arange(4_000, dtype="<i8").reshape(1_000, 4))
    with start_cluster("tcp", threads=1) as lc, Client(lc, set_as_default=False) as client:
        client.register_plugin(dg.GPUDirectPlugin())
        compute(
            client, dg.read_binary(os.fspath(tmp_path / "a.npy"), blocksize=8_000, client=client)
        )
        silent, answering = sorted(client.nthreads())
        assert set(dg.report(client)["worker"]) == {silent, answering}
        with (
            stopped(client, silent),
            dask.config.set({"distributed.comm.timeouts.connect": "2s"}),
            pytest.warns(RuntimeWarning, match=f"{silent} gave no answer within 2 s"),
        ):
            got = dg.report(client)
        assert set(got["worker"]) == {answering}


def test_columns_hold_what_the_records_hold():
    """dg.report gathers the records a column at a time: the same values, in order."""
    book = Ledger("w", max_records=3)
    for i in range(5):
        book.add(op="read", path="posix-host", nbytes=i, seconds=0.5, file=f"f{i}")
    columns = book.columns()
    assert list(columns) == list(FIELDS)
    rows = zip(*columns.values(), strict=True)
    assert [dict(zip(columns, row, strict=True)) for row in rows] == book.records()


@pytest.mark.parametrize("value", [-1, "lots", 2.5])
def test_a_bad_ledger_size_in_the_workers_config_is_named_by_a_shuffle(value):
    """``gpudirect.ledger.max-records`` in the workers' config: a shuffle, which sets up no
    reader plugin (whose setup checks the key), made each worker's ledger from it unchecked:
    ``ValueError: maxlen must be non-negative`` or int()'s error, naming no key, and 2.5 cut
    to 2 records, where ``GPUDirectPlugin`` refuses all three."""
    import dask
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client
    from util import start_cluster

    df = dd.from_pandas(pd.DataFrame({"k": range(20)}), npartitions=2)
    with dask.config.set({"gpudirect.ledger.max-records": value}):  # the workers inherit it
        with start_cluster("tcp", n_workers=1, threads=1) as cluster:
            with Client(cluster, set_as_default=False) as client:
                with pytest.raises(
                    dg.ConfigError,
                    match=r"gpudirect.ledger.max-records=.*: use a whole number of at least 0",
                ):
                    dg.shuffle(df, "k", client=client)
