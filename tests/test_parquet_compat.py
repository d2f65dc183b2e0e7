"""``dg.read_parquet`` as a drop-in for ``dd.read_parquet``: the paths, folders and arguments
Dask users pass, on the host target with files the tests write."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest
from util import compute

import dask_gpudirect as dg


def frame(start: int, n: int = 50) -> pd.DataFrame:
    ids = np.arange(start, start + n)
    return pd.DataFrame({"id": ids, "x": ids * 0.5, "s": [f"v{i}" for i in ids]})


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


def test_a_folder_takes_its_parquet_files(tcp, tmp_path):
    """As Dask: files ending in .parquet, .parq or .pq; not README.txt, _SUCCESS, .crc files."""
    write(tmp_path / "part-0.parquet", frame(0))
    write(tmp_path / "part-1.parq", frame(50))
    write(tmp_path / "part-2.PQ", frame(100))
    (tmp_path / "README.txt").write_text("what this data is\n")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / ".part-0.parquet.crc").write_bytes(b"\x00" * 8)
    got = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), frame(0, 150))

    only = compute(tcp, dg.read_parquet(tmp_path, parquet_file_extension=".parq", client=tcp))
    pd.testing.assert_frame_equal(only.reset_index(drop=True), frame(50))
    readme = os.fspath(tmp_path / "README.txt")
    with pytest.raises(dg.InputError, match=f"{readme}: not a valid Parquet file"):
        dg.read_parquet(tmp_path, parquet_file_extension=None, client=tcp)  # every file


def test_a_folder_without_parquet_files_says_so(tcp, tmp_path):
    (tmp_path / "README.txt").write_text("no data yet\n")
    with pytest.raises(dg.InputError, match="no files ending in .parquet, .pq") as info:
        dg.read_parquet(tmp_path, parquet_file_extension=(".parquet", ".pq"), client=tcp)
    assert os.fspath(tmp_path) in str(info.value)
    with pytest.raises(dg.InputError, match="parquet_file_extension"):
        dg.read_parquet(tmp_path, parquet_file_extension=("",), client=tcp)


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


@pytest.mark.parametrize(
    "url", ["s3://bucket/data.parquet", "gs://bucket/data", "https://example.com/x.parquet"]
)
def test_remote_urls_are_refused_by_name(tcp, url):
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
        ({"split_row_groups": True}, "split_row_groups= is not supported: partitions follow"),
        ({"storage_options": {"anon": True}}, "storage_options= is not supported: remote"),
        ({"calculate_divisions": True}, "calculate_divisions= is not supported"),
        ({"dtype_backend": "pyarrow"}, "dtype_backend= is not supported"),
        ({"index": "id"}, "index='id' is not supported yet"),
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
    with pytest.raises(TypeError, match="unexpected keyword argument 'colums'"):
        dg.read_parquet(path, colums=["x"], client=tcp)
