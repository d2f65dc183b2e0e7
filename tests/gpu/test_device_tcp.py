"""Device-target round trips on ``dg.LocalCUDACluster`` over tcp: cuDF / CuPy equal pyarrow / NumPy.

One cluster for the module (``cuda_tcp``). The plugin checks come first: they read the worker's
kvikio settings before any read could change them.
"""

from __future__ import annotations

import datetime
import os

import gpu_helpers as h
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import (
    KEYS_IN_OTHER_ORDERS,
    OTHER_INDEX_IDS,
    OTHER_INDEXES,
    write_index_named_by_the_empty_string,
    write_noted_in_one_file,
    write_one_row_folders,
    write_other_indexes,
)

import dask_gpudirect as dg

pytestmark = pytest.mark.gpu


def compute(client, collection):
    return client.compute(collection).result()


# --- the cluster and the plugin ------------------------------------------------------------------


def test_plugin_kept_with_dask_cuda_plugins(cuda_tcp):
    h.check_cluster(cuda_tcp, threads=h.PLUGIN_THREADS)


def test_plugin_configured_kvikio(cuda_tcp):
    """GPUDirectPlugin(threads=4) set the worker's kvikio thread pool at setup."""
    assert set(cuda_tcp.run(h.kvikio_threads).values()) == {h.PLUGIN_THREADS}


def test_target_none_is_device(cuda_tcp, parquet_dir, tmp_path):
    import cudf
    import cupy

    directory, _ = parquet_dir
    ddf = dg.read_parquet(directory, client=cuda_tcp)
    assert isinstance(ddf._meta, cudf.DataFrame)
    assert isinstance(compute(cuda_tcp, ddf.partitions[0]), cudf.DataFrame)
    np.save(tmp_path / "a.npy", np.arange(10, dtype="i4"))
    arr = dg.read_binary(str(tmp_path / "a.npy"), client=cuda_tcp)
    assert isinstance(arr._meta, cupy.ndarray)
    h.assert_same_array(compute(cuda_tcp, arr), np.arange(10, dtype="i4"))


# --- Parquet -------------------------------------------------------------------------------------


def test_parquet_all_columns(cuda_tcp, parquet_dir):
    directory, paths = parquet_dir
    ddf = dg.read_parquet(directory, blocksize="1GiB", target="device", client=cuda_tcp)
    assert ddf.npartitions == 1 < len(paths)  # the small files joined on the device, in order
    got = compute(cuda_tcp, ddf)
    assert type(got).__module__.startswith("cudf")
    h.assert_same_table(h.cudf_to_arrow(got), h.expected_parquet(paths))


def test_parquet_each_row_group_a_partition(cuda_tcp, parquet_dir):
    import cudf

    directory, paths = parquet_dir
    ddf = dg.read_parquet(directory, blocksize=1, target="device", client=cuda_tcp)
    assert ddf.npartitions == h.PARQUET_FILES * (h.ROWS_PER_FILE // h.ROW_GROUP)
    parts = cuda_tcp.gather(cuda_tcp.compute(ddf.to_delayed()))
    assert all(isinstance(p, cudf.DataFrame) and len(p) == h.ROW_GROUP for p in parts)
    got = cudf.concat(parts, ignore_index=True)
    h.assert_same_table(h.cudf_to_arrow(got), h.expected_parquet(paths))
    assert len(ddf) == len(got)  # from the footers, on the cuDF meta too


@pytest.mark.parametrize(
    "columns",
    [["s"], ["dec", "dec38"], ["l", "i"], ["cat", "ts", "ts_ms", "b"], ["f", "i32"]],
    ids=lambda c: "+".join(c),
)
def test_parquet_projection(cuda_tcp, parquet_dir, columns):
    directory, paths = parquet_dir
    ddf = dg.read_parquet(directory, columns=columns, target="device", client=cuda_tcp)
    assert list(ddf.columns) == columns
    got = h.cudf_to_arrow(compute(cuda_tcp, ddf))
    h.assert_same_table(got, h.expected_parquet(paths, columns=columns))


FILTERS = {
    "range": [("i", ">=", 2500), ("i", "<", 7000)],
    "or": [[("s", "==", "s1-x")], [("i32", "<", -495)]],
    "in": [("i32", "in", [1, 2, 3, -500]), ("f", "!=", 0.25)],
    "category": [("cat", "==", "red"), ("i", ">=", 4000)],
    "category-order": [("cat", ">=", "green"), ("i", "<", 6000)],  # by the values, as pyarrow
    "not-in": [("s", "not in", ["s0-", "s2-xx"]), ("i", "<", 3000)],
    "timestamp": [("ts", ">=", datetime.datetime(2024, 1, 1, 1, 0, 0)), ("i", "<", 5000)],
}


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_parquet_filters(cuda_tcp, parquet_dir, name):
    directory, paths = parquet_dir
    filters = FILTERS[name]
    ddf = dg.read_parquet(directory, filters=filters, target="device", client=cuda_tcp)
    expected = h.expected_parquet(paths, filters=filters)
    assert expected.num_rows  # the case tests something
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_tcp, ddf)), expected)


def test_float_filter_values_on_a_float32_column(cuda_tcp, tmp_path):
    """cuDF's float32 column keeps the rows pyarrow keeps: compared with a Python float in
    float64, ``in`` with its values cast to float32 (tests/test_parquet.py, on the host)."""
    path = str(tmp_path / "f32.parquet")
    pq.write_table(pa.table({"f": np.array([0.05, 0.1, 1 / 3, 0.5], dtype=np.float32)}), path)
    for filters in ([("f", ">", 1 / 3)], [("f", "==", 0.1)], [("f", "in", [0.1])]):
        ddf = dg.read_parquet(path, filters=filters, target="device", client=cuda_tcp)
        got = compute(cuda_tcp, ddf).f.to_arrow().to_pylist()
        assert got == pq.read_table(path, filters=filters).column("f").to_pylist(), filters


def test_len_of_a_filtered_read_counts_the_kept_rows(cuda_tcp, parquet_dir):
    """A filter left to drop rows after decoding: ``len`` reads, and counts what cuDF kept."""
    directory, paths = parquet_dir
    for name, filters in FILTERS.items():
        ddf = dg.read_parquet(directory, filters=filters, target="device", client=cuda_tcp)
        assert len(ddf) == h.expected_parquet(paths, filters=filters).num_rows, name


def test_auto_blocksize_joins_small_files_into_one_partition_a_worker(cuda_tcp, tmp_path):
    """On the device target "auto" joins small files down to one partition per worker (one
    libcudf call each), in file order; the host target keeps two (tests/test_parquet.py)."""
    paths = []
    for i in range(12):
        paths.append(str(tmp_path / f"s-{i:02d}.parquet"))
        pq.write_table(h.parquet_table(i * 100, 100), paths[-1])
    ddf = dg.read_parquet(paths, target="device", client=cuda_tcp)
    assert ddf.npartitions == len(cuda_tcp.nthreads())
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_tcp, ddf)), h.expected_parquet(paths))


def test_parquet_filters_prune_row_groups(cuda_tcp, parquet_dir):
    """Statistics prune: only the row groups that can hold i in [1000, 2000) are read; the two
    files ruled out whole make no partition of their own (as in Dask): they join the one with
    rows, whose task only checks their footers."""
    directory, paths = parquet_dir
    filters = [("i", ">=", 1000), ("i", "<", 2000)]
    ddf = dg.read_parquet(directory, filters=filters, blocksize=1, target="device", client=cuda_tcp)
    assert ddf.npartitions == 1
    got = h.cudf_to_arrow(compute(cuda_tcp, ddf))
    h.assert_same_table(got, h.expected_parquet(paths, filters=filters))


def test_parquet_projection_and_filter_on_other_column(cuda_tcp, parquet_dir):
    directory, paths = parquet_dir
    filters = [("b", "==", True), ("i", "<", 4000)]
    ddf = dg.read_parquet(
        directory, columns=["s", "l"], filters=filters, target="device", client=cuda_tcp
    )
    assert list(ddf.columns) == ["s", "l"]
    expected = h.expected_parquet(paths, columns=["s", "l"], filters=filters)
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_tcp, ddf)), expected)


def test_parquet_filter_matching_nothing(cuda_tcp, parquet_dir):
    directory, _ = parquet_dir
    ddf = dg.read_parquet(
        directory, columns=["i", "s"], filters=[("i", ">", 10**9)], target="device", client=cuda_tcp
    )
    got = h.cudf_to_arrow(compute(cuda_tcp, ddf))
    assert got.column_names == ["i", "s"] and got.num_rows == 0


def test_parquet_single_file_and_list(cuda_tcp, parquet_dir):
    _, paths = parquet_dir
    for arg, files in ((paths[1], [paths[1]]), ([paths[2], paths[0]], [paths[2], paths[0]])):
        ddf = dg.read_parquet(arg, target="device", client=cuda_tcp)
        h.assert_same_table(h.cudf_to_arrow(compute(cuda_tcp, ddf)), h.expected_parquet(files))


def test_parquet_many_small_files_in_one_partition_match_cudf(cuda_tcp, tmp_path):
    """More files than one libcudf call reads (RUN_FILES) joined into one partition: the same
    rows, in file order, as ``cudf.read_parquet`` of the list gives."""
    import cudf

    from dask_gpudirect.formats.parquet import RUN_FILES

    paths = []
    for i in range(RUN_FILES + 44):
        paths.append(str(tmp_path / f"small-{i:04d}.parquet"))
        pq.write_table(h.parquet_table(i * 7, 7), paths[-1])
    ddf = dg.read_parquet(paths, blocksize="1GiB", target="device", client=cuda_tcp)
    assert ddf.npartitions == 1
    expected = h.cudf_to_arrow(cudf.read_parquet(paths))
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_tcp, ddf)), expected)


def test_parquet_joined_partition_names_the_corrupt_file(cuda_tcp, tmp_path):
    """One libcudf call decodes a joined partition; where one of its files holds garbage pages
    (its footer intact), the error names that file, not the first of the call."""
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"p-{i}.parquet"))
        pq.write_table(h.parquet_table(i * 1000, 1000), paths[-1], compression="snappy")
    with open(paths[2], "r+b") as f:  # the first column chunk's page header and data
        f.seek(4)
        f.write(b"\xff" * 512)
    ddf = dg.read_parquet(paths, blocksize="1GiB", target="device", client=cuda_tcp)
    assert ddf.npartitions == 1
    with pytest.raises(dg.InputError) as info:
        compute(cuda_tcp, ddf)
    assert info.value.path == paths[2], str(info.value)


def test_parquet_hive_folders_and_range_index_joined_match_the_host(cuda_tcp, tmp_path):
    """Hive partition columns (categories on the device) and the RangeIndex pandas stored, in a
    partition of several files: the device gives what the host target gives."""
    import pandas as pd

    for year in (2023, 2024):
        for month in (1, 2):
            folder = tmp_path / f"year={year}" / f"month={month}"
            folder.mkdir(parents=True)
            start = (year - 2023) * 200 + month * 50
            frame = pd.DataFrame({"k": range(start, start + 50), "v": [month * 0.5] * 50})
            frame.index = pd.RangeIndex(start, start + 50)
            frame.to_parquet(folder / "part-0.parquet")
    args = dict(blocksize="1GiB", filters=[("month", "==", 2)], client=cuda_tcp)
    device = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="device", **args))
    host = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", **args))
    got = device.to_pandas()
    assert list(got.columns) == list(host.columns) == ["k", "v", "year", "month"]
    assert got.index.tolist() == host.index.tolist()
    for column in host.columns:
        assert got[column].astype(str).tolist() == host[column].astype(str).tolist(), column
    assert str(got["year"].dtype) == str(host["year"].dtype) == "category"


def test_parquet_string_and_null_hive_folders_in_one_run_match_the_host(cuda_tcp, tmp_path):
    """A partition of files from many string-valued folders, one of them the null folder
    (``__HIVE_DEFAULT_PARTITION__``), decoded in one libcudf call: each file's value on its own
    rows, as the host target gives them."""
    import pandas as pd

    for i, region in enumerate(("eu", "us", "__HIVE_DEFAULT_PARTITION__", "apac")):
        folder = tmp_path / f"region={region}"
        folder.mkdir()
        pd.DataFrame({"k": range(i * 10, i * 10 + 10)}).to_parquet(folder / "part-0.parquet")
    args = dict(blocksize="1GiB", client=cuda_tcp)
    device = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="device", **args))
    host = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", **args))
    got = device.to_pandas().sort_values("k", ignore_index=True)
    want = host.sort_values("k", ignore_index=True)
    assert got.k.tolist() == want.k.tolist() == list(range(40))
    assert got.region.astype(object).where(got.region.notna(), None).tolist() == (
        want.region.astype(object).where(want.region.notna(), None).tolist()
    )
    assert sorted(got.region.cat.categories) == sorted(want.region.cat.categories)


def test_parquet_hive_keys_through_dot_dot_and_in_another_order_match_the_host(cuda_tcp, tmp_path):
    """Hive keys as tests/test_parquet_hive.py reads them, on the device: ``year=2023/../
    year=2024`` has the key of the folder it leads to (2024; ``year == 2023`` keeps nothing),
    and folders of the keys ``a`` and ``b`` in either order are one partitioning, the columns
    in the first file's order. The device builds the key columns itself (a run of files from
    many folders in one libcudf call, with ``1GiB``): the same rows and types as the host."""
    dots, orders = tmp_path / "dots", tmp_path / "orders"
    write_one_row_folders(dots, [(f"year={year}", year) for year in (2023, 2024)])
    write_one_row_folders(orders, KEYS_IN_OTHER_ORDERS)
    through = str(dots / "year=2023" / ".." / "year=2024")
    cases = [
        (through, None, [[2024, 2024]]),
        (through, [("year", "==", 2023)], []),
        (str(orders), None, [[1, 1, "x"], [2, 2, "y"], [3, 3, "z"]]),
        (str(orders), [("b", "==", "y")], [[2, 2, "y"]]),
    ]
    for blocksize in (1, "1GiB"):
        for path, filters, rows in cases:
            args = dict(filters=filters, blocksize=blocksize, client=cuda_tcp)
            device = dg.read_parquet(path, target="device", **args)
            got = compute(cuda_tcp, device).to_pandas().sort_values("x")
            host = compute(cuda_tcp, dg.read_parquet(path, target="host", **args)).sort_values("x")
            case = (path, filters, blocksize)
            assert list(device.columns) == list(got.columns) == list(host.columns), case
            assert got.astype(object).values.tolist() == rows, case
            assert host.astype(object).values.tolist() == rows, case
            types = [str(t) for t in host.dtypes]
            assert [str(t) for t in got.dtypes] == types, case
            assert [str(t) for t in device._meta.dtypes] == types, case
            for key in ("year", "a", "b"):
                if key in host.columns:
                    assert list(got[key].cat.categories) == list(host[key].cat.categories), case


def test_parquet_integer_categories_pandas_noted_match_the_host(cuda_tcp, tmp_path):
    """A pandas categorical of integers (stored as plain integers, with pandas' note): a
    category column on the device as on the host target, its categories integers."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame({"c": pd.Categorical(np.arange(30) % 4), "v": np.arange(30.0)})
    frame.to_parquet(tmp_path / "a.parquet")
    device = dg.read_parquet(str(tmp_path), target="device", client=cuda_tcp)
    got = compute(cuda_tcp, device).to_pandas()
    host = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", client=cuda_tcp))
    assert str(device._meta.c.dtype) == str(got.c.dtype) == str(host.c.dtype) == "category"
    assert got.c.cat.categories.dtype == host.c.cat.categories.dtype == "int64"
    assert got.c.astype("int64").tolist() == host.c.astype("int64").tolist()


@pytest.mark.parametrize("noted", ["first", "second"])
def test_parquet_categories_pandas_noted_in_one_file_only_match_the_host(cuda_tcp, tmp_path, noted):
    """A categorical of integers pandas noted in one of two files only reads by the first
    file's note on the device too (tests/test_parquet_compat.py): categories in every
    partition where the first file has the note, int64 in every one where it has not, as meta
    and the host target give them; each file a partition of its own (``blocksize=1``, where a
    partition went by its own file's note), filtered, and both in one libcudf call."""
    import pandas as pd

    write_noted_in_one_file(tmp_path, noted)
    dtype = "category" if noted == "first" else "int64"
    cases = [
        ({"blocksize": 1}, 2),
        ({"blocksize": 1, "filters": [("c", ">", 1)]}, 2),
        ({"blocksize": "1GiB"}, 1),
    ]
    for kwargs, npartitions in cases:
        args = dict(client=cuda_tcp, **kwargs)
        device = dg.read_parquet(str(tmp_path), target="device", **args)
        host = dg.read_parquet(str(tmp_path), target="host", **args)
        assert device.npartitions == npartitions, kwargs
        assert str(device._meta.c.dtype) == str(host._meta.c.dtype) == dtype, kwargs
        parts = cuda_tcp.gather(cuda_tcp.compute(device.to_delayed()))
        assert [str(p.c.dtype) for p in parts] == [dtype] * npartitions, kwargs
        got = compute(cuda_tcp, device).to_pandas().reset_index(drop=True)
        want = compute(cuda_tcp, host).reset_index(drop=True)  # filtered rows keep their labels
        assert str(got.c.dtype) == str(want.c.dtype) == dtype, kwargs
        if dtype == "category":
            assert got.c.cat.categories.dtype == want.c.cat.categories.dtype == "int64", kwargs
            assert sorted(got.c.cat.categories) == sorted(want.c.cat.categories), kwargs
        pd.testing.assert_frame_equal(got, want, check_categorical=False, obj=str(kwargs))


def test_parquet_selection_of_a_shard_of_too_many_chunks_reads_its_own(cuda_tcp, tmp_path):
    """1,100 columns in one row group (more chunks than a shard lists): a selection after
    the read finds its chunks in the footer on the worker and reads the bytes ``columns=``
    reads, with the same values."""
    rng = np.random.default_rng(5)
    table = pa.table({f"c{j}": rng.random(200) for j in range(1100)})
    path = str(tmp_path / "wide.parquet")
    pq.write_table(table, path)

    def read(df):
        cuda_tcp.run(h.clear_ledger)
        got = h.cudf_to_arrow(compute(cuda_tcp, df))
        return got, sum(r["bytes"] for r in h.ledger_paths(cuda_tcp) if r["op"] == "read")

    asked, asked_bytes = read(
        dg.read_parquet(path, columns=["c1", "c0"], target="device", client=cuda_tcp)
    )
    got, got_bytes = read(dg.read_parquet(path, target="device", client=cuda_tcp)[["c1", "c0"]])
    h.assert_same_table(got, table.select(["c1", "c0"]))
    h.assert_same_table(asked, got)
    assert got_bytes == asked_bytes < os.path.getsize(path) / 10


def test_shuffle_outputs_of_no_rows_hold_the_data_categories(cuda_tcp):
    """Categories Dask does not know (``as_unknown``): the outputs no row goes to hold the
    data's categories, as the host target's and Dask's task shuffle's do."""
    import cudf
    import dask.dataframe as dd
    import pandas as pd

    pdf = pd.DataFrame({"k": [7] * 20, "c": pd.Categorical(["x", "y"] * 10)})
    df = dd.from_pandas(pdf, npartitions=2).map_partitions(cudf.from_pandas)
    df = df.assign(c=df.c.cat.as_unknown())
    out = dg.shuffle(df, "k", npartitions=4, client=cuda_tcp)
    parts = cuda_tcp.gather(cuda_tcp.compute(out.to_delayed()))
    assert sum(len(p) == 0 for p in parts) == 3
    for part in parts:
        assert isinstance(part, cudf.DataFrame)
        assert part["c"].cat.categories.to_pandas().tolist() == ["x", "y"]


def test_parquet_index_alone_and_integer_labels_match_the_host(cuda_tcp, tmp_path):
    """A frame of an index alone and one of integer column labels (columns by their field
    names): the device gives what the host target gives."""
    import numpy as np
    import pandas as pd

    alone, numbered = tmp_path / "alone", tmp_path / "numbered"
    alone.mkdir()
    numbered.mkdir()
    pd.DataFrame(index=pd.Index([5, 3, 9, 1], name="k")).to_parquet(alone / "a.parquet")
    pd.DataFrame(np.arange(12.0).reshape(4, 3)).to_parquet(numbered / "a.parquet")
    for path in (alone, numbered):
        device = dg.read_parquet(str(path), target="device", client=cuda_tcp)
        got = compute(cuda_tcp, device).to_pandas()
        host = compute(cuda_tcp, dg.read_parquet(str(path), target="host", client=cuda_tcp))
        assert list(device.columns) == list(got.columns) == list(host.columns)
        assert got.index.tolist() == host.index.tolist() and got.index.name == host.index.name
        assert got.to_numpy().tolist() == host.to_numpy().tolist()


def test_parquet_an_index_named_by_the_empty_string_matches_the_host(cuda_tcp, tmp_path):
    """An index pandas stored under the name ``""``, or a column ``""`` chosen with
    ``index=""``, is the index on the device as on the host target (tests/test_parquet_compat.py:
    it was left out of the read): libcudf reads the column ``""``, and cuDF indexes by it."""
    stored, column = tmp_path / "stored", tmp_path / "column"
    write_index_named_by_the_empty_string(stored, column)
    for kwargs in [{}, {"index": ""}, {"columns": ["x"]}, {"filters": [("", ">", 100)]}]:
        args = dict(split_row_groups=True, client=cuda_tcp, **kwargs)
        device = dg.read_parquet(str(stored), target="device", **args)
        got = compute(cuda_tcp, device).to_pandas()
        host = compute(cuda_tcp, dg.read_parquet(str(stored), target="host", **args))
        assert device._meta.index.name == got.index.name == host.index.name == "", kwargs
        assert list(device.columns) == list(got.columns) == list(host.columns), kwargs
        assert got.index.tolist() == host.index.tolist(), kwargs
        assert len(host) == (9 if "filters" in kwargs else 20), kwargs  # 11**2 to 19**2
        assert got.astype(str).values.tolist() == host.astype(str).values.tolist(), kwargs
    device = dg.read_parquet(str(column), index="", target="device", client=cuda_tcp)
    got = compute(cuda_tcp, device).to_pandas()
    assert device._meta.index.name == got.index.name == ""
    assert list(device.columns) == list(got.columns) == ["x", "s"]
    assert got.index.tolist() == list(range(20))
    assert got.x.tolist() == [i * 0.5 for i in range(20)]


@pytest.mark.parametrize(("first", "second", "here", "there"), OTHER_INDEXES, ids=OTHER_INDEX_IDS)
def test_parquet_files_that_stored_other_indexes_are_refused_unless_index_chooses(
    cuda_tcp, tmp_path, first, second, here, there
):
    """Files whose stored indexes differ (a column beside none, RangeIndexes of other names)
    are refused on the device target too, naming both files and both indexes (a file's rows
    lost their index column's values); ``index=`` reads them as one, as the host target does
    (tests/test_parquet_compat.py)."""
    import pandas as pd

    write_other_indexes(tmp_path, first, second)
    message = rf"part\.1\.parquet: the index .*part\.0\.parquet's \({here} here, {there} there\)"
    with pytest.raises(dg.InputError, match=message):
        compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="device", client=cuda_tcp))
    for index in (False, "k"):
        args = dict(index=index, client=cuda_tcp)
        device = dg.read_parquet(str(tmp_path), target="device", **args)
        got = compute(cuda_tcp, device).to_pandas()
        host = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", **args))
        name = None if index is False else "k"
        assert device._meta.index.name == got.index.name == host.index.name == name, index
        assert list(device.columns) == list(got.columns) == list(host.columns), index
        # index=False: a partition of both files (the device's "auto") is labelled 0, 1, 2...
        # end to end, the host's partition of each file from 0
        drop = index is False
        pd.testing.assert_frame_equal(
            got.reset_index(drop=drop), host.reset_index(drop=drop), obj=str(index)
        )


def test_parquet_filters_at_the_edges_of_types_match_the_host(cuda_tcp, tmp_path):
    """Filters on an int column past 2**53 with a null, floats on int statistics, None and
    empty lists, a time with nanoseconds: the device keeps the rows the host target keeps
    (tests/test_parquet.py checks those against Dask's rules)."""
    import pandas as pd

    nano = pd.Timestamp("2020-01-01 00:00:00.000000001")
    big = 2**53 + 1
    table = pa.table({
        "id": [0, 1, 2, 3],
        "x": pa.array([2**53, 2**53 + 2, None, -(2**62)], pa.int64()),
        "s": pa.array(["a", None, "b", "a"]).dictionary_encode(),
        "t": pa.array([pd.Timestamp("2020-01-01")] * 2 + [pd.Timestamp("2020-01-02")] * 2,
                      pa.timestamp("ns")),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    cases = [
        [("x", "==", big)], [("x", "!=", big)], [("x", "<", big)], [("x", "in", [big])],
        [("x", "<", 1.5)], [("x", "==", 0.5)], [("s", "in", [None])], [("s", "not in", [])],
        [("s", ">=", "b")], [("t", "<", nano)], [("t", "!=", nano)],
    ]  # fmt: skip
    for filters in cases:
        args = dict(filters=filters, client=cuda_tcp)
        device = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="device", **args))
        host = compute(cuda_tcp, dg.read_parquet(str(tmp_path), target="host", **args))
        assert sorted(device["id"].to_pandas()) == sorted(host["id"]), filters


# --- binary --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,shape",
    [
        ("float32", (1000, 7)),
        ("float64", (513,)),
        ("int8", (300, 4, 3)),
        ("uint64", (257, 2)),
        ("bool", (100,)),
        ("complex64", (64, 5)),
        ("float16", (99, 3)),
    ],
)
def test_npy_c_order(cuda_tcp, tmp_path, dtype, shape):
    expected = h.npy_array(shape, dtype)
    path = str(tmp_path / "x.npy")
    np.save(path, expected)
    # a small blocksize: several chunks, each a run of whole records
    arr = dg.read_binary(path, target="device", client=cuda_tcp, blocksize=1024)
    assert arr.numblocks[0] > 1 or expected.nbytes <= 1024
    h.assert_same_array(compute(cuda_tcp, arr), expected)


@pytest.mark.parametrize("dtype,shape", [("int16", (300, 5)), ("float64", (40, 3, 2))])
def test_npy_fortran_order(cuda_tcp, tmp_path, dtype, shape):
    expected = np.asfortranarray(h.npy_array(shape, dtype, seed=1))
    path = str(tmp_path / "f.npy")
    np.save(path, expected)
    arr = dg.read_binary(path, target="device", client=cuda_tcp, blocksize=256)
    assert arr.numblocks[0] == 1  # records of a Fortran-order file are not contiguous
    h.assert_same_array(compute(cuda_tcp, arr), expected)


def test_npy_many_files(cuda_tcp, tmp_path):
    parts = [h.npy_array((n, 8), "float32", seed=n) for n in (100, 1, 250, 37)]
    for i, part in enumerate(parts):
        np.save(tmp_path / f"part-{i}.npy", part)
    arr = dg.read_binary(str(tmp_path), target="device", client=cuda_tcp, blocksize=4096)
    # 128 records a shard; the one-record file joined with the next file's first shard into
    # one device buffer (four chunks of about 97 records: the bytes cut evenly)
    assert arr.chunks[0] == (100, 1 + 128, 122, 37)
    h.assert_same_array(compute(cuda_tcp, arr), np.concatenate(parts))


def test_raw_records_with_shape(cuda_tcp, tmp_path):
    expected = h.npy_array((1001, 3), "float64", seed=2)
    path = tmp_path / "records.bin"
    expected.tofile(path)
    arr = dg.read_binary(
        str(path), dtype="float64", shape=(3,), target="device", client=cuda_tcp, blocksize=2400
    )
    assert arr.numblocks[0] > 1
    h.assert_same_array(compute(cuda_tcp, arr), expected)


def test_raw_scalars_many_files(cuda_tcp, tmp_path):
    parts = [h.npy_array((n,), "int32", seed=n) for n in (10, 4000, 3)]
    for i, part in enumerate(parts):
        part.tofile(tmp_path / f"r{i}.raw")
    arr = dg.read_binary(str(tmp_path / "r*.raw"), dtype="int32", target="device", client=cuda_tcp)
    h.assert_same_array(compute(cuda_tcp, arr), np.concatenate(parts))


# --- the ledger ----------------------------------------------------------------------------------


def test_ledger_says_kvikio_compat_two_copies(cuda_tcp, parquet_dir, tmp_path):
    """GDS is not available on the lent H200 (no nvidia-fs): reads take kvikio's compat path."""
    directory, paths = parquet_dir
    cuda_tcp.run(h.clear_ledger)
    np.save(tmp_path / "l.npy", np.ones((4096, 4), "f8"))
    compute(cuda_tcp, dg.read_parquet(directory, target="device", client=cuda_tcp))
    compute(cuda_tcp, dg.read_binary(str(tmp_path / "l.npy"), target="device", client=cuda_tcp))
    rows = h.ledger_paths(cuda_tcp)
    assert rows, "the ledger recorded nothing"
    assert {r["path"] for r in rows} == {"kvikio-compat"}, rows
    assert {r["copies"] for r in rows} == {2}, rows
    assert {r["op"] for r in rows} == {"read"}, rows
    parquet_bytes = sum(os.path.getsize(p) for p in paths)
    assert sum(r["bytes"] for r in rows) >= 4096 * 4 * 8 + parquet_bytes // 2


# --- the descriptor check and the stamp on the device path -------------------------------------


def test_device_reads_through_the_checked_descriptor(cuda_tcp, tmp_path):
    """kvikio opens the file the worker checked (``/proc/self/fd/N``), not the name again: a
    link swapped to a file outside the roots after planning is refused, and a file changed
    after planning fails the read, on the device target as on the host."""
    import dataclasses

    from dask_gpudirect.loading import load_chunk
    from dask_gpudirect.placement import _shards_of

    data, outside = tmp_path / "data", tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    np.save(data / "in.npy", np.arange(1000, dtype="i8"))
    np.save(outside / "out.npy", np.full(1000, 7, dtype="i8"))
    os.symlink(data / "in.npy", data / "link.npy")
    cuda_tcp.run(h.set_allowed_roots, [str(data)])
    try:
        arr = dg.read_binary(str(data / "link.npy"), target="device", client=cuda_tcp)
        h.assert_same_array(compute(cuda_tcp, arr), np.arange(1000, dtype="i8"))
        (shard,) = [s for t in arr.__dask_graph__().values() for s in _shards_of(t)]
        os.replace(data / "link.npy", data / "old-link.npy")
        os.symlink(outside / "out.npy", data / "link.npy")
        unstamped = dataclasses.replace(shard, stamp=None)
        with pytest.raises(dg.InputError, match="outside gpudirect.allowed-roots"):
            cuda_tcp.submit(load_chunk, (unstamped,), pure=False).result()
        os.remove(data / "link.npy")
        os.symlink(data / "in.npy", data / "link.npy")
        np.save(data / "in.npy", np.arange(2000, dtype="i8"))
        with pytest.raises(dg.InputError, match="changed since it was planned"):
            compute(cuda_tcp, arr)
        assert set(dg.report(cuda_tcp)["path"]) >= {"kvikio-compat"} or set(
            dg.report(cuda_tcp)["path"]
        ) >= {"gds"}
    finally:
        cuda_tcp.run(h.set_allowed_roots, None)
