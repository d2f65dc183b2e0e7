"""Every bad input of the issue: a clear ``InputError`` in the client that names the file.

Errors that can be known from footers, headers and sizes are raised while planning, before
anything runs on the cluster; a file that changes after planning fails when computed. After
every failure the same cluster still loads a good dataset.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import assert_same_frame, compute, expected_parquet

import dask_gpudirect as dg
from dask_gpudirect.formats import binary, parquet


def table(n: int = 200, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table({"id": ids, "x": ids * 0.5, "s": [f"v{i}" for i in ids]})


def write(path, t: pa.Table | None = None, **kwargs) -> str:
    pq.write_table(table() if t is None else t, path, **kwargs)
    return os.fspath(path)


@pytest.fixture
def good(tmp_path) -> str:
    return write(tmp_path / "good.parquet", row_group_size=50)


@pytest.fixture(autouse=True)
def cluster_keeps_working(tcp, good):
    """After each test, the cluster that saw the failure loads a good dataset."""
    yield
    got = compute(tcp, dg.read_parquet(good, blocksize=1, client=tcp))
    assert_same_frame(got, expected_parquet(good))
    arr = np.arange(12.0).reshape(4, 3)
    np.save(os.path.join(os.path.dirname(good), "good.npy"), arr)
    got = compute(tcp, dg.read_binary(os.path.join(os.path.dirname(good), "good.npy"), client=tcp))
    np.testing.assert_array_equal(got, arr)


def raises_naming(path, *words):
    """``pytest.raises(InputError)`` whose message names ``path`` and each of ``words``."""
    pattern = re.escape(os.fspath(path)) + "".join(f"(?s:.*){re.escape(w)}" for w in words)
    return pytest.raises(dg.InputError, match=pattern)


# --- files that are missing or cannot be read -------------------------------------------


def test_missing_file(tcp, tmp_path, good):
    missing = tmp_path / "missing.parquet"
    with raises_naming(missing, "no such file"):
        dg.read_parquet(missing, client=tcp)
    with raises_naming(missing, "no such file"):
        dg.read_parquet([good, missing], client=tcp)
    with raises_naming(tmp_path / "missing.npy", "no such file"):
        dg.read_binary(tmp_path / "missing.npy", client=tcp)


@pytest.mark.parametrize(
    "spelling", ["{}/a\0b.parquet", "{}/a\0*.parquet", "file://{}/a%00b.parquet"]
)
def test_a_path_with_a_nul_character(tcp, tmp_path, spelling):
    """No file name holds a NUL: said by name, where each worker's ``os.stat`` raised a bare
    ``ValueError: embedded null byte``."""
    path = spelling.format(tmp_path)
    with pytest.raises(dg.InputError, match="NUL character") as info:
        dg.read_parquet(path, client=tcp)
    assert os.fspath(tmp_path) in str(info.value)
    with pytest.raises(dg.InputError, match="NUL character"):
        dg.read_binary([path], dtype="f8", client=tcp)


def test_glob_matching_nothing(tcp, tmp_path):
    pattern = os.path.join(tmp_path, "nothing-*.parquet")
    with raises_naming(pattern, "no files match"):
        dg.read_parquet(pattern, client=tcp)


def test_empty_directory(tcp, tmp_path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)  # only a directory inside: no data files
    with raises_naming(empty, "no files ending in .parq, .parquet, .pq"):
        dg.read_parquet(empty, client=tcp)
    with raises_naming(empty, "no data files"):
        dg.read_binary(empty, dtype="f8", client=tcp)


def test_a_subfolder_removed_while_its_parent_is_listed(tmp_path, monkeypatch):
    """A subfolder another process removes between the listing of its parent and its own is
    left out, as if it had gone before: it made the whole directory "no such file or directory
    on any worker". (The removal is made to come at that moment: the listing is wrapped.)"""
    from dask_gpudirect import discovery

    root = tmp_path / "table"
    root.mkdir()
    write(root / "part-0.parquet")
    (root / "going").mkdir()
    write(root / "going" / "part-1.parquet")
    scandir = os.scandir

    def scandir_then_remove(path):
        with scandir(path) as listed:
            entries = list(listed)
        if os.fspath(path) == os.fspath(root):
            (root / "going" / "part-1.parquet").unlink()
            (root / "going").rmdir()
        return contextlib.nullcontext(entries)

    monkeypatch.setattr(discovery.os, "scandir", scandir_then_remove)
    found = discovery.view(os.fspath(root), discovery.Listing((".parquet",), recursive=True))
    assert found.kind == discovery.DIRECTORY
    assert [entry[0] for entry in found.files] == [os.fspath(root / "part-0.parquet")]


def test_directory_where_a_file_is_expected(tmp_path):
    """Planning a directory as a file says it is a directory (paths normally expand them)."""
    folder = tmp_path / "table.parquet"
    folder.mkdir()
    with raises_naming(folder, "directory"):
        parquet.plan([os.fspath(folder)], None, None, 1 << 20, "host")
    with raises_naming(folder, "directory"):
        binary.plan([os.fspath(folder)], "f8", None, 1 << 20, "host")


@pytest.mark.skipif(
    os.geteuid() == 0, reason="running as root: chmod 000 does not stop root from reading"
)
def test_unreadable_file(tcp, tmp_path, good):
    locked = write(tmp_path / "locked.parquet")
    os.chmod(locked, 0)
    try:
        with raises_naming(locked, "permission denied"):
            dg.read_parquet([good, locked], client=tcp)
        raw = tmp_path / "locked.raw"
        np.arange(10.0).tofile(raw)
        os.chmod(raw, 0)
        with raises_naming(raw, "permission denied"):
            dg.read_binary(raw, dtype="f8", client=tcp)
    finally:
        os.chmod(locked, 0o644)


def refuse_opens(refuse: bool) -> None:
    """On a worker: make the OS refuse to open files named ``locked.*`` (or stop)."""

    def refusing(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)).startswith("locked."):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return ORIGINAL_OPEN(path, *args, **kwargs)

    os.open = refusing if refuse else ORIGINAL_OPEN


ORIGINAL_OPEN = os.open


def test_permission_denied_while_planning(tcp, tmp_path, good):
    """What planning on the workers says when their OS refuses a file (simulated inside the
    worker processes, since root may read anything), raised in the client."""
    locked = write(tmp_path / "locked.parquet")
    raw = tmp_path / "locked.raw"
    np.arange(10.0).tofile(raw)
    tcp.run(refuse_opens, True)
    try:
        with raises_naming(locked, "permission denied"):
            dg.read_parquet(locked, client=tcp)
        with raises_naming(raw, "permission denied"):
            dg.read_binary(raw, dtype="f8", client=tcp)
    finally:
        tcp.run(refuse_opens, False)
    assert len(dg.read_parquet(locked, client=tcp).compute()) > 0  # the workers read it again


def test_unreadable_file_in_a_directory(tcp, tmp_path):
    """A file the workers may not open, found by listing a directory or a pattern, fails the
    read naming it: it is not left out of the result."""
    write(tmp_path / "good.parquet")
    locked = write(tmp_path / "locked.parquet")
    np.arange(10.0).tofile(tmp_path / "good.raw")
    np.arange(10.0).tofile(raw := tmp_path / "locked.raw")
    tcp.run(refuse_opens, True)
    try:
        with raises_naming(locked, "permission denied"):
            dg.read_parquet(tmp_path, client=tcp)
        with raises_naming(raw, "permission denied"):
            dg.read_binary(os.fspath(tmp_path / "*.raw"), dtype="f8", client=tcp)
    finally:
        tcp.run(refuse_opens, False)


# --- Parquet files that are not whole -----------------------------------------------------


def test_empty_parquet_file(tcp, tmp_path, good):
    empty = tmp_path / "empty.parquet"
    empty.touch()
    with raises_naming(empty, "empty file"):
        dg.read_parquet([good, empty], client=tcp)


@pytest.mark.parametrize("keep", [0.5, 0.99, 7])
def test_truncated_parquet(tcp, tmp_path, good, keep):
    """Cut anywhere: in the data, inside the footer, or before the footer length."""
    path = write(tmp_path / "cut.parquet", row_group_size=50)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep) if keep < 1 else keep)
    with raises_naming(path, "Parquet"):
        dg.read_parquet([good, path], client=tcp)


@pytest.mark.parametrize(
    "damage",
    ["magic", "footer-length", "footer-bytes"],
)
def test_corrupt_parquet_footer(tcp, tmp_path, damage):
    path = write(tmp_path / "bad.parquet")
    data = bytearray(open(path, "rb").read())
    footer_length = int.from_bytes(data[-8:-4], "little")
    if damage == "magic":
        data[-4:] = b"XXXX"
    elif damage == "footer-length":
        data[-8:-4] = (len(data) * 4).to_bytes(4, "little")
    else:
        start = len(data) - 8 - footer_length
        data[start : start + footer_length] = bytes(footer_length)
    open(path, "wb").write(bytes(data))
    with raises_naming(path, "Parquet"):
        dg.read_parquet(path, client=tcp)


def test_corrupt_parquet_data_pages(tcp, tmp_path):
    """A sound footer over garbled pages: planning cannot know, computing names the file."""
    path = write(tmp_path / "garbled.parquet", table(20_000), row_group_size=10_000)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(2)
    with open(path, "r+b") as f:
        f.seek(chunk.data_page_offset)
        f.write(b"\xff" * 200)
    df = dg.read_parquet(path, blocksize=1, client=tcp)
    with raises_naming(path, "cannot decode"):
        compute(tcp, df)


def test_not_a_parquet_file(tcp, tmp_path):
    path = tmp_path / "notes.parquet"
    path.write_text("this is text, not Parquet\n" * 10)
    with raises_naming(path, "not a valid Parquet file"):
        dg.read_parquet(path, client=tcp)


@pytest.mark.parametrize(
    ("other", "difference"),
    [
        (pa.table({"id": np.arange(5), "x": np.arange(5) * 0.5}), "(only there: s)"),
        (
            pa.table({"id": np.arange(5), "x": ["a"] * 5, "s": ["a"] * 5}),
            "(x: string here, double there)",
        ),
        (
            pa.table({"id": np.arange(5), "x": np.arange(5) * 0.5, "t": ["a"] * 5}),
            "(only here: t; only there: s)",
        ),
        (
            pa.table(
                {
                    "id": np.arange(5),
                    "x": pa.array([[1]] * 5, pa.list_(pa.field("item", pa.int64(), False))),
                    "s": ["a"] * 5,
                }
            ),
            "(x: list<element: int64 not null> here, double there)",
        ),
    ],
    ids=["missing-column", "other-type", "other-name", "nested-type"],
)
def test_schema_differs(tcp, tmp_path, good, other, difference):
    """Named by file, with what differs said first (a wide schema hides it), then both."""
    odd = write(tmp_path / "odd.parquet", other)
    with raises_naming(odd, "schema differs", good, difference):
        dg.read_parquet([good, odd], client=tcp)
    with raises_naming(odd, "schema differs"):
        dg.read_parquet(tmp_path, client=tcp)  # good.parquet sorts first


# --- binary files that are not whole ------------------------------------------------------


def test_raw_not_whole_records(tcp, tmp_path):
    path = tmp_path / "odd.raw"
    path.write_bytes(bytes(8 * 10 + 3))
    with raises_naming(path, "83 bytes is not a whole number of 8-byte records"):
        dg.read_binary(path, dtype="f8", client=tcp)
    with raises_naming(path, "not a whole number of 24-byte records"):
        dg.read_binary(path, dtype="i4", shape=(3, 2), client=tcp)


def test_empty_binary_files(tcp, tmp_path):
    raw = tmp_path / "empty.raw"
    raw.touch()
    with raises_naming(raw, "empty file"):
        dg.read_binary(raw, dtype="f8", client=tcp)
    npy = tmp_path / "empty.npy"
    npy.touch()
    with raises_naming(npy, ".npy"):
        dg.read_binary(npy, client=tcp)


@pytest.mark.parametrize(
    "header",
    [
        b"\x93NUMPY\x01\x00",  # magic, then nothing
        b"\x93NUMPY\x09\x00\x10\x00{'descr': '<f8'}",  # unknown version
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f8'    \n",  # not a valid dict
        b"\x93NUMPY\x01\x00\x40\x00{'descr': '<f8', 'fortran_order': False}" + b" " * 10 + b"\n",
        b"\x93NUMPY\x01\x00\x30\x00{'descr': 'zz', 'fortran_order': False, 'shape': (3,)}",
        b"\x93NUMPY\x01\x00\x39\x00{'descr': '<i4', 'fortran_order': False, 'shape': (-3,)}\n",
    ],
    ids=["no-header", "bad-version", "bad-dict", "no-shape", "bad-descr", "negative-size"],
)
def test_bad_npy_header(tcp, tmp_path, header):
    path = tmp_path / "bad.npy"
    path.write_bytes(header + bytes(64))
    with raises_naming(path, ".npy"):
        dg.read_binary(path, client=tcp)


def test_truncated_npy(tcp, tmp_path):
    path = tmp_path / "short.npy"
    np.save(path, np.arange(100.0))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 16)
    with raises_naming(path, "truncated .npy"):
        dg.read_binary(path, client=tcp)


@pytest.mark.parametrize("how", ["folder", "glob"])
def test_a_dangling_link_in_a_dataset_is_named(tcp, tmp_path, good, how):
    """As Dask: its rows were left out without a word."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(good, data / "part.0.parquet")
    os.symlink(tmp_path / "gone.parquet", data / "part.1.parquet")
    path = data if how == "folder" else data / "*.parquet"
    with raises_naming(data / "part.1.parquet", "no such file"):
        compute(tcp, dg.read_parquet(path, client=tcp))


def test_object_dtype(tcp, tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with raises_naming(path, "not a fixed-size type"):
        dg.read_binary(path, client=tcp)
    raw = tmp_path / "objects.raw"
    raw.write_bytes(bytes(64))
    # an option wrong whatever the file: said before any worker is asked
    with pytest.raises(dg.InputError, match="dtype object is not a fixed-size type"):
        dg.read_binary(raw, dtype=object, client=tcp)
    with pytest.raises(dg.InputError, match="bad dtype 'not-a-dtype'"):
        dg.read_binary(raw, dtype="not-a-dtype", client=tcp)


def test_binary_files_disagree(tcp, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 3), "f8"))
    np.save(tmp_path / "b.npy", np.zeros((4, 2), "f8"))
    with raises_naming(tmp_path / "b.npy", "records of shape"):
        dg.read_binary(tmp_path, client=tcp)


@pytest.mark.parametrize("stray", ["SUMS.txt", "zz.raw"], ids=["raw first", "raw last"])
def test_a_raw_file_among_npy_files(tcp, tmp_path, stray):
    """A file of no .npy header in a folder of .npy files is not read as records, even where
    ``dtype=`` (for .npy files, a check of their headers) would let it: it is named. Without
    ``dtype=``, the error does not stop at "pass dtype=", which only led to the refusal above."""
    folder = tmp_path / "arrays"
    folder.mkdir()
    np.save(folder / "part0.npy", np.arange(4, dtype="f4"))
    (folder / stray).write_bytes(b"ok: 2 parts\n")  # 12 bytes: three float32 records
    with raises_naming(folder / stray, "raw file", "part0.npy", "one read takes one kind"):
        dg.read_binary(folder, dtype="f4", client=tcp)
    with raises_naming(folder / stray, "pass dtype=", "one read takes .npy files or raw ones"):
        dg.read_binary(folder, client=tcp)


# --- options that cannot apply --------------------------------------------------------------


def test_unknown_column(tcp, good):
    with raises_naming(good, "unknown column", "nope"):
        dg.read_parquet(good, columns=["id", "nope"], client=tcp)


def test_a_column_name_stored_twice(tcp, tmp_path):
    """A file whose schema repeats a name (pyarrow writes one; pandas and Dask read none) is
    refused naming the file and the name; the columns left out with ``columns=`` are read."""
    columns = [pa.array(range(5)), pa.array(np.arange(5) * 1.5), pa.array(range(5))]
    path = write(tmp_path / "twice.parquet", pa.Table.from_arrays(columns, names=["a", "a", "b"]))
    with raises_naming(path, "['a']", "more than once", "columns="):
        dg.read_parquet(path, client=tcp)
    got = compute(tcp, dg.read_parquet(path, columns=["b"], client=tcp))
    assert got["b"].tolist() == list(range(5))


@pytest.mark.parametrize("value", [None, float("nan")], ids=["None", "NaN"])
def test_a_comparison_with_a_null_says_how_to_test_for_nulls(tcp, good, value):
    """``==`` None or NaN would keep no row: refused, naming the value and the null test."""
    what = "None" if value is None else "NaN"
    with pytest.raises(dg.InputError, match=rf"nothing equals {what}; use \('id', 'is', None\)"):
        dg.read_parquet(good, filters=[("id", "==", value)], client=tcp)


def test_filter_on_unknown_column(tcp, good):
    with raises_naming(good, "unknown column", "nope"):
        dg.read_parquet(good, filters=[("nope", ">", 1)], client=tcp)


@pytest.mark.parametrize(
    "filters",
    [
        [("id", "~", 1)],
        [("id", ">")],
        [("id", "in", 3)],
        [("id", "==", None)],
        [("id", "is", 3)],
        "id > 3",
        [("id", ">", np.datetime64("2024-01-02T12:00"))],  # minutes: no pyarrow scalar
        [[("id", ">", 3)], []],  # an empty AND-list kept every row
        [[("id", ">", 3)], "id < 1"],
    ],
    ids=[
        "operator",
        "two-items",
        "in-scalar",
        "equals-none",
        "is-not-none",
        "string",
        "value",
        "empty-and",
        "and-of-a-string",
    ],
)
def test_malformed_filters(tcp, good, filters):
    with pytest.raises(dg.InputError, match="filter"):
        dg.read_parquet(good, filters=filters, client=tcp)


def test_filter_of_wrong_type(tcp, good):
    with raises_naming(good, "filters"):
        dg.read_parquet(good, filters=[("s", ">", 3)], client=tcp)


def test_filter_the_decoded_values_refuse(tcp, tmp_path):
    """A filter the footer's statistics take but the decoded values do not (a Timestamp
    against pandas' ``datetime.date`` objects of a date32 column): the compute raises an
    error naming the file and the filter, not pandas' bare TypeError from a worker; the
    file reads with a filter of its own type."""
    path = tmp_path / "dates.parquet"
    days = [datetime.date(2024, 1, 1) + datetime.timedelta(days=k) for k in range(40)]
    pq.write_table(pa.table({"d": pa.array(days, pa.date32()), "v": range(40)}), path)
    df = dg.read_parquet(path, filters=[("d", ">", pd.Timestamp("2024-02-01"))], client=tcp)
    with raises_naming(path, "filter", "does not apply to the column's values"):
        compute(tcp, df)
    kept = dg.read_parquet(path, filters=[("d", ">", datetime.date(2024, 2, 1))], client=tcp)
    assert compute(tcp, kept)["v"].tolist() == list(range(32, 40))


@pytest.mark.parametrize("blocksize", ["lots", 0, -5, "-1MiB", [1]])
def test_bad_blocksize(tcp, tmp_path, good, blocksize):
    with pytest.raises(dg.InputError, match=re.escape(f"bad blocksize {blocksize!r}")):
        dg.read_parquet(good, blocksize=blocksize, client=tcp)
    raw = tmp_path / "r.raw"
    np.arange(10.0).tofile(raw)
    with pytest.raises(dg.InputError, match=re.escape(f"bad blocksize {blocksize!r}")):
        dg.read_binary(raw, dtype="f8", blocksize=blocksize, client=tcp)


def test_a_bad_blocksize_in_the_config_names_its_key(tcp, tmp_path, good):
    """A blocksize from ``gpudirect.parquet.blocksize`` or ``gpudirect.binary.blocksize``
    (the call gave none): the error names that key, which the user set, not an argument."""
    raw = tmp_path / "r.raw"
    np.arange(10.0).tofile(raw)
    for key, read in [
        ("gpudirect.parquet.blocksize", lambda: dg.read_parquet(good, client=tcp)),
        ("gpudirect.binary.blocksize", lambda: dg.read_binary(raw, dtype="f8", client=tcp)),
    ]:
        with dask.config.set({key: "lots"}):
            with pytest.raises(dg.InputError, match=re.escape(f"bad {key} 'lots'")):
                read()


def test_bad_target(tcp, good):
    with pytest.raises(dg.InputError, match="unknown target 'gpu'"):
        dg.read_parquet(good, target="gpu", client=tcp)


@pytest.mark.parametrize("shape", [(-1,), 4.0, np.array(4.0), "4", (2, None)])
def test_bad_record_shape(tcp, tmp_path, shape):
    """Refused in the caller's process, naming the shape (a float or a 0-d array raised a
    bare TypeError from the workers' planning)."""
    raw = tmp_path / "r.raw"
    np.arange(10.0).tofile(raw)
    with pytest.raises(dg.InputError, match="bad shape"):
        dg.read_binary(raw, dtype="f8", shape=shape, client=tcp)


def test_dtype_numpy_refuses_with_a_value_error(tcp, tmp_path):
    raw = tmp_path / "r.raw"
    np.arange(10.0).tofile(raw)
    with pytest.raises(dg.InputError, match="bad dtype"):
        dg.read_binary(raw, dtype=("f4", -1), client=tcp)


def test_numpy_integer_sizes(tcp, tmp_path, good):
    """A blocksize computed with NumPy (``itemsize * n``) is a size, as a Python int is."""
    raw = tmp_path / "r.raw"
    np.arange(10.0).tofile(raw)
    x = dg.read_binary(raw, dtype="f8", blocksize=np.int64(8) * 5, client=tcp)
    assert x.chunks[0] == (5, 5)
    assert_same_frame(
        compute(tcp, dg.read_parquet(good, blocksize=np.int64(10**6), client=tcp)),
        compute(tcp, dg.read_parquet(good, client=tcp)),
    )


def test_a_local_scheduler_is_told_to_use_the_cluster(tcp, tmp_path):
    """Computed with Dask's local schedulers (as one debugs a graph), a read says it runs on
    a distributed cluster's workers (Distributed's bare "No worker found" before)."""
    raw = tmp_path / "r.raw"
    np.arange(10.0).tofile(raw)
    x = dg.read_binary(raw, dtype="f8", client=tcp)
    for scheduler in ("sync", "threads"):
        with pytest.raises(dg.ClusterError, match="run on the workers of a distributed cluster"):
            x.compute(scheduler=scheduler)


# --- files that change after planning -------------------------------------------------------


def test_parquet_truncated_after_planning(tcp, tmp_path):
    path = write(tmp_path / "shrinks.parquet", table(2000), row_group_size=500)
    df = dg.read_parquet(path, blocksize=1, client=tcp)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with raises_naming(path, "changed since it was planned"):
        compute(tcp, df)


def test_binary_truncated_after_planning(tcp, tmp_path):
    path = tmp_path / "shrinks.npy"
    np.save(path, np.arange(10_000.0))
    x = dg.read_binary(path, blocksize=8000, client=tcp)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8 * 1500)
    with raises_naming(path, "changed since it was planned"):
        compute(tcp, x)


def test_file_removed_after_planning(tcp, tmp_path):
    path = write(tmp_path / "gone.parquet")
    df = dg.read_parquet(path, client=tcp)
    os.remove(path)
    with raises_naming(path, "no such file"):
        compute(tcp, df)
