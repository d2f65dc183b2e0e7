"""``dg.read_parquet`` as a drop-in for ``dd.read_parquet``: the paths, folders and arguments
Dask users pass, on the host target with files the tests write."""

from __future__ import annotations

import datetime
import decimal
import inspect
import os

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest
from util import (
    OTHER_INDEX_IDS,
    OTHER_INDEXES,
    compute,
    frame,
    partitions,
    write_index_named_by_the_empty_string,
    write_noted_in_one_file,
    write_other_indexes,
)

import dask_gpudirect as dg
from dask_gpudirect.errors import InputError


def write(path, df: pd.DataFrame) -> str:
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    return os.fspath(path)


def test_columns_matched_by_name_in_any_order(tcp, tmp_path):
    """A file whose columns come in another order is read by name, in the first file's order."""
    write(tmp_path / "a.parquet", frame(0))
    write(tmp_path / "b.parquet", frame(50)[["s", "x", "id"]])
    got = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0, 100))
    ids = compute(tcp, dg.read_parquet(tmp_path, columns=["x", "id"], client=tcp))
    pd.testing.assert_frame_equal(ids.reset_index(drop=True), frame(0, 100)[["x", "id"]])


def test_files_laid_out_differently_are_never_decoded_in_one_call(tmp_path):
    """A target decodes a partition's files in one call per run of alike shards (the device
    target one libcudf call); libcudf refuses files whose columns come in another order ("All
    sources must have the same schema"), so those start a new run. The planning here is the
    workers' own (footers only), on this CPU."""
    from dask_gpudirect.formats import parquet

    files = [
        write(tmp_path / "a.parquet", frame(0)),
        write(tmp_path / "b.parquet", frame(50)),  # as a: one run with it
        write(tmp_path / "c.parquet", frame(100)[["s", "x", "id"]]),
        write(tmp_path / "d.parquet", frame(150)[["s", "x", "id"]]),
        write(tmp_path / "e.parquet", frame(200)),
    ]
    shards = parquet.plan(files, None, None, 2**30, "device").shards
    runs = parquet.runs(shards)
    assert [[os.path.basename(s.path) for s in run] for run in runs] == [
        ["a.parquet", "b.parquet"],
        ["c.parquet", "d.parquet"],
        ["e.parquet"],
    ]


def test_a_folder_takes_its_parquet_files(tcp, tmp_path):
    """As Dask: files ending in .parquet, .parq or .pq, by case; not README.txt, _SUCCESS,
    .crc files (nor OLD.PARQUET, which was read)."""
    write(tmp_path / "part-0.parquet", frame(0))
    write(tmp_path / "part-1.parq", frame(50))
    write(tmp_path / "part-2.pq", frame(100))
    write(tmp_path / "OLD.PARQUET", frame(1000))
    (tmp_path / "README.txt").write_text("what this data is\n")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / ".part-0.parquet.crc").write_bytes(b"\x00" * 8)
    got = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0, 150))

    only = compute(tcp, dg.read_parquet(tmp_path, parquet_file_extension=".parq", client=tcp))
    pd.testing.assert_frame_equal(only.reset_index(drop=True), frame(50))
    upper = compute(tcp, dg.read_parquet(tmp_path, parquet_file_extension=".PARQUET", client=tcp))
    pd.testing.assert_frame_equal(upper.reset_index(drop=True), frame(1000))
    readme = os.fspath(tmp_path / "README.txt")
    with pytest.raises(dg.InputError, match=f"{readme}: not a valid Parquet file"):
        dg.read_parquet(tmp_path, parquet_file_extension=None, client=tcp)  # every file


def test_dot_dot_after_a_link_is_where_the_link_leads(tcp, tmp_path):
    """``x/link/../f.parquet`` is the file the kernel opens, as Dask reads it: ``..`` of
    where ``link`` leads (it was folded by name to ``x/f.parquet``, another file)."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y" / "sub").mkdir(parents=True)
    write(tmp_path / "x" / "f.parquet", frame(0))
    write(tmp_path / "y" / "f.parquet", frame(500))
    os.symlink(tmp_path / "y" / "sub", tmp_path / "x" / "link")
    path = os.fspath(tmp_path / "x" / "link" / ".." / "f.parquet")
    got = compute(tcp, dg.read_parquet(path, client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(500))
    assert dd.read_parquet(path).compute(scheduler="sync")["id"].tolist() == got["id"].tolist()


def test_a_double_star_globs_any_depth(tcp, tmp_path):
    """``**`` matches folders at any depth (none too), as Dask's globs do; it matched one."""
    for i, rel in enumerate(["top", "s/mid", "s/t/low"]):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        write(tmp_path / f"{rel}.parquet", frame(50 * i))
        np.save(tmp_path / f"{rel}.npy", np.array([i]))
    pattern = os.fspath(tmp_path / "**" / "*.parquet")
    got = compute(tcp, dg.read_parquet(pattern, client=tcp))
    theirs = dd.read_parquet(pattern).compute(scheduler="sync")
    assert sorted(got["id"].tolist()) == list(range(150))
    assert got["id"].tolist() == theirs["id"].tolist()
    arr = compute(tcp, dg.read_binary(tmp_path / "**" / "*.npy", client=tcp))
    assert sorted(arr.tolist()) == [0, 1, 2]


@pytest.mark.parametrize("tail", ["?art.0.parquet", "#part.0.parquet", "part.0.parquet?"])
def test_a_file_url_with_a_query_or_fragment_is_refused(tcp, tmp_path, tail):
    """They name no file: the URL's path alone (the whole folder) was read."""
    write(tmp_path / "part.0.parquet", frame(0))
    url = f"file://{tmp_path}/{tail}"
    with pytest.raises(dg.InputError, match="query and fragment"):
        dg.read_parquet(url, client=tcp)
    encoded = f"file://{tmp_path}/part.0.parquet"
    assert len(compute(tcp, dg.read_parquet(encoded, client=tcp))) == 50
    local = f"file://localhost{tmp_path}/part.0.parquet"
    assert len(compute(tcp, dg.read_parquet(local, client=tcp))) == 50


def test_a_file_url_of_another_host_is_refused(tcp, tmp_path):
    """It was read as this machine's path of that name."""
    write(tmp_path / "part.0.parquet", frame(0))
    with pytest.raises(dg.InputError, match="a file:// URL of host 'elsewhere'"):
        dg.read_parquet(f"file://elsewhere{tmp_path}/part.0.parquet", client=tcp)


def test_bytes_paths_are_paths(tcp, tmp_path):
    """As NumPy takes them (a bytes path was taken as a list of numbers)."""
    np.save(tmp_path / "a.npy", np.arange(3))
    for given in (os.fsencode(tmp_path / "a.npy"), [os.fsencode(tmp_path / "a.npy")]):
        assert compute(tcp, dg.read_binary(given, client=tcp)).tolist() == [0, 1, 2]
    with pytest.raises(dg.InputError, match="not a path: 3"):
        dg.read_binary([3], client=tcp)


@pytest.mark.parametrize("how", ["folder", "glob", "hive"])
def test_files_come_in_dasks_order(tcp, tmp_path, how):
    """As Dask orders a dataset's files (their paths' natural order): Dask's ``to_parquet``
    writes ``part.0`` to ``part.11``, and ``part.10`` comes after ``part.9``, not after
    ``part.1``; hive folders ``n=2`` before ``n=10``. Rows then come in the order Dask gives."""
    for i in range(12):
        folder = tmp_path / f"n={i}" if how == "hive" else tmp_path
        folder.mkdir(exist_ok=True)
        write(folder / f"part.{i}.parquet", frame(50 * i))
    path = tmp_path / "*.parquet" if how == "glob" else tmp_path
    got = compute(tcp, dg.read_parquet(path, columns=["id", "x", "s"], client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0, 600))
    theirs = dd.read_parquet(path, columns=["id", "x", "s"]).compute(scheduler="sync")
    assert theirs["id"].tolist() == got["id"].tolist()


def test_a_folder_without_parquet_files_says_so(tcp, tmp_path):
    (tmp_path / "README.txt").write_text("no data yet\n")
    with pytest.raises(dg.InputError, match="no files ending in .parquet, .pq") as info:
        dg.read_parquet(tmp_path, parquet_file_extension=(".parquet", ".pq"), client=tcp)
    assert os.fspath(tmp_path) in str(info.value)
    with pytest.raises(dg.InputError, match="parquet_file_extension"):
        dg.read_parquet(tmp_path, parquet_file_extension=("",), client=tcp)
    for value in [True, 5]:  # no suffixes: named, not a TypeError from iterating them
        with pytest.raises(dg.InputError, match=f"parquet_file_extension={value!r}"):
            dg.read_parquet(tmp_path, parquet_file_extension=value, client=tcp)


def test_home_and_file_urls(tcp, tmp_path, monkeypatch):
    """``~`` is the client's home; ``file://`` URLs are local paths; both as Dask reads them."""
    path = write(tmp_path / "data.parquet", frame(0))
    monkeypatch.setenv("HOME", os.fspath(tmp_path))
    for spelling in ["~/data.parquet", f"file://{path}", f"file://{tmp_path}/data%2Eparquet"]:
        got = compute(tcp, dg.read_parquet(spelling, client=tcp))
        pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0))
    np.save(tmp_path / "a.npy", np.arange(6.0))
    arr = compute(tcp, dg.read_binary("~/a.npy", client=tcp))
    np.testing.assert_array_equal(arr, np.arange(6.0))


def test_a_file_url_of_a_name_not_in_utf8(tcp, tmp_path):
    """``Path.as_uri()`` writes a name's bytes that are not UTF-8 as ``%E9``: they are those
    bytes, as a bytes path's are, where they became U+FFFD ("no such file")."""
    name = os.fsdecode(b"caf\xe9")  # Latin-1, as an old archive's names
    with open(tmp_path / f"{name}.parquet", "wb") as f:  # pyarrow opens no such name itself
        pq.write_table(pa.Table.from_pandas(frame(0), preserve_index=False), f)
    np.save(tmp_path / f"{name}.npy", np.arange(3))
    url = (tmp_path / f"{name}.parquet").as_uri()
    assert url.endswith("/caf%E9.parquet")
    got = compute(tcp, dg.read_parquet(url, client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0))
    arr = compute(tcp, dg.read_binary((tmp_path / f"{name}.npy").as_uri(), client=tcp))
    assert arr.tolist() == [0, 1, 2]


@pytest.mark.parametrize("url", ["gs://bucket/data", "az://container/x.parquet"])
def test_unsupported_urls_are_refused_by_name(tcp, url):
    """s3:// and http(s):// are read (tests/test_remote.py); other schemes are refused."""
    scheme = url.split("://")[0]
    with pytest.raises(dg.InputError, match=f"{url}: {scheme}:// paths are not supported yet"):
        dg.read_parquet(url, client=tcp)
    with pytest.raises(dg.InputError, match=f"{scheme}:// paths are not supported yet"):
        dg.read_binary([url], dtype="f8", client=tcp)


def test_one_column_name_gives_a_series(tcp, tmp_path):
    path = write(tmp_path / "data.parquet", frame(0))
    series = dg.read_parquet(path, columns="x", client=tcp)
    assert series.name == "x" and series.ndim == 1
    got = compute(tcp, series)
    pd.testing.assert_series_equal(got.reset_index(drop=True), frame(0)["x"])
    # filters may use a column that is not returned
    kept = compute(tcp, dg.read_parquet(path, columns="s", filters=[("id", ">=", 45)], client=tcp))
    assert list(kept) == [f"v{i}" for i in range(45, 50)]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"engine": "pyarrow"}, "engine= is not supported: dask-gpudirect decodes"),
        ({"split_row_groups": 0}, "split_row_groups=0: use 'infer', 'adaptive', True, False"),
        ({"split_row_groups": "yes"}, "split_row_groups='yes': use"),
        ({"storage_options": {"anonymous": True}}, "storage_options: anonymous not taken"),
        ({"calculate_divisions": "yes"}, "calculate_divisions must be True or False, not 'yes'"),
        ({"dtype_backend": "arrow"}, "dtype_backend='arrow': use None, 'numpy_nullable'"),
        ({"index": ["id", "x"]}, "one column only"),
        ({"filesystem": "s3"}, "filesystem='s3' is not supported"),
    ],
)
def test_dask_arguments_refused_by_name(tcp, tmp_path, kwargs, reason):
    path = write(tmp_path / "data.parquet", frame(0))
    with pytest.raises(dg.InputError, match=reason):
        dg.read_parquet(path, client=tcp, **kwargs)


def test_dask_arguments_accepted(tcp, tmp_path):
    path = write(tmp_path / "data.parquet", frame(0))
    for kwargs in [
        {"index": False},
        {"filesystem": "arrow"},
        {"filesystem": pyarrow.fs.LocalFileSystem()},
    ]:
        got = compute(tcp, dg.read_parquet(path, client=tcp, **kwargs))
        pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0))
    # Dask's arguments given their defaults (as code written for Dask may spell them out), or
    # ignore_metadata_file=True, ask for nothing different
    defaults = {
        "engine": None,
        "categories": None,
        "ignore_metadata_file": True,
        "metadata_task_size": None,
        "aggregate_files": None,
        "open_file_options": {},
        "dataset": {},
        "filesystem": "fsspec",
        "blocksize": "default",
    }
    got = compute(tcp, dg.read_parquet(path, client=tcp, **defaults))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0))
    # every default of dd.read_parquet's signature, as code written for Dask may pass them
    signature = inspect.signature(dd.read_parquet).parameters.values()
    given = {
        p.name: p.default
        for p in signature
        if p.default is not inspect.Parameter.empty and p.name != "path"
    }
    got = compute(tcp, dg.read_parquet(path, client=tcp, **given))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0))
    with pytest.raises(dg.InputError, match="categories= is not supported"):
        dg.read_parquet(path, categories=["s"], client=tcp)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colums'"):
        dg.read_parquet(path, colums=["x"], client=tcp)


@pytest.mark.parametrize("empty", [[], ()])
def test_an_empty_list_of_filters_filters_nothing(tcp, tmp_path, empty):
    """As in Dask: filters built from a list of conditions that came out empty keep every row."""
    path = write(tmp_path / "data.parquet", frame(0))
    got = compute(tcp, dg.read_parquet(path, filters=empty, client=tcp))
    want = dd.read_parquet(path, filters=empty).compute()
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
    assert len(got) == 50


@pytest.mark.parametrize(("split", "partitions"), [(True, 6), (2, 3), (False, 2), ("infer", 1)])
def test_split_row_groups_as_dask(tcp, tmp_path, split, partitions):
    """Two files of 4 and 2 row groups: one partition per row group, per 2, per file, or (by
    bytes: small files joined) one; Dask makes the same counts."""
    import dask.dataframe as dd

    pq.write_table(pa.Table.from_pandas(frame(0, 40)), tmp_path / "a.parquet", row_group_size=10)
    pq.write_table(pa.Table.from_pandas(frame(40, 20)), tmp_path / "b.parquet", row_group_size=10)
    df = dg.read_parquet(tmp_path, split_row_groups=split, blocksize="64MiB", client=tcp)
    assert df.npartitions == partitions
    if split != "infer":  # Dask's "infer" joins by its own blocksize
        assert dd.read_parquet(tmp_path, split_row_groups=split).npartitions == partitions
    got = compute(tcp, df)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0, 60))


@pytest.mark.parametrize("backend", ["numpy_nullable", "pyarrow"])
def test_dtype_backend_as_dask(tcp, tmp_path, backend):
    """Dask's types for each backend, in meta and in every partition, nulls kept as nulls."""
    import dask.dataframe as dd

    table = pa.table(
        {
            "i": pa.array([1, None, 3], pa.int64()),
            "f": pa.array([0.5, None, 1.5]),
            "b": pa.array([True, None, False]),
            "u": pa.array([1, 2, 3], pa.uint16()),
        }
    )
    for name in ("a", "b"):
        pq.write_table(table, tmp_path / f"{name}.parquet")
    df = dg.read_parquet(tmp_path, dtype_backend=backend, client=tcp)
    want = dd.read_parquet(tmp_path, dtype_backend=backend)
    assert df.dtypes.to_dict() == want.dtypes.to_dict()
    assert all(d == df.dtypes.to_dict() for d in dtypes_of(tcp, df))
    got = compute(tcp, df).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.compute().reset_index(drop=True))
    assert got["i"].isna().tolist() == [False, True, False] * 2


def dtypes_of(client, df) -> list[dict]:
    """Each partition's column types, as the workers made them."""
    parts = client.gather(client.compute(df.to_delayed()))
    return [p.dtypes.to_dict() for p in parts]


def test_one_type_per_column_when_only_some_files_hold_nulls(tcp, tmp_path):
    """pandas gives an integer column float64 where it holds nulls, int64 where not; every
    partition, and meta, take the type of the files that hold nulls (booleans: object)."""
    pq.write_table(pa.table({"n": [1, 2], "b": [True, False], "i": [1, 2]}), tmp_path / "0.parquet")
    pq.write_table(
        pa.table({"n": [3, None], "b": [None, True], "i": [3, 4]}), tmp_path / "1.parquet"
    )
    df = dg.read_parquet(tmp_path, blocksize=1, client=tcp)  # a partition per file
    want = {"n": np.dtype("float64"), "b": np.dtype(object), "i": np.dtype("int64")}
    assert df.npartitions == 2
    assert df.dtypes.to_dict() == want
    assert dtypes_of(tcp, df) == [want, want]
    got = compute(tcp, df).reset_index(drop=True)
    np.testing.assert_array_equal(got["n"], [1.0, 2.0, 3.0, np.nan])
    assert list(got["b"]) == [True, False, None, True]
    # where the filters leave no row group with nulls, the column keeps its type
    kept = dg.read_parquet(tmp_path, filters=[("i", "<", 3)], blocksize=1, client=tcp)
    assert kept.dtypes.to_dict()["n"] == np.dtype("int64")
    assert {d["n"] for d in dtypes_of(tcp, kept)} == {np.dtype("int64")}


def test_integers_without_null_counts_are_never_rounded(tcp, tmp_path):
    """A file without statistics may hold nulls, so its integers read as float64; a value
    float64 would round is an error naming the file and what keeps it (it read as 2**53 + 2),
    and a column the schema says is required is never null: it keeps its type."""
    big = pa.table({"i": pa.array([2**53 + 1, 1], pa.int64()), "u": pa.array([1, 2], pa.uint8())})
    pq.write_table(big, tmp_path / "big.parquet", write_statistics=False)
    with pytest.raises(InputError, match=r"big\.parquet: column 'i' holds 9007199254740993"):
        compute(tcp, dg.read_parquet(tmp_path / "big.parquet", client=tcp))
    exact = dg.read_parquet(tmp_path / "big.parquet", client=tcp, dtype_backend="numpy_nullable")
    assert list(compute(tcp, exact)["i"]) == [2**53 + 1, 1]
    required = pa.schema([pa.field("i", pa.int64(), nullable=False)])
    pq.write_table(pa.table({"i": [2**53 + 1, 3]}, schema=required), tmp_path / "required.parquet",
                   write_statistics=False)  # fmt: skip
    df = dg.read_parquet(tmp_path / "required.parquet", client=tcp)
    assert df.dtypes["i"] == np.dtype("int64")
    assert list(compute(tcp, df)["i"]) == [2**53 + 1, 3]


def test_pandas_nullable_types_in_meta_and_partitions(tcp, tmp_path):
    """Int32/Int64 columns written by pandas come back as Int32/Int64, in meta as in every
    partition (meta said int32 and int64 before)."""
    for i, values in enumerate([[1, None], [3, 4]]):
        pdf = pd.DataFrame(
            {"a": pd.array(values, dtype="Int32"), "b": pd.array(values, dtype="Int64")}
        )
        pdf.to_parquet(tmp_path / f"{i}.parquet", index=False)
    df = dg.read_parquet(tmp_path, blocksize=1, client=tcp)
    want = {"a": pd.Int32Dtype(), "b": pd.Int64Dtype()}
    assert df.dtypes.to_dict() == want
    assert dtypes_of(tcp, df) == [want, want]


INDEXES = {
    "int": pd.Index(np.arange(600) * 3, name="t"),
    "tz-timestamp": pd.date_range("2026-01-01", periods=600, freq="h", tz="UTC", name="ts"),
}


@pytest.mark.parametrize("kind", list(INDEXES))
def test_calculate_divisions_as_dask(tcp, tmp_path, kind):
    """``calculate_divisions=True`` on a sorted dataset Dask wrote: one partition a file, the
    divisions Dask finds; the files joined (the default blocksize), each partition's index
    within its divisions; selecting by index gives Dask's rows. Without it, none known."""
    pdf = pd.DataFrame({"x": np.arange(600.0)}, index=INDEXES[kind])
    dd.from_pandas(pdf, npartitions=12).to_parquet(tmp_path, compute_kwargs={"scheduler": "sync"})
    theirs = dd.read_parquet(tmp_path, calculate_divisions=True)
    assert theirs.known_divisions
    each = dg.read_parquet(tmp_path, calculate_divisions=True, blocksize=1, client=tcp)
    assert each.divisions == theirs.divisions
    assert not dg.read_parquet(tmp_path, blocksize=1, client=tcp).known_divisions

    joined = dg.read_parquet(tmp_path, calculate_divisions=True, client=tcp)
    assert 1 < joined.npartitions < 12 and joined.known_divisions
    assert joined.divisions[0] == pdf.index[0] and joined.divisions[-1] == pdf.index[-1]
    parts = partitions(tcp, joined)
    for part, low, high in zip(parts, joined.divisions, joined.divisions[1:], strict=False):
        assert part.index[0] == low and part.index[-1] <= high
    low, high = pdf.index[100], pdf.index[250]
    pd.testing.assert_frame_equal(
        compute(tcp, joined.loc[low:high]), pdf.loc[low:high], check_freq=False
    )


def test_files_filters_rule_out_leave_no_partition_of_their_own(tcp, tmp_path):
    """As Dask drops them: a file ruled out whole joins the next partition with rows (its
    footer still checked there), so the divisions stay known; Dask's partitions and divisions,
    one file a partition. Where its file changed since planning, that partition's read says so.
    """
    pdf = pd.DataFrame({"x": np.arange(600.0)}, index=pd.Index(np.arange(600) * 3, name="t"))
    dd.from_pandas(pdf, npartitions=12).to_parquet(tmp_path, compute_kwargs={"scheduler": "sync"})
    later = [("t", ">=", 900)]  # the first six files ruled out
    theirs = dd.read_parquet(tmp_path, filters=later, calculate_divisions=True)
    ours = dg.read_parquet(
        tmp_path, filters=later, calculate_divisions=True, blocksize=1, client=tcp
    )
    assert ours.npartitions == theirs.npartitions == 6
    assert ours.divisions == theirs.divisions
    pd.testing.assert_frame_equal(compute(tcp, ours), pdf.loc[900:])
    dd.from_pandas(pdf + 1, npartitions=12).to_parquet(
        tmp_path, compute_kwargs={"scheduler": "sync"}
    )  # every file rewritten: the first partition's read checks the ruled-out ones too
    with pytest.raises(dg.InputError, match="part.0.parquet"):
        compute(tcp, ours.partitions[0])


def test_a_ruled_out_file_joins_only_a_partition_one_worker_reads_whole(tmp_path):
    """Files on different nodes: a ruled-out file joins the next partition with rows only
    where one worker can read both files, else the one before, else it stays alone."""
    from dask_gpudirect.formats import parquet
    from dask_gpudirect.placement import fold_rowless

    files = [write(tmp_path / f"{i}.parquet", frame(50 * i)) for i in range(4)]
    plan = parquet.plan(files, None, [("id", ">=", 100), ("id", "<", 150)], 1, "host")
    partitions = [(shard,) for shard in plan.shards]  # only file 2 has rows
    assert [s.part.empty is None for s in plan.shards] == [False, False, True, False]

    def folded(readable):
        out = fold_rowless(partitions, readable, lambda shard: shard.part.empty is not None)
        return [[os.path.basename(s.path) for s in p] for p in out]

    everyone = {"a": set(files), "b": set(files)}
    assert folded(everyone) == [["0.parquet", "1.parquet", "2.parquet", "3.parquet"]]
    split = {"a": set(files[:2]), "b": set(files[2:])}
    assert folded(split) == [["0.parquet"], ["1.parquet"], ["2.parquet", "3.parquet"]]
    plan = parquet.plan(files, None, [("id", "<", 0)], 1, "host")  # every file ruled out
    partitions = [(shard,) for shard in plan.shards]
    assert folded(everyone) == [["0.parquet", "1.parquet", "2.parquet", "3.parquet"]]
    assert folded(split) == [["0.parquet", "1.parquet"], ["2.parquet", "3.parquet"]]


def test_filters_that_rule_out_every_file_leave_one_empty_partition(tcp, tmp_path):
    """As Dask's: one empty partition of the frame's columns and types, not one per file (each
    file's footer still checked by its read)."""
    pdf = pd.DataFrame({"x": np.arange(600.0), "s": [f"s{i}" for i in range(600)]})
    dd.from_pandas(pdf, npartitions=6).to_parquet(tmp_path, compute_kwargs={"scheduler": "sync"})
    none = [("x", ">", 1e9)]
    theirs = dd.read_parquet(tmp_path, filters=none)
    ours = dg.read_parquet(tmp_path, filters=none, client=tcp)
    assert ours.npartitions == theirs.npartitions == 1
    pd.testing.assert_frame_equal(compute(tcp, ours), theirs.compute(scheduler="sync"))


def test_divisions_unknown_where_files_overlap(tcp, tmp_path):
    """As in Dask: where a file's index values start before the last one's end, no divisions."""
    write(tmp_path / "part.0.parquet", frame(100))
    write(tmp_path / "part.1.parquet", frame(0))
    theirs = dd.read_parquet(tmp_path, index="id", calculate_divisions=True)
    ours = dg.read_parquet(tmp_path, index="id", calculate_divisions=True, blocksize=1, client=tcp)
    assert not theirs.known_divisions and not ours.known_divisions
    assert sorted(compute(tcp, ours).index) == list(range(50)) + list(range(100, 150))


def test_the_unnamed_index_dask_stored_comes_back_unnamed(tcp, tmp_path):
    """Dask's ``to_parquet`` stores an unnamed index as a column ``__null_dask_index__``;
    ``dd.read_parquet`` indexes by it and unnames it, and so does ``dg.read_parquet``."""
    keys = np.random.default_rng(1).permutation(1000)[:300]
    pdf = pd.DataFrame({"x": np.arange(300.0)}, index=keys)
    dd.from_pandas(pdf, npartitions=3).to_parquet(tmp_path, compute_kwargs={"scheduler": "sync"})
    theirs = dd.read_parquet(tmp_path)
    df = dg.read_parquet(tmp_path, client=tcp)
    assert df.index.name is None and theirs.index.name is None
    assert list(df.columns) == list(theirs.columns) == ["x"]
    got = compute(tcp, df)
    assert got.index.name is None
    pd.testing.assert_frame_equal(got, theirs.compute(scheduler="sync"))


@pytest.mark.parametrize("writer", ["pandas", "dask"])
def test_an_unnamed_index_not_read_as_the_index_is_dropped(tcp, tmp_path, writer):
    """``index=False`` or another column: the column an unnamed index was stored in
    (``__index_level_0__``, ``__null_dask_index__``) is not data, and ``dd.read_parquet`` drops
    it; ``columns=[...]`` naming it keeps it."""
    pdf = pd.DataFrame({"x": np.arange(30.0), "k": np.arange(30) % 4}, index=np.arange(30) ** 2)
    if writer == "pandas":
        pdf.to_parquet(tmp_path / "0.parquet")
    else:
        dd.from_pandas(pdf, npartitions=2).to_parquet(
            tmp_path, compute_kwargs={"scheduler": "sync"}
        )
    stored = pq.read_schema(next(tmp_path.glob("*.parquet"))).names
    (label,) = [name for name in stored if name not in ("x", "k")]
    for index, columns in [(False, ["x", "k"]), ("k", ["x"])]:
        theirs = dd.read_parquet(tmp_path, index=index)
        df = dg.read_parquet(tmp_path, index=index, client=tcp)
        assert list(df.columns) == list(theirs.columns) == columns
        pd.testing.assert_frame_equal(compute(tcp, df), theirs.compute(scheduler="sync"))
    asked = compute(tcp, dg.read_parquet(tmp_path, index=False, columns=[label, "x"], client=tcp))
    assert list(asked[label]) == list(pdf.index)


def test_the_index_pandas_stored_comes_back(tcp, tmp_path):
    """``df.set_index("key").to_parquet(...)``: indexed by ``key`` again, as pandas reads it
    (dd.read_parquet of this Dask names no index and fails to compute it); an unnamed index
    unnamed; ``index=False`` or another column (first, as Dask puts it) and ``columns=[...]``
    naming it give a column."""
    rng = np.random.default_rng(0)
    keys = rng.permutation(1000)[:100]  # no range: pandas stores them as a column
    for i in range(2):
        pdf = frame(50 * i).assign(key=keys[50 * i : 50 * (i + 1)])
        pdf.set_index("key").to_parquet(tmp_path / f"{i}.parquet")
    want = pd.concat([pd.read_parquet(tmp_path / f"{i}.parquet") for i in range(2)])
    df = dg.read_parquet(tmp_path, client=tcp)
    assert df.index.name == "key" and list(df.columns) == ["id", "x", "s"]
    pd.testing.assert_frame_equal(compute(tcp, df), want)

    flat = compute(tcp, dg.read_parquet(tmp_path, index=False, client=tcp))
    # the index's column first, as dd.read_parquet and pandas' reset_index put it
    assert list(flat.columns) == ["key", "id", "x", "s"]
    pd.testing.assert_frame_equal(flat.reset_index(drop=True), want.reset_index())
    keys_written = keys
    keys = compute(tcp, dg.read_parquet(tmp_path, columns=["key", "x"], client=tcp))
    assert list(keys.columns) == ["key", "x"] and list(keys["key"]) == list(keys_written)
    by_x = dg.read_parquet(tmp_path, index="x", client=tcp)
    # the stored index's column first, where Dask puts it
    assert by_x.index.name == "x" and list(by_x.columns) == ["key", "id", "s"]
    assert list(by_x.columns) == list(dd.read_parquet(tmp_path, index="x").columns)
    assert list(compute(tcp, by_x).index) == [k * 0.5 for k in range(100)]
    # index= naming the stored index itself, as Dask takes it (it raised "Index data must be
    # 1-dimensional": the column was read twice)
    by_key = dg.read_parquet(tmp_path, index="key", client=tcp)
    assert list(by_key.columns) == list(dd.read_parquet(tmp_path, index="key").columns)
    pd.testing.assert_frame_equal(compute(tcp, by_key), want)

    unnamed = tmp_path / "unnamed"
    unnamed.mkdir()
    frame(0).set_index(pd.Index(np.arange(50) ** 2)).to_parquet(unnamed / "0.parquet")
    got = compute(tcp, dg.read_parquet(unnamed, client=tcp))
    pd.testing.assert_frame_equal(got, pd.read_parquet(unnamed / "0.parquet"))
    assert got.index.name is None and list(got.index) == [i**2 for i in range(50)]
    with pytest.raises(dg.InputError, match="index='nope': no such column"):
        dg.read_parquet(unnamed, index="nope", client=tcp)


def test_an_index_named_by_the_empty_string(tcp, tmp_path):
    """An index pandas stored under the name ``""``, or a column ``""`` chosen with
    ``index=""``, is the index, as in ``dd.read_parquet`` (it was left out of the read, a
    KeyError)."""
    stored, column = tmp_path / "stored", tmp_path / "column"
    write_index_named_by_the_empty_string(stored, column)
    for kwargs in [{}, {"index": ""}, {"columns": ["x"]}, {"filters": [("", ">", 100)]}]:
        df = dg.read_parquet(stored, split_row_groups=True, client=tcp, **kwargs)
        theirs = dd.read_parquet(stored, split_row_groups=True, **kwargs)
        assert df.index.name == "" and list(df.columns) == list(theirs.columns)
        pd.testing.assert_frame_equal(
            compute(tcp, df), theirs.compute(scheduler="sync"), check_index_type=False
        )
    df = dg.read_parquet(column, index="", client=tcp)
    got = compute(tcp, df)
    assert df.index.name == got.index.name == "" and list(got.columns) == ["x", "s"]
    assert list(got.index) == list(range(20))


def test_a_frame_of_an_index_alone_and_one_of_integer_labels(tcp, tmp_path):
    """pandas writes the column labels' type (``column_indexes``): a frame of an index alone
    (its labels an empty integer index) failed as pyarrow cast the index's name to int, and
    one of integer labels (``pd.DataFrame(array)``, which Dask's read fails on) computed no
    columns at all. Both read, columns by their field names."""
    alone, numbered = tmp_path / "alone", tmp_path / "numbered"
    alone.mkdir()
    numbered.mkdir()
    pd.DataFrame(index=pd.Index([5, 3, 9, 1], name="k")).to_parquet(alone / "a.parquet")
    got = compute(tcp, dg.read_parquet(alone, client=tcp))
    pd.testing.assert_frame_equal(got, dd.read_parquet(alone).compute(), check_column_type=False)
    assert got.index.tolist() == [5, 3, 9, 1] and got.index.name == "k"

    pd.DataFrame(np.arange(12.0).reshape(4, 3)).to_parquet(numbered / "a.parquet")
    df = dg.read_parquet(numbered, client=tcp)
    got = compute(tcp, df)
    assert list(df.columns) == list(got.columns) == ["0", "1", "2"]
    assert got.to_numpy().tolist() == np.arange(12.0).reshape(4, 3).tolist()
    assert compute(tcp, df["1"]).tolist() == [1.0, 4.0, 7.0, 10.0]


def test_a_range_index_pandas_stored_as_metadata_comes_back(tcp, tmp_path):
    """pandas 3 keeps ``set_index("key")`` of evenly spaced keys as a RangeIndex in the
    metadata, with no column: each file's labels are rebuilt, per row group, before filters."""
    for i in range(2):
        pdf = frame(50 * i).rename(columns={"id": "key"}).set_index("key")
        assert isinstance(pdf.index, pd.RangeIndex)
        pq.write_table(pa.Table.from_pandas(pdf), tmp_path / f"{i}.parquet", row_group_size=10)
    want = pd.concat([pd.read_parquet(tmp_path / f"{i}.parquet") for i in range(2)])
    for blocksize in [1, "1GiB"]:  # a shard per row group; each file's joined into one
        df = dg.read_parquet(tmp_path, blocksize=blocksize, client=tcp)
        assert df.index.name == "key" and list(df.columns) == ["x", "s"]
        pd.testing.assert_frame_equal(compute(tcp, df), want, check_index_type=False)
    kept = dg.read_parquet(tmp_path, filters=[("x", ">=", 20)], blocksize=1, client=tcp)
    got = compute(tcp, kept)
    assert list(got.index) == list(range(40, 100)) and got.index.name == "key"
    plain = compute(tcp, dg.read_parquet(tmp_path, index=False, blocksize="1GiB", client=tcp))
    assert plain.index.name is None and list(plain.columns) == ["x", "s"]


@pytest.mark.parametrize(("first", "second", "here", "there"), OTHER_INDEXES, ids=OTHER_INDEX_IDS)
def test_files_that_stored_other_indexes_are_refused_unless_index_chooses(
    tcp, tmp_path, first, second, here, there
):
    """Each file is planned by the index pandas stored in it, and meta by the first file's: a
    file that stored none beside one indexed by ``k`` gave its rows with ``k`` dropped (or as
    the index under a meta that has it as a column), and a RangeIndex of another name gave
    partitions of another index name than meta's. Refused, naming both files and both
    indexes; ``index=`` reads them as one."""
    write_other_indexes(tmp_path, first, second)
    message = rf"part\.1\.parquet: the index .*part\.0\.parquet's \({here} here, {there} there\)"
    with pytest.raises(dg.InputError, match=message):
        dg.read_parquet(tmp_path, client=tcp)
    for index in (False, "k"):
        got = compute(tcp, dg.read_parquet(tmp_path, index=index, client=tcp))
        expected = dd.read_parquet(tmp_path, index=index).compute()
        pd.testing.assert_frame_equal(got, expected, check_index_type=False)


@pytest.mark.parametrize("dtype_backend", [None, "numpy_nullable", "pyarrow"])
@pytest.mark.parametrize("convert_string", [True, False])
def test_the_types_dask_gives(tcp, tmp_path, convert_string, dtype_backend):
    """The host target's columns come in the types ``dd.read_parquet`` gives them, under
    Dask's ``convert-string`` setting (on by default: strings as ``string[pyarrow]``, dates and
    decimals pyarrow-backed) and its ``dtype_backend``, in the meta and in the partitions, so
    that a frame of ours and one of Dask's merge on a string key."""
    n = 40
    table = pa.table(
        {
            "s": pa.array([None if i % 7 == 3 else f"k{i % 9}" for i in range(n)]),
            "ls": pa.array([f"l{i}" for i in range(n)], pa.large_string()),
            "day": pa.array([datetime.date(2024, 1, 1 + i % 28) for i in range(n)]),
            "price": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(9, 2)),
            "i": pa.array([None if i % 5 == 0 else i for i in range(n)], pa.int32()),
            "x": pa.array(np.arange(n) * 0.5),
            "d": pa.array([("red", "blue")[i % 2] for i in range(n)]).dictionary_encode(),
        }
    )
    path = os.fspath(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=10)
    with dask.config.set({"dataframe.convert-string": convert_string}):
        ours = dg.read_parquet(path, dtype_backend=dtype_backend, client=tcp)
        theirs = dd.read_parquet(path, dtype_backend=dtype_backend)
    got, want = compute(tcp, ours), theirs.compute(scheduler="sync")

    # the meta says what the partitions hold (Dask's own says int32 for "i", which holds nulls
    # and so comes as float64); categories unknown in a meta, as in Dask's
    def kinds(dtypes):
        return {c: "category" if t == "category" else t for c, t in dtypes.items()}

    assert kinds(ours.dtypes) == kinds(want.dtypes)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
    joined = ours[["s", "x"]].merge(theirs[["s", "i"]], on="s", how="inner")
    assert joined.dtypes["s"] == want.dtypes["s"]
    assert len(compute(tcp, joined)) == len(want[["s", "x"]].merge(want[["s", "i"]], on="s"))


def test_a_read_leaves_the_processs_convert_string_setting_alone(tcp, tmp_path, monkeypatch):
    """Dask's config is the process's: a read that set ``convert-string`` off while it built
    its collection turned it off for the other threads meanwhile, and two reads in two threads
    could leave it off for good (every later frame's strings then pandas' ``str``). What the
    process's setting is while a read builds its partitions (seen where it counts their
    rows), and after."""
    from dask_gpudirect import collections

    seen = []
    counted = collections.CountedRead.of

    def of(read, rows):
        seen.append(dask.config.get("dataframe.convert-string"))
        return counted(read, rows)

    monkeypatch.setattr(collections.CountedRead, "of", of)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"s": ["a", "b"], "b": [b"x", b"y"], "l": [[1], [2]]}), path)
    with dask.config.set({"dataframe.convert-string": True}):
        df = dg.read_parquet(path, client=tcp)
        assert seen == [True] and dask.config.get("dataframe.convert-string") is True
    assert df.dtypes["s"] == pd.StringDtype("pyarrow")  # as Dask converts strings
    assert (df.dtypes["b"], df.dtypes["l"]) == (np.dtype(object),) * 2  # bytes, lists kept
    got = compute(tcp, df)
    assert list(got["b"]) == [b"x", b"y"] and [list(v) for v in got["l"]] == [[1], [2]]


def test_a_dictionary_columns_categories_are_unknown_in_meta_as_in_dask(tcp, tmp_path):
    """Each file holds its own categories, so Dask's meta says they are unknown
    (``cat.known`` False): what depends on them (``cat.categories``, ``get_dummies``) then asks
    for ``as_known()`` rather than taking none. Computed, the partitions hold their files'."""
    for k, values in enumerate((["p", "q", "p"], ["r", "q", "r"])):
        part = pd.DataFrame({"c": pd.Categorical(values), "v": range(3)})
        part.to_parquet(tmp_path / f"part.{k}.parquet")
    ours, theirs = dg.read_parquet(tmp_path, client=tcp), dd.read_parquet(tmp_path)
    assert not ours.c.cat.known and not theirs.c.cat.known
    assert ours._meta.c.dtype == theirs._meta.c.dtype
    assert sorted(ours.c.cat.as_known().cat.categories) == ["p", "q", "r"]
    got = compute(tcp, ours)
    assert sorted(got.c.astype(str)) == sorted(theirs.compute().c.astype(str))


def test_a_row_group_of_a_dictionary_of_nulls_alone_joins_the_others(tcp, tmp_path):
    """A row group whose dictionary column holds nulls alone, read as a partition of its own:
    its (empty) categories are strings as the others' are, so the partitions concatenate
    (Dask's read with split_row_groups=True fails: "dtype of categories must be the same")."""
    first = pa.table({"id": [0, 1], "c": pa.array(["x", "y"]).dictionary_encode()})
    nulls = pa.table({"id": [2, 3], "c": pa.array([None, None], pa.string()).dictionary_encode()})
    with pq.ParquetWriter(tmp_path / "a.parquet", first.schema) as writer:
        writer.write_table(first)
        writer.write_table(nulls)
    df = dg.read_parquet(tmp_path, split_row_groups=True, client=tcp)
    parts = partitions(tcp, df)
    assert len(parts) == 2
    assert parts[0].c.cat.categories.dtype == parts[1].c.cat.categories.dtype
    got = compute(tcp, df)
    assert got.c.dtype == "category" and got.c.astype(object).tolist()[:2] == ["x", "y"]
    assert got.c.isna().tolist() == [False, False, True, True]


def test_integer_categories_pandas_stored_come_back_as_categories(tcp, tmp_path):
    """pyarrow stores pandas' categorical of integers as plain integers, with pandas' note
    that it was categorical: Dask reads it as categories by that note, and so do we (it came
    back int64, so a shuffle on it put rows elsewhere than Dask's)."""
    pd.DataFrame({"c": pd.Categorical(np.arange(20) % 3), "v": np.arange(20.0)}).to_parquet(
        tmp_path / "a.parquet"
    )
    ours, theirs = dg.read_parquet(tmp_path, client=tcp), dd.read_parquet(tmp_path)
    assert ours._meta.c.dtype == theirs._meta.c.dtype  # category, its categories unknown
    got, expected = compute(tcp, ours), theirs.compute()
    assert got.c.dtype == "category" and got.c.cat.categories.dtype == "int64"
    pd.testing.assert_frame_equal(got, expected, check_categorical=False)
    mine = partitions(tcp, dg.shuffle(ours, "c", npartitions=3, client=tcp))
    dasks = partitions(tcp, theirs.shuffle("c", npartitions=3, shuffle_method="tasks"))
    assert [len(p) for p in mine] == [len(p) for p in dasks]
    # an index of them Dask reads as the integers stored, and so do we
    indexed = tmp_path / "indexed"
    indexed.mkdir()
    index = pd.CategoricalIndex([1, 2, 3] * 2, name="ix")
    pd.DataFrame({"v": np.arange(6.0)}, index=index).to_parquet(indexed / "a.parquet")
    got = compute(tcp, dg.read_parquet(indexed, client=tcp))
    pd.testing.assert_frame_equal(got, dd.read_parquet(indexed).compute())
    assert got.index.dtype == "int64"


def test_filters_on_uint64_values_past_int64(tcp, tmp_path):
    """A uint64 column's largest values (past int64's range) filter and prune row groups, where
    pyarrow, given them as plain ints, overflowed (Dask's read fails so too); one past uint64's
    range is an InputError naming the filter."""
    values = np.array([1, 2**63 + 5, 2**64 - 1, 7], dtype=np.uint64)
    pd.DataFrame({"u": values}).to_parquet(tmp_path / "a.parquet", row_group_size=2)

    def kept(filters):
        return sorted(compute(tcp, dg.read_parquet(tmp_path, filters=filters, client=tcp)).u)

    assert kept([("u", "==", 2**64 - 1)]) == [2**64 - 1]
    assert kept([("u", ">", 2**63)]) == [2**63 + 5, 2**64 - 1]
    assert kept([("u", "in", [7, 2**64 - 1])]) == [7, 2**64 - 1]
    with pytest.raises(dg.InputError, match=r"filter \('u', '>', 18446744073709551616\)"):
        dg.read_parquet(tmp_path, filters=[("u", ">", 2**64)], client=tcp)


def test_a_column_required_in_one_file_and_nullable_in_another_reads_as_in_dask(tcp, tmp_path):
    """Writers differ in marking a column required (``not null``): that alone is no other
    schema. The files read together, with Dask's types (float64 where a file holds nulls)."""
    required = pa.schema([pa.field("v", pa.int64(), nullable=False)])
    pq.write_table(pa.table({"v": [1, 2]}, schema=required), tmp_path / "0.parquet")
    pq.write_table(pa.table({"v": [3, None]}), tmp_path / "1.parquet")
    got = compute(tcp, dg.read_parquet(tmp_path, blocksize="1GiB", client=tcp))
    pd.testing.assert_frame_equal(got, dd.read_parquet(tmp_path).compute())


def with_created_by(path, writer: bytes) -> None:
    """Rewrite ``path``'s footer to say ``writer`` wrote the file (its data unchanged)."""
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length : -8]
    old = pq.read_metadata(path).created_by.encode()
    footer = footer.replace(bytes([len(old)]) + old, bytes([len(writer)]) + writer, 1)
    path.write_bytes(data[: -8 - length] + footer + len(footer).to_bytes(4, "little") + b"PAR1")


@pytest.mark.parametrize(
    "writer", [b"parquet-mr version 1.2.8 (build 1)", b"parquet-mr", b" parquet-mr version 1.0"]
)
def test_files_of_parquet_mr_before_1_2_9_read_as_pyarrow_reads_them(tcp, tmp_path, writer):
    """pyarrow reads 100 bytes past each column chunk of a file parquet-mr 1.2.8 or older
    wrote (its sizes left out a header, PARQUET-816; Arrow trims the writer's name first):
    the read plans them too. They were left out, and a shard's buffer holds only what the
    read planned."""
    path = tmp_path / "old.parquet"
    rng = np.random.default_rng(0)
    table = pa.table({c: rng.random(20_000) for c in "xyz"})
    pq.write_table(table, path, use_dictionary=False, row_group_size=5_000)
    with_created_by(path, writer)
    for columns in (["x"], ["y"], None):
        got = compute(tcp, dg.read_parquet(path, columns=columns, blocksize=1, client=tcp))
        expected = pq.read_table(path, columns=columns).to_pandas()
        pd.testing.assert_frame_equal(got.reset_index(drop=True), expected)
    df = dg.read_parquet(path, split_row_groups=True, client=tcp)
    assert compute(tcp, df.y.sum()) == pytest.approx(table["y"].to_numpy().sum())


def test_a_column_named_like_a_struct_field_reads_alone(tcp, tmp_path):
    """A column ``a.b`` beside a struct ``a`` with a field ``b``: ``columns=["a.b"]`` is that
    column, as pyarrow's read_table gives it (its ParquetFile takes the field by name too)."""
    path = tmp_path / "dotted.parquet"
    rng = np.random.default_rng(0)
    n = 20_000
    field = pa.StructArray.from_arrays([pa.array(rng.random(n))], names=["b"])
    pq.write_table(pa.table({"a": field, "pad": rng.random(n), "a.b": rng.random(n)}), path)
    expected = pq.read_table(path, columns=["a.b"]).to_pandas()
    got = compute(tcp, dg.read_parquet(path, columns=["a.b"], client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected)
    after = dg.read_parquet(path, client=tcp)[["a.b"]]
    pd.testing.assert_frame_equal(compute(tcp, after).reset_index(drop=True), expected)


def test_integer_categories_with_nulls_in_some_files_read_as_in_dask(tcp, tmp_path):
    """pyarrow stores pandas' categorical of integers as plain integers: a file (or row group)
    holding a null decoded them as float64, and its float64 categories joined no other
    partition's int64 ones ("dtype of categories must be the same"). Dask makes them categories
    in pyarrow, in the order their values first appear, of the rows its filters keep."""
    parts = ([1, 2, None, 3], [4, 2, 5, 4], [None] * 4)
    for k, values in enumerate(parts):
        frame = pd.DataFrame({"c": pd.Categorical(values, [1, 2, 3, 4, 5]), "v": np.arange(4.0)})
        frame.to_parquet(tmp_path / f"part.{k}.parquet", index=False, row_group_size=2)
    for kwargs in ({}, {"split_row_groups": True}, {"filters": [("c", ">", 2)]}):
        got = compute(tcp, dg.read_parquet(tmp_path, client=tcp, **kwargs))
        expected = dd.read_parquet(tmp_path, **kwargs).compute()
        assert got.c.cat.categories.dtype == "int64", kwargs
        pd.testing.assert_frame_equal(got, expected, obj=str(kwargs))


@pytest.mark.parametrize("noted", ["first", "second"])
def test_categories_pandas_noted_in_one_file_only_read_by_the_first_files_note(
    tcp, tmp_path, noted
):
    """pandas' categorical of integers is stored as plain integers with pandas' note: files
    of which only some carry the note read by the first file's, as meta and Dask read them
    (the others' partitions were int64 under a category meta, or categories under an int64
    one, and a concat of them failed with no file named)."""
    write_noted_in_one_file(tmp_path, noted)
    for kwargs in ({}, {"filters": [("c", ">", 1)]}, {"blocksize": "1GiB"}):
        df = dg.read_parquet(tmp_path, client=tcp, **kwargs)
        expected = dd.read_parquet(tmp_path, **kwargs)
        assert df.c.dtype == expected.c.dtype
        parts = tcp.gather(tcp.compute(df.to_delayed()))
        assert all((p.c.dtype == "category") == (df.c.dtype == "category") for p in parts)
        got = compute(tcp, df).reset_index(drop=True)  # filtered rows keep their labels
        want = expected.compute().reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want, check_categorical=False)
