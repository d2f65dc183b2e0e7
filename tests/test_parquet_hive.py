"""Hive-partitioned folders (``year=2024/month=1/part-0.parquet``), read as ``dd.read_parquet``
reads them: the keys become category columns, filters on them prune whole folders at planning,
and ``columns=`` can name them. Compared with Dask itself on files the tests write."""

from __future__ import annotations

import os

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from util import KEYS_IN_OTHER_ORDERS, clear_ledgers, compute, write_one_row_folders

import dask_gpudirect as dg
from dask_gpudirect import ledger_report

YEARS, REGIONS = (2023, 2024), ("eu", "us")


def hive_folders(root, null: bool = False) -> pd.DataFrame:
    """year=Y/region=R/part-0.parquet for each pair (and with ``null`` a null region, which
    Dask cannot read: it types a file's keys from that file alone); the rows, as pandas."""
    frames = []
    for y in YEARS:
        for r in (*REGIONS, None) if null else REGIONS:
            folder = root / f"year={y}" / f"region={r or '__HIVE_DEFAULT_PARTITION__'}"
            folder.mkdir(parents=True)
            n = 40
            x = np.arange(n) + 1000 * y + (REGIONS.index(r) * 100 if r else 500)
            part = pd.DataFrame({"x": x, "v": x * 0.5})
            pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / "part-0.pq")
            frames.append(part.assign(year=y, region=r))
    (root / "_SUCCESS").write_bytes(b"")
    return pd.concat(frames, ignore_index=True)


def same_as_dask(got: pd.DataFrame, root, **kwargs) -> pd.DataFrame:
    """``got`` holds Dask's rows (in any order) with Dask's types for the partition columns."""
    want = dd.read_parquet(root, **kwargs).compute()
    assert list(got.columns) == list(want.columns)
    for name in set(got.columns) & {"year", "region"}:
        assert got[name].dtype == want[name].dtype, name  # categories and their type
    order = list(got.columns)
    a = got.astype({c: object for c in order}).sort_values(order, key=_sortable)
    b = want.astype({c: object for c in order}).sort_values(order, key=_sortable)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    return want


def _sortable(column: pd.Series) -> pd.Series:
    return column.astype(str)


def test_partition_columns_as_dask_gives_them(tcp, tmp_path):
    hive_folders(tmp_path)
    df = dg.read_parquet(tmp_path, client=tcp)
    assert list(df.columns) == ["x", "v", "year", "region"]
    assert list(df._meta["year"].cat.categories) == list(YEARS)
    assert df._meta["year"].cat.categories.dtype == "int32"
    assert list(df._meta["region"].cat.categories) == list(REGIONS)
    got = compute(tcp, df)
    want = same_as_dask(got, tmp_path)
    assert (got.dtypes["year"], got.dtypes["region"]) == (df.dtypes["year"], df.dtypes["region"])
    assert len(want) == len(got) == 4 * 40


def test_a_null_partition_value(tcp, tmp_path):
    """``__HIVE_DEFAULT_PARTITION__`` (what Hive, Spark and pyarrow write for null) is a null,
    and no category; filters treat it as Dask's read_parquet treats a null (``!=`` and ``not
    in`` keep it)."""
    rows = hive_folders(tmp_path, null=True)
    df = dg.read_parquet(tmp_path, client=tcp)
    assert list(df._meta["region"].cat.categories) == list(REGIONS)
    got = compute(tcp, df).sort_values("x", ignore_index=True)  # folders in name order
    assert got["region"].isna().sum() == 2 * 40
    pd.testing.assert_frame_equal(
        got.astype({"year": int, "region": "str"}),
        rows.astype({"region": "str"}).sort_values("x", ignore_index=True),
    )
    only = compute(tcp, dg.read_parquet(tmp_path, filters=[("region", "in", [None])], client=tcp))
    assert len(only) == 2 * 40 and only["region"].isna().all()
    others = dg.read_parquet(tmp_path, filters=[("region", "not in", ["eu"])], client=tcp)
    kept = compute(tcp, others)["region"]
    assert kept.isna().sum() == 2 * 40 and set(kept.dropna()) == {"us"}
    unequal = dg.read_parquet(tmp_path, filters=[("region", "!=", "eu")], client=tcp)
    kept = compute(tcp, unequal)["region"]
    assert kept.isna().sum() == 2 * 40 and set(kept.dropna()) == {"us"}
    for op, nulls in (("is", True), ("is not", False)):  # Dask's null test, decided by folder
        kept = compute(tcp, dg.read_parquet(tmp_path, filters=[("region", op, None)], client=tcp))
        assert len(kept) == (2 * 40 if nulls else len(rows) - 2 * 40)
        assert kept["region"].isna().all() if nulls else kept["region"].notna().all()


@pytest.mark.parametrize("how", ["directory", "subdirectory", "file", "glob", "list"])
def test_keys_of_every_folder_in_a_files_path_as_dask_takes_them(tcp, tmp_path, how):
    """Dask takes every ``key=value`` folder of a file's path (pyarrow's hive partitioning of
    the whole path), however the files were named: a glob or a list of a dataset's files, or
    one of its subfolders, keeps the keys its folders give, and so does a folder above the one
    named."""
    root = tmp_path / "run=3" / "tables"
    hive_folders(root)
    paths = sorted(str(p) for p in root.rglob("*.pq"))
    entry = {
        "directory": str(root),
        "subdirectory": str(root / "year=2024"),
        "file": paths[-1],
        "glob": str(root / "year=*" / "region=eu" / "*.pq"),
        "list": paths[1:3],
    }[how]
    df = dg.read_parquet(entry, client=tcp)
    assert list(df.columns) == ["x", "v", "run", "year", "region"]
    same_as_dask(compute(tcp, df), entry)
    # and filters on them keep the rows Dask keeps, however the files were named
    got = compute(tcp, dg.read_parquet(entry, filters=[("region", "==", "us")], client=tcp))
    same_as_dask(got, entry, filters=[("region", "==", "us")])


def test_a_path_through_dot_dot_has_the_keys_of_the_folder_it_leads_to(tcp, tmp_path, monkeypatch):
    """``y=2023/../y=2024`` (``../y=2024`` from inside ``y=2023``) is the folder ``y=2024``: its
    files' key is 2024, as Dask gives it, not that of the folder the ``..`` leaves (which also
    decided the filters: ``y == 2023`` kept the rows of ``y=2024``)."""
    write_one_row_folders(tmp_path, [(f"year={year}", year) for year in YEARS])
    monkeypatch.chdir(tmp_path / "year=2023")
    for entry in ("../year=2024", str(tmp_path / "year=2023" / ".." / "year=2024")):
        got = compute(tcp, dg.read_parquet(entry, client=tcp))
        assert got["year"].tolist() == [2024]
        same_as_dask(got, entry)
        ruled_out = dg.read_parquet(entry, filters=[("year", "==", 2023)], client=tcp)
        assert len(compute(tcp, ruled_out)) == 0
    one = compute(tcp, dg.read_parquet("../year=2024/part.parquet", client=tcp))
    assert one["year"].tolist() == [2024]


def test_a_link_before_dot_dot_leads_to_its_targets_parent(tcp, tmp_path):
    """The read keeps a path's ``..`` for the kernel, which leaves a link's target, not the
    link's folder: ``data/year=2023/link/..``, the link into ``other/year=2024``, reads that
    folder's rows, whose key is 2024 (they came as 2023, and filters kept them as 2023)."""
    write_one_row_folders(tmp_path, [("data/year=2023", 2023), ("other/year=2024", 2024)])
    os.makedirs(tmp_path / "other" / "year=2024" / "sub")
    os.symlink(tmp_path / "other" / "year=2024" / "sub", tmp_path / "data" / "year=2023" / "link")
    entry = str(tmp_path / "data" / "year=2023" / "link" / "..")
    for path in (entry, os.path.join(entry, "part.parquet")):
        got = compute(tcp, dg.read_parquet(path, client=tcp))
        assert got[["x", "year"]].values.tolist() == [[2024, 2024]], path
        kept = dg.read_parquet(path, filters=[("year", "==", 2023)], client=tcp)
        assert len(compute(tcp, kept)) == 0, path


@pytest.mark.parametrize(
    "filters",
    [
        [("year", "==", 2024)],
        [("year", "==", 2024), ("x", ">", 2024110)],
        [[("region", "in", ["eu"])], [("year", "<", 2024), ("x", "<", 2023105)]],
        [("region", "!=", "us"), ("year", ">=", 2024)],
    ],
)
def test_filters_on_partition_keys_prune_folders(tcp, tmp_path, filters):
    hive_folders(tmp_path)
    clear_ledgers(tcp)
    got = compute(tcp, dg.read_parquet(tmp_path, filters=filters, client=tcp))
    same_as_dask(got, tmp_path, filters=filters)
    reads = ledger_report.records(tcp).query("op == 'read'")
    kept = {(int(y), r) for y, r in zip(got["year"], got["region"].astype(object), strict=True)}
    for path, rows in reads.groupby("file"):
        year = int(path.split("year=")[1].split(os.sep)[0])
        region = path.split("region=")[1].split(os.sep)[0]
        if (year, region) not in kept:  # ruled out by its folders: its footer alone, checked
            assert rows["shard"].str.endswith("@footer").all(), rows


def test_columns_may_name_partition_keys(tcp, tmp_path):
    hive_folders(tmp_path)
    got = compute(tcp, dg.read_parquet(tmp_path, columns=["x", "region"], client=tcp))
    same_as_dask(got, tmp_path, columns=["x", "region"])
    # and so may a selection after the read, which Dask's optimizer pushes into it
    selected = compute(tcp, dg.read_parquet(tmp_path, client=tcp)[["region", "x"]])
    same_as_dask(selected, tmp_path, columns=["region", "x"])
    year = compute(tcp, dg.read_parquet(tmp_path, columns="year", client=tcp))
    assert isinstance(year, pd.Series) and year.name == "year"
    assert sorted(year.astype(int)) == sorted([y for y in YEARS for _ in range(2 * 40)])


def kind_folders(client, root, values) -> pd.DataFrame:
    """``kind=V/part.parquet`` of two rows for each of ``values``, read, and checked against
    Dask's read."""
    for value in values:
        folder = root / f"kind={value}"
        folder.mkdir()
        pq.write_table(pa.table({"x": [1, 2]}), folder / "part.parquet")
    got = compute(client, dg.read_parquet(root, client=client))
    same_as_dask(got, root)
    return got


def test_string_keys_and_keys_that_differ(tcp, tmp_path):
    kind_folders(tcp, tmp_path, ("a", "b"))
    with pytest.raises(dg.InputError, match="on a partition column whose values are strings"):
        dg.read_parquet(tmp_path, filters=[("kind", "==", 1)], client=tcp)

    odd = tmp_path / "kind=c" / "day=1"
    odd.mkdir(parents=True)
    pq.write_table(pa.table({"x": [3]}), odd / "part.parquet")
    with pytest.raises(dg.InputError, match=r"kind=c/day=1/part.parquet: hive partition keys"):
        dg.read_parquet(tmp_path, client=tcp)


def test_the_same_keys_in_another_order_in_some_folders(tcp, tmp_path):
    """``a=1/b=x/`` and ``b=y/a=2/`` lie in folders of the same keys: Dask and pyarrow take
    each by its name, in the first file's order (they were refused as keys that differ)."""
    write_one_row_folders(tmp_path, KEYS_IN_OTHER_ORDERS)
    got = compute(tcp, dg.read_parquet(tmp_path, client=tcp))
    assert list(got.columns) == ["x", "a", "b"]
    assert got.sort_values("x").astype(object).values.tolist() == [
        [1, 1, "x"],
        [2, 2, "y"],
        [3, 3, "z"],
    ]
    want = dd.read_parquet(tmp_path).compute()
    assert (got.dtypes["a"], got.dtypes["b"]) == (want.dtypes["a"], want.dtypes["b"])
    kept = dg.read_parquet(tmp_path, filters=[("b", "==", "y")], client=tcp)
    assert compute(tcp, kept)["a"].tolist() == [2]


def test_a_bool_filter_on_integer_keys_is_refused(tcp, tmp_path):
    """pyarrow and Dask refuse ``("kind", "==", True)`` on integer keys; it matched the
    folder ``kind=1``."""
    kind_folders(tcp, tmp_path, (0, 1))
    for filters in ([("kind", "==", True)], [("kind", "in", [True])]):
        with pytest.raises(dg.InputError, match="partition column whose values are integers"):
            dg.read_parquet(tmp_path, filters=filters, client=tcp)


def test_other_operands_than_numbers_on_integer_keys_are_refused(tcp, tmp_path):
    """numpy's ``True`` is no Python bool: ``("kind", "==", np.True_)`` matched ``kind=1``
    (Dask refuses it); a timestamp failed the planning with a TypeError naming no filter."""
    kind_folders(tcp, tmp_path, (0, 1))
    for operand in (np.True_, pd.Timestamp("2024-01-01")):
        for filters in ([("kind", "==", operand)], [("kind", "<", operand)]):
            with pytest.raises(dg.InputError, match="partition column whose values are integers"):
                dg.read_parquet(tmp_path, filters=filters, client=tcp)
    # numbers of numpy's are numbers
    kept = dg.read_parquet(tmp_path, filters=[("kind", ">", np.float32(0.5))], client=tcp)
    assert compute(tcp, kept)["kind"].tolist() == [1, 1]


def test_values_of_other_digits_than_ascii_stay_strings(tcp, tmp_path):
    """Python's ``int`` takes ``"٣"`` (an Arabic-Indic three): Dask and pyarrow keep it a
    string, so one folder of it and one of ``4`` are a string column, not the ints 3 and 4."""
    got = kind_folders(tcp, tmp_path, ("\u0663", "4"))
    assert sorted(got["kind"]) == ["4", "4", "\u0663", "\u0663"]


def test_a_key_that_is_also_a_column_is_refused(tcp, tmp_path):
    folder = tmp_path / "x=1"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), folder / "part.parquet")
    with pytest.raises(dg.InputError, match=r"hive partition key\(s\) \['x'\] are also columns"):
        dg.read_parquet(tmp_path, client=tcp)


def long_named_folders(root, n: int) -> list[str]:
    """``n`` folders ``k=value-00000-xxx...`` of one small file each (long values, so that
    what is sent once per folder value stands out); the files, in order."""
    files = []
    for i in range(n):
        folder = root / f"k=value-{i:05d}-{'x' * 40}"
        folder.mkdir(parents=True)
        files.append(str(folder / "part.parquet"))
        pq.write_table(pa.table({"x": np.arange(10)}), files[-1])
    return files


def test_a_workers_plans_of_many_folders_send_the_folder_values_once(tmp_path):
    """Every shard of a hive read carries its key's categories (every folder's value); a
    worker sends its files' plans back pickled in one piece, so those go once, not once a
    file: the bytes grow with the files, not with their square (2.4 MB for 200 folders of
    long names where 0.15 MB will do)."""
    import asyncio
    import pickle
    from types import SimpleNamespace

    from dask_gpudirect import collections, compat
    from dask_gpudirect.formats import hive, parquet

    def sent(n: int) -> bytes:
        files = long_named_folders(tmp_path / str(n), n)
        conversion = compat.conversion(None, "host")
        args = (None, None, 1 << 20, "host", None, hive.partitioning(files), None, conversion)
        worker = SimpleNamespace(address="w")
        out = asyncio.run(collections._plan_here(worker, {"w": files}, parquet.plan, args))
        assert isinstance(out, bytes)
        assert [p.shards[0].path for p in pickle.loads(out)] == files
        return out

    assert len(sent(200)) < 6 * len(sent(50))


def test_a_partition_of_many_folders_is_named_by_one_pickle(tmp_path):
    """Dask names a read's tasks by their shards; a partition's shards are pickled together
    for it, so the categories they all hold go in once, not once a shard: the bytes grow with
    the folders, not with their square."""
    from dask.base import normalize_token

    from dask_gpudirect.formats import hive, parquet
    from dask_gpudirect.shards import Partition, shared

    def named(n: int) -> int:
        files = long_named_folders(tmp_path / str(n), n)
        plan = parquet.plan(files, None, None, 2**30, "host", None, hive.partitioning(files))
        partition = Partition(shared(plan.shards))
        assert normalize_token(partition) == normalize_token(Partition(shared(plan.shards)))
        return len(normalize_token(partition))

    assert named(200) < 6 * named(50)


def test_files_of_many_folders_are_decoded_in_one_run_each_with_its_values(tcp, tmp_path):
    """A partition's files from different folders are decoded together (one libcudf call on
    the device, one pandas conversion on the host), each file's folder values on its own rows,
    a null folder's as nulls, and the rows a filter keeps as Dask's."""
    from dask_gpudirect.formats import hive, parquet

    want = hive_folders(tmp_path, null=True)
    files = sorted(str(p) for p in tmp_path.rglob("*.pq"))
    plan = parquet.plan(files, None, None, 2**30, "host", None, hive.partitioning(files))
    assert [len(run) for run in parquet.runs(plan.shards)] == [len(files)]
    df = dg.read_parquet(tmp_path, blocksize="1GiB", client=tcp)
    assert df.npartitions == 1
    pd.testing.assert_frame_equal(_plain(compute(tcp, df)), _plain(want))
    later = [("x", ">", 2024050)]  # in 2024: the "us" and null folders' rows
    kept = dg.read_parquet(tmp_path, blocksize="1GiB", filters=later, client=tcp)
    pd.testing.assert_frame_equal(_plain(compute(tcp, kept)), _plain(want[want.x > 2024050]))


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s rows by ``x``, its folder values as plain Python values (None: null)."""
    region = frame.region.astype(object)
    plain = frame.assign(year=frame.year.astype("int64"), region=region.where(region.notna(), None))
    return plain.sort_values("x", ignore_index=True)


def test_a_hive_key_as_the_index_as_dask_takes_it(tcp, tmp_path):
    """``index="year"`` indexes every partition by the folders' values, as Dask does (it was
    refused as "no such column", the key being no column of the files)."""
    hive_folders(tmp_path)
    ours = dg.read_parquet(tmp_path, index="year", client=tcp)
    theirs = dd.read_parquet(tmp_path, index="year")
    assert list(ours.columns) == list(theirs.columns) == ["x", "v", "region"]
    assert ours._meta.index.dtype == theirs._meta.index.dtype
    got, want = compute(tcp, ours), theirs.compute()
    assert got.index.dtype == want.index.dtype
    key = ["year", "x"]
    pd.testing.assert_frame_equal(
        got.reset_index().sort_values(key, ignore_index=True),
        want.reset_index().sort_values(key, ignore_index=True),
    )


def test_len_comes_from_the_footers_where_no_filter_is_left(tcp, tmp_path):
    """``len(df)`` and ``df.shape[0]`` are answered from the row counts the planning read in
    the footers, as ``dd.read_parquet`` answers them from its statistics: no file is read.
    Where a filter on a column is left to drop rows after decoding, the count comes from a
    read, and is the filtered one."""
    frame = hive_folders(tmp_path)
    for name in ("year=2023/region=eu/part-1.pq", "year=2024/region=us/part-1.pq"):
        more = pd.DataFrame({"x": np.arange(250), "v": np.arange(250) * 0.5})
        pq.write_table(
            pa.Table.from_pandas(more, preserve_index=False), tmp_path / name, row_group_size=60
        )
    rows = len(frame) + 500

    def count(df) -> tuple[int, int]:
        """``len(df)`` and the bytes the workers read to answer it."""
        clear_ledgers(tcp)
        n = len(df)
        return n, int(ledger_report.records(tcp)["bytes"].sum())

    df = dg.read_parquet(tmp_path, blocksize=1, client=tcp)
    assert count(df) == (rows, 0) and len(dd.read_parquet(tmp_path)) == rows
    assert count(df.v) == (rows, 0)
    clear_ledgers(tcp)
    assert df.shape[0].compute() == rows
    assert ledger_report.records(tcp)["bytes"].sum() == 0
    lengths = compute(tcp, df.map_partitions(len))
    assert len(df.partitions[1:4]) == sum(lengths[1:4])  # read, as Dask reads it

    on_folders = dg.read_parquet(tmp_path, filters=[("region", "==", "us")], client=tcp)
    assert count(on_folders) == ((frame["region"] == "us").sum() + 250, 0)

    on_values = dg.read_parquet(tmp_path, filters=[("x", "<", 100)], client=tcp)
    n, read = count(on_values)
    assert n == (frame["x"] < 100).sum() + 200 and read > 0
