"""Issue 15 on the device target: nested columns and float16, as ``cudf.read_parquet`` reads
them (the files of ``util.write_nested_parquet``, which the host target reads as pyarrow does,
``tests/test_parquet_types.py``). Uses ``test_device_tcp``'s kind of cluster, one of its own."""

from __future__ import annotations

import dask
import gpu_helpers as h
import numpy as np
import pyarrow as pa
import pytest
from util import EVOLVED_TYPES, write_evolved_parquet, write_nested_parquet

import dask_gpudirect as dg

pytestmark = pytest.mark.gpu

NESTED = ["id", "map", "list_of_struct", "struct_of_list", "deep"]


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    return write_nested_parquet(tmp_path_factory.mktemp("nested"))


def _on_workers(client, df) -> pa.Table:
    """``df``'s rows as one Arrow table, each partition converted where it lives (see
    ``gpu_helpers.described``: cuDF cannot move these frames between processes)."""
    parts = client.gather(client.compute([dask.delayed(h.described)(p) for p in df.to_delayed()]))
    return pa.concat_tables([table for _, table in parts])


def test_nested_columns_match_cudf(cuda_tcp, nested):
    import cudf

    df = dg.read_parquet(nested, columns=NESTED, target="device", client=cuda_tcp)
    expected = cudf.read_parquet(nested, columns=NESTED)
    h.assert_same_table(_on_workers(cuda_tcp, df), h.cudf_to_arrow(expected))
    # and the frames themselves travel (cudf_compat: structs holding strings serialize)
    gathered = cuda_tcp.compute(df).result().reset_index(drop=True)
    h.assert_same_table(h.cudf_to_arrow(gathered), h.cudf_to_arrow(expected))


def test_nested_columns_through_the_shuffle(cuda_tcp, nested):
    import cudf

    df = dg.read_parquet(nested, columns=NESTED, blocksize=1, target="device", client=cuda_tcp)
    out = dg.shuffle(df, "id", npartitions=4, client=cuda_tcp)
    got = _on_workers(cuda_tcp, out).sort_by("id")
    expected = cudf.read_parquet(nested, columns=NESTED)
    h.assert_same_table(got, h.cudf_to_arrow(expected))


def test_float16_is_float32_values_with_nulls_and_nans_kept(cuda_tcp, nested, tmp_path):
    """libcudf has no float16 and gives its two bytes: dg gives the file's values as float32,
    in meta and in the partitions, nulls and NaN where the file has them; never the bytes."""
    import pyarrow.parquet as pq

    odd = tmp_path / "half.parquet"
    values = [1.5, None, float("nan"), -0.0, 65504.0, 2**-24]
    pq.write_table(pa.table({"half": pa.array(values, pa.float16())}), odd)
    for paths in (nested, [str(odd)]):
        df = dg.read_parquet(paths, columns=["half"], target="device", client=cuda_tcp)
        assert str(df.dtypes["half"]) == "float32"
        got = cuda_tcp.compute(df).result()
        assert str(got["half"].dtype) == "float32"
        expected = pa.concat_arrays(
            [pq.read_table(p)["half"].combine_chunks().cast(pa.float32()) for p in paths]
        )
        column = got["half"].to_arrow()
        assert column.is_null().to_pylist() == expected.is_null().to_pylist()
        np.testing.assert_array_equal(  # NaN where NaN (nulls filled alike)
            column.fill_null(0).to_numpy(), expected.fill_null(0).to_numpy()
        )


def test_files_a_pandas_user_writes_read_as_dask_cudf_reads_them(cuda_tcp, tmp_path):
    """Issue 15's files from pandas on the device target, against ``dask_cudf.read_parquet``:
    nullable integers with nulls in one file only, the index ``set_index`` stored, columns in
    another order in the second file, a stray README and ``_SUCCESS`` in the folder, and
    ``columns="x"`` as a Series. One type per column, in meta and in every partition."""
    import dask_cudf
    import pandas as pd

    first = pd.DataFrame({"key": [1, 2, 3], "n": pd.array([1, None, 3], "Int64"), "x": [0.5] * 3})
    second = pd.DataFrame({"x": [1.5] * 3, "n": pd.array([4, 5, 6], "Int64"), "key": [4, 5, 6]})
    first.set_index("key").to_parquet(tmp_path / "part-0.parquet")
    second.set_index("key").to_parquet(tmp_path / "part-1.parquet")
    (tmp_path / "README.txt").write_text("not data")
    (tmp_path / "_SUCCESS").write_bytes(b"")

    df = dg.read_parquet(str(tmp_path), target="device", client=cuda_tcp)
    expected = dask_cudf.read_parquet(str(tmp_path)).compute()
    types = {c: str(t) for c, t in df.dtypes.items()}
    assert types == {c: str(t) for c, t in expected.dtypes.items()}
    assert df.index.name == expected.index.name == "key"
    for part_types, _ in cuda_tcp.gather(
        cuda_tcp.compute([dask.delayed(h.described)(p) for p in df.to_delayed()])
    ):
        assert part_types == types
    got = cuda_tcp.compute(df).result()
    assert got.index.to_arrow().to_pylist() == expected.index.to_arrow().to_pylist()
    h.assert_same_table(h.cudf_to_arrow(got), h.cudf_to_arrow(expected))
    series = cuda_tcp.compute(
        dg.read_parquet(str(tmp_path), columns="x", target="device", client=cuda_tcp)
    ).result()
    assert (
        type(series).__name__ == "Series" and series.to_arrow().to_pylist() == [0.5] * 3 + [1.5] * 3
    )


@pytest.mark.parametrize(
    ("first", "second", "read_as"),
    [e[1:] for e in EVOLVED_TYPES],
    ids=[e[0] for e in EVOLVED_TYPES],
)
def test_files_storing_a_column_in_other_types_read_as_one(
    cuda_tcp, tmp_path, first, second, read_as
):
    """The device target casts each file's column to the type the read gives it (the host
    target's test, ``tests/test_parquet_types.py``): one type in meta and every partition,
    each partition of a run of one type or of both, the values cuDF reads from one file of
    the unified type."""
    import cudf

    data, one = write_evolved_parquet(tmp_path, first, second, read_as)
    expected = cudf.read_parquet(one)
    for blocksize in ("1GiB", 1):
        df = dg.read_parquet(str(data), blocksize=blocksize, target="device", client=cuda_tcp)
        types = {c: str(t) for c, t in df.dtypes.items()}
        assert types == {c: str(t) for c, t in expected.dtypes.items()}
        parts = cuda_tcp.gather(
            cuda_tcp.compute([dask.delayed(h.described)(p) for p in df.to_delayed()])
        )
        assert all(part_types == types for part_types, _ in parts)
        got = pa.concat_tables([table for _, table in parts])
        h.assert_same_table(got, h.cudf_to_arrow(expected))


def test_calculate_divisions_as_dask_cudf(cuda_tcp, tmp_path):
    """``calculate_divisions=True`` on the device target, a sorted dataset Dask wrote (files
    ``part.0`` to ``part.11``, read in that order): the divisions ``dask_cudf.read_parquet``
    finds, and selecting by index gives its rows."""
    import dask.dataframe as dd
    import dask_cudf
    import pandas as pd

    pdf = pd.DataFrame({"x": np.arange(600.0)}, index=pd.Index(np.arange(600) * 3, name="t"))
    dd.from_pandas(pdf, npartitions=12).to_parquet(tmp_path, compute_kwargs={"scheduler": "sync"})
    theirs = dask_cudf.read_parquet(str(tmp_path), calculate_divisions=True)
    df = dg.read_parquet(
        str(tmp_path), calculate_divisions=True, blocksize=1, target="device", client=cuda_tcp
    )
    assert theirs.known_divisions and df.divisions == theirs.divisions
    got = cuda_tcp.compute(df.loc[300:750]).result()
    assert got.index.to_arrow().to_pylist() == list(range(300, 751, 3))


def test_a_column_named_like_a_struct_field_is_a_clear_error(cuda_tcp, tmp_path):
    """A column ``a.b`` beside a struct ``a`` with a field ``b``: libcudf takes the name for
    the field, by name or by position (measured on an H100), so the read names the file,
    the column and the host target (which reads it: tests/test_parquet.py); it failed with
    a bare KeyError."""
    import pyarrow.parquet as pq

    path = tmp_path / "dotted.parquet"
    rng = np.random.default_rng(0)
    n = 20_000
    field = pa.StructArray.from_arrays([pa.array(rng.random(n))], names=["b"])
    pq.write_table(pa.table({"a": field, "pad": rng.random(n), "a.b": rng.random(n)}), path)
    df = dg.read_parquet(path, columns=["a.b"], target="device", client=cuda_tcp)
    with pytest.raises(
        dg.InputError, match=r"cannot read column\(s\) \['a.b'\].*target='host'"
    ) as info:
        cuda_tcp.compute(df).result()
    assert str(path) in str(info.value)
    plain = dg.read_parquet(path, columns=["pad"], target="device", client=cuda_tcp)
    np.testing.assert_array_equal(
        cuda_tcp.compute(plain).result()["pad"].to_numpy(), pq.read_table(path)["pad"].to_numpy()
    )
