"""``dg.shuffle`` and ``dg.shuffle_array`` against pandas and NumPy, over tcp and ucxx.

Every test runs a real all-to-all between the worker processes of the session clusters and
checks contents: which rows each output partition holds (and in which order), that records stay
whole, and what the ledger says moved. Faults (a worker killed, a broken connection, spilling,
the memory pre-check, bad options) are in test_shuffle_faults.py.
"""

from __future__ import annotations

import time

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask.sizeof import sizeof
from distributed import futures_of, wait
from pandas.testing import assert_frame_equal, assert_series_equal
from util import (
    assert_hash_partitions,
    assert_released,
    clear_ledgers,
    compute,
    owner_of_rows,
    partitions,
    received_pieces,
    sample_frame,
    worker_config,
)

import dask_gpudirect as dg
from dask_gpudirect import ledger_report
from dask_gpudirect.cluster import ensure_plugins
from dask_gpudirect.shuffle.plugin import service

REMOTE = {"tcp": "tcp-host", "ucxx": "ucx-host"}  # the ledger path of a piece that moved


def test_hash_shuffle_matches_pandas(client):
    pdf = sample_frame(2000, keys=50)
    df = dd.from_pandas(pdf, npartitions=4)
    out = dg.shuffle(df, "k", npartitions=5, client=client)
    assert isinstance(out, dd.DataFrame)
    assert out.npartitions == 5
    assert_series_equal(out.dtypes, pdf.dtypes)
    parts = partitions(client, out)
    assert_hash_partitions(parts, pdf, "k", 5)
    # every key in exactly one partition
    homes = {}
    for j, part in enumerate(parts):
        for key in part["k"].unique():
            assert homes.setdefault(key, j) == j
    assert set(homes) == set(pdf["k"])
    # the whole frame, index included, comes back as one computed collection
    assert_frame_equal(compute(client, out).sort_index(), pdf)


@pytest.mark.parametrize(
    "key",
    ["int32", "uint8", "bool", "float", "nullable", "category", "string", "datetime", "index"],
)
def test_each_row_goes_where_dasks_own_shuffle_puts_it(client, key):
    """Output ``j`` holds the rows of Dask's own ``df.shuffle(on, npartitions)``'s output
    ``j`` (the task shuffle, run beside it), whatever the key's type."""
    rng = np.random.default_rng(5)
    n = 3000
    values = rng.integers(-40, 40, n)
    keys = {
        "int32": values.astype("int32"),
        "uint8": (values + 40).astype("uint8"),
        "bool": values > 0,
        "float": np.where(values % 7 == 0, np.nan, values / 4),
        "nullable": pd.array(np.where(values % 5 == 0, None, values), dtype="Int64"),
        "category": pd.Categorical(values % 9),
        "string": pd.array(values.astype(str), dtype="string"),
        "datetime": pd.Timestamp("2025-01-01", tz="UTC") + pd.to_timedelta(values, "h"),
        "index": values,
    }
    pdf = pd.DataFrame({"key": keys[key], "v": rng.random(n)})
    if key == "index":
        pdf = pdf.set_index("key")
    df = dd.from_pandas(pdf, npartitions=4)
    ours = partitions(client, dg.shuffle(df, "key", npartitions=6, client=client))
    dasks = partitions(client, df.shuffle("key", npartitions=6, shuffle_method="tasks"))
    for j, (mine, theirs) in enumerate(zip(ours, dasks, strict=True)):
        assert_frame_equal(mine.sort_values("v"), theirs.sort_values("v"), obj=f"output {j}")
    assert sum(map(len, ours)) == n


@pytest.mark.filterwarnings("ignore:Merging dataframes with merge column data type mismatches")
def test_keys_of_different_number_types_line_up_for_a_join(client):
    """Two frames shuffled on one key into as many partitions can be joined partition by
    partition, as the guide says, though one side's key is int32 and the other's int64 or
    float64: every match of the whole join is found (hashing the raw bytes would lose most)."""
    rng = np.random.default_rng(6)
    facts = pd.DataFrame({"id": rng.integers(-500, 500, 4000), "x": rng.random(4000)})
    names = pd.DataFrame({"id": np.arange(-500, 500, dtype="int32"), "name": np.arange(1000)})
    want = facts.merge(names, on="id").sort_values(["id", "x"], ignore_index=True)
    left = dg.shuffle(dd.from_pandas(facts, npartitions=5), "id", npartitions=7, client=client)
    for dtype in ("int32", "float64"):
        side = dd.from_pandas(names.astype({"id": dtype}), npartitions=2)
        right = dg.shuffle(side, "id", npartitions=7, client=client)
        joined = dd.map_partitions(pd.merge, left, right, on="id", align_dataframes=False)
        got = compute(client, joined).sort_values(["id", "x"], ignore_index=True)
        assert_frame_equal(got, want, check_dtype=False, obj=dtype)


def _shuffles(collection) -> int:
    """How many shuffles Dask plans for ``collection`` (its task or P2P shuffles and joins)."""
    from dask.dataframe.dask_expr._merge import HashJoinP2P
    from dask.dataframe.dask_expr._shuffle import ShuffleBase

    nodes = collection.optimize().expr.walk()
    return sum(isinstance(node, ShuffleBase | HashJoinP2P) for node in nodes)


@pytest.mark.filterwarnings("ignore:Merging dataframes with merge column data type mismatches")
def test_dasks_merges_and_group_bys_on_the_key_shuffle_it_no_more(client):
    """A ``dg.shuffle`` result is marked as Dask marks its own shuffle's: Dask's merge of two
    such frames, its group-by and its ``drop_duplicates`` on the key run partition by partition
    (no shuffle), a merge with an unshuffled frame shuffles only that one into the same
    partitions, and each gives pandas' answer. Not after ``then=``, which may change keys."""
    rng = np.random.default_rng(7)
    facts = pd.DataFrame({"id": rng.integers(0, 300, 5000), "x": rng.random(5000)})
    names = pd.DataFrame({"id": np.arange(300, dtype="int32"), "name": np.arange(300)})
    left = dg.shuffle(dd.from_pandas(facts, npartitions=5), "id", npartitions=6, client=client)
    plain = dd.from_pandas(names, npartitions=2)
    right = dg.shuffle(plain, "id", npartitions=6, client=client)

    def same(got, want):
        by = list(want.columns)
        got = compute(client, got).reset_index(drop=True).sort_values(by, ignore_index=True)
        assert_frame_equal(got, want.sort_values(by, ignore_index=True), check_dtype=False)

    want = facts.merge(names, on="id")
    for merged, shuffles in ((left.merge(right, on="id"), 0), (left.merge(plain, on="id"), 1)):
        assert _shuffles(merged) == shuffles
        same(merged, want)
    sums = left.groupby("id").x.sum(split_out=6)
    assert _shuffles(sums) == 0
    same(sums.reset_index(), facts.groupby("id").x.sum().reset_index())
    firsts = left.drop_duplicates(subset="id", split_out=True)
    assert _shuffles(firsts) == 0
    assert sorted(compute(client, firsts)["id"]) == sorted(facts["id"].unique())
    kept = dg.shuffle(left, "id", npartitions=6, client=client, then=lambda part: part)
    assert _shuffles(kept.merge(right, on="id")) == 1


@pytest.mark.parametrize("npartitions", [1, 5, 300])
def test_ignore_index_labels_each_output_from_zero(client, npartitions):
    """As Dask's ``shuffle(..., ignore_index=True)``: the rows of each output in input order,
    their labels dropped; at 300 outputs each receiver gathers from many segments, at 5 it
    copies a few slices."""
    pdf = sample_frame(3000, keys=400, seed=3)
    df = dd.from_pandas(pdf, npartitions=6)
    out = dg.shuffle(df, "k", npartitions=npartitions, client=client, ignore_index=True)
    assert isinstance(out._meta.index, pd.RangeIndex)
    assert_series_equal(out.dtypes, pdf.dtypes)
    where = owner_of_rows(pdf, "k", npartitions)
    parts = partitions(client, out)
    for j, part in enumerate(parts):
        assert_frame_equal(part, pdf[where == j].reset_index(drop=True))
    assert sum(len(p) for p in parts) == len(pdf)


@pytest.mark.parametrize("option", ["ignore_index", "keep_order"])
def test_flags_must_be_bools(client, option):
    df = dd.from_pandas(sample_frame(100, keys=5), npartitions=2)
    with pytest.raises(dg.InputError, match=f"{option} must be True or False, not 'yes'"):
        dg.shuffle(df, "k", client=client, **{option: "yes"})


@pytest.mark.parametrize("ignore_index", [False, True])
def test_keep_order_false_on_the_host_still_keeps_it(client, ignore_index):
    """pandas has no faster cut in no set order, so the host target gives the ordered
    shuffle's very partitions (the GPU's unordered cut: tests/gpu/test_shuffle_device.py)."""
    pdf = sample_frame(3000, keys=400, seed=5)
    df = dd.from_pandas(pdf, npartitions=6)
    ordered, loose = (
        dg.shuffle(df, "k", npartitions=7, client=client, ignore_index=ignore_index, keep_order=k)
        for k in (True, False)
    )
    for a, b in zip(partitions(client, ordered), partitions(client, loose), strict=True):
        assert_frame_equal(a, b)


@pytest.mark.parametrize("npartitions", [None, 1, 3, 9])
def test_npartitions(client, npartitions):
    """Fewer, as many (the default) or more outputs than inputs."""
    pdf = sample_frame(600, keys=40, seed=1)
    df = dd.from_pandas(pdf, npartitions=4)
    out = dg.shuffle(df, "k", npartitions=npartitions, client=client)
    expected = npartitions or df.npartitions
    assert out.npartitions == expected
    assert_hash_partitions(partitions(client, out), pdf, "k", expected)


def test_several_on_columns(client):
    pdf = sample_frame(1000, keys=4, seed=2)
    df = dd.from_pandas(pdf, npartitions=3)
    out = dg.shuffle(df, ["k", "s"], npartitions=6, client=client)
    parts = partitions(client, out)
    assert_hash_partitions(parts, pdf, ["k", "s"], 6)
    pairs = [set(zip(p["k"], p["s"], strict=True)) for p in parts]
    assert sum(map(len, pairs)) == len(set().union(*pairs)) == 4 * 7  # no pair in two partitions


@pytest.mark.parametrize("keep_order", [True, False])
@pytest.mark.parametrize("on", ["row", ["k", "row"], ["row", "s"]], ids=str)
def test_on_the_index(client, on, keep_order):
    """The index's name in ``on``, as Dask's shuffle takes it: the index is hashed in its
    place among the columns named with it, and every row keeps its label."""
    pdf = sample_frame(2000, keys=50, seed=4)
    df = dd.from_pandas(pdf, npartitions=4)
    out = dg.shuffle(df, on, npartitions=5, client=client, keep_order=keep_order)
    where = owner_of_rows(pdf.reset_index(), on, 5)
    parts = partitions(client, out)
    assert len(parts) == 5
    for j, part in enumerate(parts):
        assert_frame_equal(part, pdf[where == j])


@pytest.mark.parametrize(
    "on",
    [["row", "s"], ["s", "row"], ["k", "k"], ["s", "k", "s"], ["row", "row"], ["row", "s", "row"]],
    ids=str,
)
def test_every_row_where_dask_shuffle_puts_it(client, on):
    """Partition ``j`` holds the rows of Dask's own ``df.shuffle(on, npartitions)``'s partition
    ``j``, wherever ``on`` names the index and however often a column or the index (named
    twice, Dask hashes it once, after the columns): a frame shuffled by either joins the other
    partition by partition."""
    pdf = sample_frame(2000, keys=50, seed=4)
    df = dd.from_pandas(pdf, npartitions=4)
    ours = partitions(client, dg.shuffle(df, on, npartitions=5, client=client))
    theirs = partitions(client, df.shuffle(on, npartitions=5, shuffle_method="tasks"))
    for mine, dasks in zip(ours, theirs, strict=True):
        assert_frame_equal(mine.sort_index(), dasks.sort_index())


def test_a_column_named_as_the_index_is_the_column(client):
    """Where a column and the index share a name, ``on`` means the column (as in Dask)."""
    pdf = sample_frame(600, keys=20, seed=6).rename_axis("k")
    df = dd.from_pandas(pdf, npartitions=3)
    assert_hash_partitions(partitions(client, dg.shuffle(df, "k", client=client)), pdf, "k", 3)


def test_result_is_a_dataframe_to_keep_computing_on(client):
    """A group-by after the shuffle, whole or partition by partition, gives pandas' answer."""
    pdf = sample_frame(3000, keys=100, seed=3)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=5), "k", npartitions=4, client=client)
    expected = pdf.groupby("k")["v"].sum()
    assert_series_equal(compute(client, out.groupby("k")["v"].sum()).sort_index(), expected)
    # each key sits in one partition, so per-partition group-bys need no second step
    local = out.map_partitions(lambda p: p.groupby("k")["v"].sum(), meta=("v", "f8"))
    got = compute(client, local)
    assert got.index.is_unique
    assert_series_equal(got.sort_index(), expected)
    assert compute(client, out[out["v"] > 0.5]["n"].count()) == pdf[pdf["v"] > 0.5]["n"].count()
    assert len(out) == len(pdf)


def _sums_by_k(part: pd.DataFrame) -> pd.Series:
    return part.groupby("k")["v"].sum()


def test_then_is_map_partitions_on_the_workers_that_build_the_outputs(client):
    """``then=f`` gives what ``.map_partitions(f)`` of the shuffle gives, with no task of its
    own to run: the workers keep ``f``'s results under the shuffle's keys, not the rows."""
    pdf = sample_frame(3000, keys=100, seed=3)
    df = dd.from_pandas(pdf, npartitions=5)
    out = dg.shuffle(df, "k", npartitions=4, client=client, then=_sums_by_k)
    assert isinstance(out, dd.Series) and out.npartitions == 4
    assert_series_equal(out._meta, pdf.groupby("k")["v"].sum().iloc[:0])
    plain = dg.shuffle(df, "k", npartitions=4, client=client)
    for got, want in zip(partitions(client, out), partitions(client, plain), strict=True):
        assert_series_equal(got, _sums_by_k(want))  # output j: f of the same rows
    keys = [f.key for f in futures_of(out.persist())]
    held = [t for types in client.run(_types_held, keys=keys).values() for t in types.items()]
    assert sorted(k for k, _ in held) == sorted(keys)  # each output kept once, as f made it
    assert {t for _, t in held} == {pd.Series}
    got = compute(client, out).sort_index()
    assert got.index.is_unique  # each key in one output partition
    assert_series_equal(got, pdf.groupby("k")["v"].sum())


def _grown_noting_kept(part: pd.DataFrame) -> pd.DataFrame:
    """``part`` 100 times over, with the worker that made it and the keys it then held."""
    from distributed import get_worker

    worker = get_worker()
    return pd.concat([part] * 100).assign(worker=worker.address, held=len(worker.data))


def test_then_results_go_to_the_workers_memory_a_chunk_at_a_time(client):
    """``then``'s results are handed to the worker's memory, where it may spill them, about
    a chunk's bytes at a time: a group's results were held at once (every output a worker
    builds, here), and a ``then`` that makes more than it takes outgrew a worker where
    ``map_partitions`` after the shuffle did not."""
    pdf = sample_frame(4000, keys=100, seed=9)
    df = dd.from_pandas(pdf, npartitions=4)
    meta = pdf.iloc[:0].assign(worker="", held=0)
    with worker_config(client, {"gpudirect.shuffle.chunk-size": "1MiB"}):
        out = dg.shuffle(df, "k", npartitions=8, client=client, then=_grown_noting_kept, meta=meta)
        got = compute(client, out)
    assert len(got) == 100 * len(pdf)
    for worker, made in got.groupby("worker"):  # some results kept before others were made
        assert made["held"].nunique() > 1, worker


def _keeps_only_small(part: pd.DataFrame) -> pd.DataFrame:
    if len(part) > 10:
        raise ZeroDivisionError(f"{len(part)} rows")
    return part


def test_then_that_raises_fails_the_shuffle_and_keeps_nothing(client):
    """An error of ``then`` on one output fails the whole shuffle with a ``ShuffleError`` that
    names the function, the partition and the error; no output stays anywhere, and the cluster
    shuffles again."""
    pdf = sample_frame(400, keys=20, seed=5)
    df = dd.from_pandas(pdf, npartitions=4)
    cause = r"then=_keeps_only_small raised on output partition \d+ on .*ZeroDivisionError"
    with pytest.raises(dg.ShuffleError, match=cause):
        dg.shuffle(df, "k", npartitions=3, client=client, then=_keeps_only_small)
    assert_released(client, _shuffle_keys_held)
    again = dg.shuffle(df, "k", npartitions=3, client=client)
    assert_hash_partitions(partitions(client, again), pdf, "k", 3)


def test_skewed_keys(client):
    """90% of the rows share one key: its partition holds all of them, the rest spread."""
    rng = np.random.default_rng(4)
    pdf = sample_frame(2000, keys=200, seed=4)
    pdf.loc[rng.random(len(pdf)) < 0.9, "k"] = 7
    assert (pdf["k"] == 7).mean() > 0.85
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=4, client=client)
    parts = partitions(client, out)
    assert_hash_partitions(parts, pdf, "k", 4)
    heavy = owner_of_rows(pdf.loc[pdf["k"] == 7], "k", 4)[0]
    assert (parts[heavy]["k"] == 7).sum() == (pdf["k"] == 7).sum()


def test_empty_partitions(client):
    """Input partitions with no rows, and outputs no row hashes to: typed empty frames."""
    pdf = sample_frame(800, keys=3, seed=5)
    df = dd.from_pandas(pdf, npartitions=8)
    cut = pdf.index[500]
    df = df.map_partitions(lambda p: p[p.index > cut])  # the first five inputs are now empty
    lengths = compute(client, df.map_partitions(len))
    assert (lengths == 0).sum() >= 4
    kept = pdf.loc[pdf.index > pdf.index[500]]
    out = dg.shuffle(df, "k", npartitions=12, client=client)
    parts = partitions(client, out)
    assert_hash_partitions(parts, kept, "k", 12)
    empty = [p for p in parts if p.empty]
    assert len(empty) >= 9  # three keys: at most three outputs get rows
    for part in empty:
        assert_series_equal(part.dtypes, pdf.dtypes)
        assert part.index.name == "row"


def test_empty_frame(client):
    pdf = sample_frame(10, keys=3).iloc[:0]
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=1), "k", npartitions=3, client=client)
    parts = partitions(client, out)
    assert len(parts) == 3
    for part in parts:
        assert_frame_equal(part, pdf)


@pytest.mark.parametrize("method", ["dg.shuffle", "shuffle_method"])
def test_outputs_of_no_rows_hold_no_unknown_categories_placeholder(client, method):
    """A categorical whose categories Dask does not know (``cat.as_unknown()``, a Parquet
    read's): outputs no row goes to hold the data's categories, as Dask's task shuffle's do
    (a zero-row slice of an input), not the placeholder Dask's meta carries (a group-by with
    ``observed=False`` then counted a category ``__UNKNOWN_CATEGORIES__``), nor none at all
    (a group-by of each output with ``observed=False`` then lost the categories' rows of 0).
    An input on each worker: the worker that gets no row still holds rows of its own."""
    pdf = pd.DataFrame({"k": [7] * 20, "c": pd.Categorical(["x", "y"] * 10)})
    workers = sorted(client.nthreads())
    halves = [pdf.iloc[:10], pdf.iloc[10:]]
    futures = [  # hash=False: keys of their own, not those the same halves had just before
        client.scatter(half, workers=[w], hash=False)
        for half, w in zip(halves, workers, strict=True)
    ]
    df = dd.from_delayed(futures, meta=pdf.iloc[:0], verify_meta=False)
    df = df.assign(c=df.c.cat.as_unknown())
    if method == "dg.shuffle":
        out = dg.shuffle(df, "k", npartitions=4, client=client)
    else:
        out = df.shuffle("k", npartitions=4, shuffle_method="gpudirect")
    parts = partitions(client, out)
    assert sum(p.empty for p in parts) == 3  # one key: one output gets every row
    for part in parts:
        assert list(part["c"].cat.categories) == ["x", "y"]
    counted = out.map_partitions(lambda p: p.groupby("c", observed=False).size())
    assert len(compute(client, counted)) == 2 * 4  # each category in each output, as Dask's
    sizes = compute(client, out.groupby("c", observed=False).size())
    assert sizes.to_dict() == {"x": 10, "y": 10}


@pytest.mark.parametrize("method", ["dg.shuffle", "shuffle_method"])
def test_categories_of_outputs_follow_the_inputs_wherever_they_are(client, method):
    """Inputs with categories of their own (files read one by one): every output holds their
    union in input order, whichever worker held which input, and Dask's rows. Each output
    held the union of the pieces that reached it, in the order its worker's inputs were
    joined: other codes, and categories missing, by placement. (Dask's task shuffle unions
    the inputs that sent an output rows, and gives one of none the first input's.)"""
    parts = [
        pd.DataFrame({"k": pd.Categorical([f"c{2 * i}", f"c{2 * i + 1}"] * 3), "x": range(6)})
        for i in range(4)
    ]
    meta = parts[0].iloc[:0].astype({"k": pd.CategoricalDtype(["__UNKNOWN_CATEGORIES__"])})
    a, b = sorted(client.nthreads())
    for placement in ([a, a, b, b], [a, b, a, b], [b, a, a, b]):
        futures = [
            client.scatter(p, workers=[w], hash=False)
            for p, w in zip(parts, placement, strict=True)
        ]
        df = dd.from_delayed(futures, meta=meta, verify_meta=False)
        if method == "dg.shuffle":
            out = dg.shuffle(df, "k", npartitions=3, client=client)
        else:
            out = df.shuffle("k", npartitions=3, shuffle_method="gpudirect")
        expected = partitions(client, df.shuffle("k", npartitions=3, shuffle_method="tasks"))
        for got, want in zip(partitions(client, out), expected, strict=True):
            assert list(got.k.cat.categories) == [f"c{i}" for i in range(8)], placement
            assert_frame_equal(got.astype({"k": str}), want.astype({"k": str}))


def test_many_partitions(client):
    pdf = sample_frame(3000, keys=1000, seed=6)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=10), "k", npartitions=100, client=client)
    parts = partitions(client, out)
    assert_hash_partitions(parts, pdf, "k", 100)
    assert sum(not p.empty for p in parts) > 90


def test_integer_column_label(client):
    """Column labels need not be strings: ``on=0`` names column 0, as in pandas and Dask."""
    pdf = pd.DataFrame({0: np.arange(100) % 7, 1: np.arange(100.0)})
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=2), 0, npartitions=3, client=client)
    assert_hash_partitions(partitions(client, out), pdf, [0], 3)


def test_one_worker(client):
    """Every input on one worker: every piece stays local and the result is still right."""
    pdf = sample_frame(1000, keys=30, seed=7)
    worker = sorted(client.nthreads())[0]
    df = client.persist(dd.from_pandas(pdf, npartitions=4), workers=[worker])
    clear_ledgers(client)
    out = dg.shuffle(df, "k", npartitions=4, client=client)
    assert_hash_partitions(partitions(client, out), pdf, "k", 4)
    records = ledger_report.records(client)
    records = records[records["op"] == "shuffle"]
    assert set(records["path"]) == {"local"}
    assert set(records["worker"]) == {worker}


def test_ledger_records_each_piece(client):
    """A shuffle record per chunk of a worker's inputs and destination: the protocol's host
    path if the rows moved, ``local`` if they stayed; the bytes add up to the frame's. Under
    the default ``chunk-size`` each worker splits its inputs at once; with a 1-byte chunk
    size, one input at a time."""
    n = 20_000
    pdf = pd.DataFrame({"k": np.arange(n) % 101, "v": np.arange(n * 1.0)}, index=np.arange(n) * 2)
    df = client.persist(dd.from_pandas(pdf, npartitions=4))
    inputs = partitions(client, df)
    holders = {w for ws in client.who_has(df).values() for w in ws}
    assert len(holders) == 2  # both workers hold inputs
    default = dask.config.get("gpudirect.shuffle.chunk-size")
    for chunk_size, messages in [(default, 2), (1, 4)]:
        clear_ledgers(client)
        with worker_config(client, {"gpudirect.shuffle.chunk-size": chunk_size}):
            out = dg.shuffle(df, "k", npartitions=4, client=client)
        outputs = partitions(client, out)
        assert_hash_partitions(outputs, pdf, "k", 4)

        records = ledger_report.records(client)
        assert set(records["op"]) == {"shuffle"}  # nothing spilled under the default limits
        assert len(set(records["shard"])) == 1  # the shuffle's id
        protocol = client.scheduler.address.split("://")[0]
        assert set(records["path"]) == {REMOTE[protocol], "local"}
        local = records[records["path"] == "local"]
        moved = records[records["path"] != "local"]
        assert (local["peer"] == local["worker"]).all() and (local["copies"] == 0).all()
        assert (moved["peer"] != moved["worker"]).all() and (moved["copies"] == 1).all()
        assert set(moved["worker"]) == set(local["worker"]) == set(client.nthreads())
        # every chunk has rows for both workers: one message (or local put) per chunk and worker
        assert sorted(records.groupby("worker").size()) == [messages, messages]
        # 24 bytes a row (index, k, v) either way, plus Dask's sizeof overhead
        for parts in (inputs, outputs):
            total = sum(sizeof(p) for p in parts)
            assert total <= records["bytes"].sum() <= 1.15 * total


def test_chunk_size_auto_is_the_targets_own(client):
    """``chunk-size: auto`` splits 512 MiB at once on the host (2 GiB on the GPU:
    ``tests/gpu/test_shuffle_device.py``), a size given wins, and either is capped at 1/64 of
    the worker's memory."""

    def chunk(dask_worker) -> tuple[int, int]:
        memory = dask_worker.memory_manager.memory_limit
        return service(dask_worker).batches("host")["chunk"], memory

    ensure_plugins(client)
    assert dask.config.get("gpudirect.shuffle.chunk-size") == "auto"
    for value, expected in [("auto", 512 * 2**20), ("96MiB", 96 * 2**20), ("64GiB", 64 * 2**30)]:
        with worker_config(client, {"gpudirect.shuffle.chunk-size": value}):
            for got, memory in client.run(chunk).values():
                assert got == min(expected, memory // 64)


@pytest.mark.parametrize("inputs, outputs", [(1, 1), (2, 2), (1, 2), (2, 1)])
def test_one_and_two_partitions(client, inputs, outputs):
    pdf = sample_frame(500, keys=20, seed=9)
    df = dd.from_pandas(pdf, npartitions=inputs)
    assert df.npartitions == inputs
    out = dg.shuffle(df, "k", npartitions=outputs, client=client)
    assert_hash_partitions(partitions(client, out), pdf, "k", outputs)


def test_a_thousand_partitions(tcp):
    """1024 inputs into 1024 outputs: each output's rows in input order, though the inputs
    lie on the two workers in turn (so each output is put back in order from both). Over tcp
    only: the partition count is under test here, not the comms (two minutes a protocol)."""
    client = tcp
    pdf = sample_frame(30_000, keys=5000, seed=10)
    pieces = np.array_split(np.arange(len(pdf)), 1024)
    workers = sorted(client.nthreads())
    frames = [pdf.iloc[rows] for rows in pieces]
    futures = [None] * len(frames)  # one scatter per worker: inputs 0, 2, 4, ... on the first
    futures[0::2] = client.scatter(frames[0::2], workers=[workers[0]])
    futures[1::2] = client.scatter(frames[1::2], workers=[workers[1]])
    df = dd.from_delayed(futures, meta=pdf.iloc[:0], verify_meta=False)
    assert {w for ws in client.who_has(futures).values() for w in ws} == set(workers)
    out = dg.shuffle(df, "k", npartitions=1024, client=client)
    assert out.npartitions == 1024
    assert_hash_partitions(partitions(client, out), pdf, "k", 1024)


def test_arrow_types_decimal_list_and_nulls(client):
    """Arrow-backed decimal, list and nullable columns come through whole."""
    import pyarrow as pa

    n = 1200
    pdf = pd.DataFrame(
        {
            "k": np.arange(n) % 37,
            "d": pd.array(
                [None if i % 11 == 0 else f"{i}.25" for i in range(n)],
                dtype=pd.ArrowDtype(pa.decimal128(12, 2)),
            ),
            "l": pd.array(
                [None if i % 13 == 0 else list(range(i % 4)) for i in range(n)],
                dtype=pd.ArrowDtype(pa.list_(pa.int64())),
            ),
            "f": pd.array([None if i % 3 == 0 else i / 7 for i in range(n)], dtype="Float64"),
            "b": pd.array([None if i % 5 == 0 else i % 2 == 0 for i in range(n)], dtype="boolean"),
        }
    )
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=6), "k", npartitions=5, client=client)
    assert_series_equal(out.dtypes, pdf.dtypes)
    assert_hash_partitions(partitions(client, out), pdf, "k", 5)


# --- dg.shuffle_array -------------------------------------------------------------------------


def blocks(client, x) -> list[np.ndarray]:
    """The chunks the workers hold, in order along axis 0."""
    return client.gather(client.compute(list(x.to_delayed().ravel())))


def test_shuffle_array_is_a_permutation(client):
    n = 1000
    x = da.from_array(np.arange(n) * 10, chunks=((300, 250, 200, 250),))
    y = dg.shuffle_array(x, seed=11, client=client)
    assert isinstance(y, da.Array)
    assert y.chunks == x.chunks and y.dtype == x.dtype
    got = blocks(client, y)
    assert [b.shape for b in got] == [(c,) for c in x.chunks[0]]
    whole = np.concatenate(got)
    np.testing.assert_array_equal(compute(client, y), whole)
    np.testing.assert_array_equal(np.sort(whole), np.arange(n) * 10)  # same multiset
    assert (whole != np.arange(n) * 10).mean() > 0.9  # and not the input order
    # any record can land in any chunk: each output chunk draws from every input chunk
    for block in got:
        if len(block) >= 200:
            sources = np.searchsorted(np.cumsum([300, 250, 200, 250]), block // 10, "right")
            assert set(sources) == {0, 1, 2, 3}


def test_shuffle_array_puts_a_record_anywhere_equally_often(tcp):
    """Every order equally likely, end to end (the counts drawn on the client, then each chunk
    permuted on its worker): over 240 fixed seeds, the first and the last of 12 records in three
    chunks land in each of the 12 places about equally often (a chi-square test, 11 degrees of
    freedom, at the 0.1 % level: the seeds are fixed, so the test cannot fail by chance)."""
    x = da.arange(12, chunks=4).persist()
    landed = {0: np.zeros(12, dtype=int), 11: np.zeros(12, dtype=int)}
    for seed in range(240):
        order = compute(tcp, dg.shuffle_array(x, seed=seed, client=tcp))
        for record, counts in landed.items():
            counts[int(np.flatnonzero(order == record)[0])] += 1
    for record, counts in landed.items():
        chi_square = ((counts - 20) ** 2 / 20).sum()
        assert chi_square < 31.26, (record, counts)


@pytest.mark.parametrize(
    ("sizes", "tolerance"), [([6] * 4, 0.06), ([300] * 8, 1.5)], ids=["permuted", "split"]
)
def test_shuffle_array_counts_are_a_random_permutations(sizes, tolerance):
    """The table of how many records go from each input chunk to each output chunk is the one
    a uniformly random permutation makes: over 4000 fixed seeds each cell averages r * c / N,
    and two cells of one row vary against each other as a permutation makes them. Both ways
    the table's tree draws a node: a random order of few records, or a hypergeometric split
    of many between its halves."""

    def contingency(seed, sizes):
        return _drawn_table(seed, sizes, range(len(sizes)))

    tables = np.array([contingency(seed, sizes) for seed in range(4000)])
    assert (tables.sum(axis=1) == sizes).all() and (tables.sum(axis=2) == sizes).all()
    n, r, c = sum(sizes), sizes[0], sizes[-1]
    np.testing.assert_allclose(tables.mean(axis=0), r * c / n, rtol=0.07)
    covariance = np.cov(tables[:, 0, 0], tables[:, 0, -1])[0, 1]
    assert covariance == pytest.approx(-r * (n - r) * c * c / (n * n * (n - 1)), abs=tolerance)
    np.testing.assert_array_equal(contingency(5, sizes), contingency(5, sizes))


def test_shuffle_array_keeps_empty_chunks(client):
    """Chunk sizes are kept when some are 0 (as ``compute_chunk_sizes`` after a filter gives)."""
    x = da.from_array(np.arange(100), chunks=((0, 40, 0, 60, 0),))
    y = dg.shuffle_array(x, seed=3, client=client)
    assert y.chunks == x.chunks
    got = blocks(client, y)
    assert [len(b) for b in got] == [0, 40, 0, 60, 0]
    np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.arange(100))


def test_shuffle_array_seed(client):
    x = da.from_array(np.arange(500), chunks=100)
    a = compute(client, dg.shuffle_array(x, seed=1, client=client))
    b = compute(client, dg.shuffle_array(x, seed=1, client=client))
    c = compute(client, dg.shuffle_array(x, seed=2, client=client))
    d = compute(client, dg.shuffle_array(x, client=client))  # a fresh seed
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.9
    assert (a != d).mean() > 0.9
    for z in (a, c, d):
        np.testing.assert_array_equal(np.sort(z), np.arange(500))


@pytest.mark.parametrize("record", [(3,), (2, 4)], ids=str)
def test_shuffle_array_keeps_records_whole(client, record):
    """N-D records move as units, even when axis 1 was chunked; axis-0 chunks are kept."""
    n = 400
    width = int(np.prod(record))
    data = np.arange(n * width, dtype="f4").reshape(n, *record)
    x = da.from_array(data, chunks=(90, *(max(1, d // 2) for d in record)))
    y = dg.shuffle_array(x, seed=5, client=client)
    assert y.shape == x.shape and y.chunks[0] == x.chunks[0]
    got = blocks(client, y)
    assert [b.shape for b in got] == [(c, *record) for c in x.chunks[0]]
    whole = np.concatenate(got).reshape(n, width)
    first = whole[:, 0].astype(int) // width
    np.testing.assert_array_equal(whole, data.reshape(n, width)[first])  # rows intact
    np.testing.assert_array_equal(np.sort(first), np.arange(n))  # each row once
    assert (first != np.arange(n)).mean() > 0.9


def test_shuffle_array_takes_a_persisted_arrays_own_chunks(client):
    """A persisted array's chunks go in as the futures that hold them (computing a thousand
    chunks again costs the client about 0.2 s); any other array's are computed first."""
    from dask.core import flatten
    from distributed import futures_of

    from dask_gpudirect.shuffle.api import _chunks

    persisted = da.arange(600, chunks=50).persist()
    held = {f.key: f for f in futures_of(persisted)}
    taken = _chunks(client, persisted)
    assert [f.key for f in taken] == list(flatten(persisted.__dask_keys__()))
    assert all(f is held[f.key] for f in taken)
    lazy = da.arange(600, chunks=50) * 2
    got = client.gather(_chunks(client, lazy))
    np.testing.assert_array_equal(np.concatenate(got), np.arange(600) * 2)
    y = dg.shuffle_array(persisted, seed=4, client=client)
    np.testing.assert_array_equal(np.sort(compute(client, y)), np.arange(600))


def test_shuffle_array_structured_records(client):
    dtype = np.dtype([("id", "<i8"), ("x", "<f4", (2,))])
    data = np.zeros(300, dtype)
    data["id"] = np.arange(300)
    data["x"] = np.arange(600, dtype="f4").reshape(300, 2)
    y = dg.shuffle_array(da.from_array(data, chunks=70), seed=3, client=client)
    got = compute(client, y)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.sort(got["id"]), np.arange(300))
    np.testing.assert_array_equal(got["x"], data["x"][got["id"]])


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype(">i8"),
        np.dtype(
            {"names": ["id", "x"], "formats": ["<i8", ">f8"], "offsets": [0, 16], "itemsize": 32}
        ),
    ],
    ids=["big-endian", "padded record"],
)
def test_shuffle_array_chunks_keep_the_arrays_dtype(client, dtype):
    """Every chunk is in the dtype the array says (byte order, padding), whether it was
    joined of one piece or of many."""
    data = np.zeros(300, dtype)
    ids = data["id"] if dtype.fields else data
    ids[:] = np.arange(300)
    y = dg.shuffle_array(da.from_array(data, chunks=50), seed=2, client=client)
    assert y.dtype == dtype
    got = blocks(client, y)
    assert [b.dtype for b in got] == [dtype] * 6
    ids = np.concatenate([b["id"] if dtype.fields else b for b in got])
    np.testing.assert_array_equal(np.sort(ids), np.arange(300))


def test_explicit_client_need_not_be_current(tcp_client, ucxx_client):
    """``client=`` is enough: neither session client is the default or the current one."""
    pdf = sample_frame(200, keys=10, seed=9)
    for c in (tcp_client, ucxx_client):
        out = dg.shuffle(dd.from_pandas(pdf, npartitions=2), "k", npartitions=3, client=c)
        assert_hash_partitions(partitions(c, out), pdf, "k", 3)
        y = dg.shuffle_array(da.from_array(np.arange(50), chunks=20), seed=1, client=c)
        np.testing.assert_array_equal(np.sort(compute(c, y)), np.arange(50))


def _shuffle_keys_held(dask_worker) -> list:
    return [k for k in dask_worker.data if "gpudirect-shuffle" in str(k)]


def _types_held(dask_worker, keys: list) -> dict:
    return {k: type(dask_worker.data[k]) for k in keys if k in dask_worker.data}


def test_persisting_the_result_runs_no_task(tcp):
    """The result's partitions are the shuffle's outputs under their own keys: persisting it
    (as a user does before reusing it) gives back those very futures, with no task to run,
    and what is computed on it depends on the outputs directly."""
    client = tcp
    pdf = sample_frame(400, keys=9, seed=5)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=4, client=client)
    outputs = set(out.__dask_keys__())
    kept = client.persist(out)
    assert {f.key for f in futures_of(kept)} == outputs
    assert all(f.status == "finished" for f in futures_of(kept))
    graph = dict(out.map_partitions(len).__dask_graph__())
    assert outputs <= set(graph)  # the outputs are inputs of the new tasks, not renamed
    assert len(graph) == 2 * len(outputs)
    assert compute(client, out.map_partitions(len)).sum() == len(pdf)


def test_the_stages_leave_the_client_in_one_message(tcp, tmp_path):
    """Every worker's stage task goes to the scheduler in one message of the client's batched
    stream: sent apart, each would wait until 10 ms after the one before it, and the exchange
    waits for the last stage. (The stream's own log of what it sent says which went together.)"""
    for k in range(4):  # read back as partitions on both workers
        frame = pd.DataFrame({"k": np.arange(100) % 7 + k, "v": np.ones(100)})
        frame.to_parquet(tmp_path / f"{k}.parquet")
    df = dg.read_parquet(tmp_path, blocksize=1, client=tcp).persist()
    wait(df)
    # the stream idle, as after a read: stages sent one by one from this thread then leave
    # apart (the first at once, the next 10 ms later), so this fails where they are
    time.sleep(0.05)
    out = dg.shuffle(df, "k", client=tcp)
    sent = list(tcp.scheduler_comm.recent_message_log)
    batches = [
        {key for m in batch if m.get("op") == "update-graph" for key in m["keys"]}
        for batch in sent
        if isinstance(batch, list)
    ]
    stages = [b for b in batches if any(str(key).startswith("gpudirect-shuffle-") for key in b)]
    assert len(stages[-1]) == 2  # the last shuffle's two stages, in one batch
    assert compute(tcp, out.map_partitions(len)).sum() == 400


def test_publishing_names_a_worker_that_is_gone(tcp):
    """The scheduler publishes what the stages reported as they ended: where a participant
    has left the cluster since (after its stage finished), the reply names it and keeps
    nothing, so the client raises instead of returning a partial result; too few outputs
    reported are refused the same way."""
    client = tcp
    ensure_plugins(client)
    workers = sorted(client.nthreads())
    gone = "tcp://127.0.0.1:9"  # not a worker of this cluster
    reply = client.sync(
        client.scheduler.gpudirect_shuffle_publish,
        shuffle_id="no-such-shuffle",
        client=client.id,
        workers=[*workers, gone],
        expected=0,
    )
    assert list(reply["lost"]) == [gone] and reply["outputs"] == 0
    short = client.sync(
        client.scheduler.gpudirect_shuffle_publish,
        shuffle_id="no-such-shuffle",
        client=client.id,
        workers=workers,
        expected=3,
    )
    assert (list(short["lost"]), short["outputs"]) == ([], 0)


def _reports_held(dask_scheduler) -> dict:
    return dask_scheduler.plugins["gpudirect-shuffle"].reports


def test_dropping_the_result_frees_it(client):
    """Nothing of a shuffle stays on the workers once the user drops its result (the scheduler
    of a LocalCluster runs in this process, where a Future inside a graph would pin it)."""
    pdf = sample_frame(500, keys=7, seed=4)
    out = dg.shuffle(dd.from_pandas(pdf, npartitions=4), "k", npartitions=3, client=client)
    arr = dg.shuffle_array(da.arange(100, chunks=30), seed=2, client=client)
    assert len(compute(client, out)) == 500 and len(compute(client, arr)) == 100
    assert any(client.run(_shuffle_keys_held).values())
    # the stages' reports of what they kept, and the workers' record of it, end with the publish
    assert client.run_on_scheduler(_reports_held) == {}
    assert not any(client.run(lambda dask_worker: service(dask_worker).built).values())
    del out, arr
    assert_released(client, _shuffle_keys_held)


@pytest.mark.parametrize("few", [True, False], ids=["few", "many"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_assembly_segments_list_each_output_in_input_order(monkeypatch, interleaved, few):
    """Pieces joined end to end (each grouped by output, then input) are listed output by
    output, each output's rows in input order, whether the senders' inputs interleave (one
    worker holds the even partitions) or not; empty cells and empty outputs included;
    whether the segments are joined (a small table) or not (more than ``JOINED_SEGMENTS``)."""
    from dask_gpudirect.shuffle import split
    from dask_gpudirect.shuffle.split import assembly_segments, cells_of

    if not few:
        monkeypatch.setattr(split, "JOINED_SEGMENTS", 0)
    outputs = range(10, 16)
    pieces = received_pieces(outputs, inputs=12, interleaved=interleaved, seed=3)
    # (output, input) of each row as the receiver joins them: piece after piece, in order
    joined = []
    for chunk, _, counts in pieces:
        joined += [(outputs[j], i) for j in range(len(outputs)) for k, i in enumerate(chunk)
                   for _ in range(int(counts[k, j]))]  # fmt: skip
    cells = [(chunk, first, cells_of(counts)) for chunk, first, counts in pieces]
    segments, sizes = assembly_segments(cells, outputs)
    order = segments.positions("host")
    listed = [joined[p] for p in order]
    assert listed == sorted(joined)  # by output, then input (a stable order within each)
    assert sorted(order.tolist()) == list(range(len(joined)))
    assert sizes.tolist() == [sum(1 for o, _ in joined if o == j) for j in outputs]
    assert sizes[2] == 0
    if few:  # no empty segment, none that continues the one before it
        assert segments.lengths.all()
        assert (segments.starts[1:] != (segments.starts + segments.lengths)[:-1]).all()


def test_the_counts_of_many_partitions_take_memory_by_the_rows():
    """What a worker keeps to cut a chunk of many small inputs into many outputs and to put
    them back together (the split's counts, the pieces' share of them, the receiver's
    segments) grows with the rows, not with the inputs times the outputs: 2,048 inputs of 8
    rows into 8,192 outputs made a table of 128 MiB for 16 K rows."""
    import tracemalloc

    from dask_gpudirect.shuffle.split import assembly_segments, cells_for, output_rows
    from dask_gpudirect.targets import host

    inputs, rows, n = 2048, 8, 8192
    where = np.random.default_rng(5).integers(0, n, inputs * rows)
    tracemalloc.start()
    try:
        order, cells = host.group_order(where, [rows] * inputs, n)
        offsets = np.concatenate([[0], np.cumsum(output_rows(cells, n))])
        chunk = tuple(range(inputs))
        got = []
        for outputs in (range(0, n // 2), range(n // 2, n)):  # two receivers' groups
            piece = (chunk, outputs.start, cells_for(cells, outputs))
            segments, sizes = assembly_segments([piece], outputs)
            got.append(segments.positions("host") + offsets[outputs.start])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # every row once, by output, then input: the split's order
    assert np.array_equal(order[np.concatenate(got)], np.argsort(where, kind="stable"))
    assert peak < 256 * len(where) + 64 * n, peak


def test_a_shuffle_array_split_of_many_chunks_takes_memory_by_the_records():
    """A worker's split of its half of 10,000 chunks of 2 records draws its rows of the table
    by their non-empty cells: memory follows the records, where a dense row of every output a
    chunk took 400 MB (8 bytes x 5,000 x 10,000; 3 GiB at 20,000 chunks). Every record once,
    each output's cells adding up to its size."""
    import tracemalloc

    from dask_gpudirect.shuffle.split import PermutationSplit, output_rows

    chunks = 10_000
    sizes = np.full(chunks, 2, dtype=np.int64)
    split = PermutationSplit(seed=3, sizes=sizes, target="host", meta=np.empty(0, np.int64))
    mine = list(range(0, chunks, 2))
    parts = [np.arange(2 * i, 2 * i + 2) for i in mine]
    tracemalloc.start()
    try:
        records, cells = split.split(mine, parts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(records.tolist()) == sorted(np.concatenate(parts).tolist())
    assert output_rows(cells, chunks).sum() == len(records) and (cells[2] > 0).all()
    assert peak < 16 * 2**20, peak


def test_segment_slices_are_cut_where_pieces_end():
    """A segment that runs on from one piece into the next (rows of one output, the end of
    one sender's piece and the start of the next one's) becomes a slice of each."""
    from dask_gpudirect.shuffle.split import Segments

    pieces = [np.arange(3), np.arange(4), np.arange(2)]
    segments = Segments(np.array([1, 5, 0]), np.array([4, 4, 1]))
    assert segments.slices(pieces) == [(0, 1, 3), (1, 0, 2), (1, 2, 4), (2, 0, 2), (0, 0, 1)]
    joined = np.concatenate(pieces)
    sliced = np.concatenate([pieces[k][a:b] for k, a, b in segments.slices(pieces)])
    assert sliced.tolist() == joined[segments.positions("host")].tolist()


@pytest.mark.parametrize("index", [True, False], ids=["index", "ignore-index"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_outputs_from_slices_equal_outputs_from_one_gather(monkeypatch, interleaved, index):
    """The two ways a receiver builds its outputs (slices of the pieces copied out, for few
    segments; one gather from their join, for many) give the same frames, with the rows'
    labels or (``ignore_index``) labelled from 0."""
    from dask_gpudirect.shuffle import split

    pdf = sample_frame(900, keys=50, seed=12)
    inputs = np.array_split(np.arange(len(pdf)), 6)
    senders = [(0, 2, 4), (1, 3, 5)] if interleaved else [(0, 1, 2), (3, 4, 5)]
    outputs = range(2, 5)
    splitter = split.HashSplit(["k"], 6, "host", pdf.iloc[:0], index)
    pieces, frames = [], []
    for chunk in senders:
        ordered, cells = splitter.split(list(chunk), [pdf.iloc[inputs[i]] for i in chunk])
        starts = np.concatenate([[0], np.cumsum(split.output_rows(cells, 6))])
        frames.append(ordered.iloc[starts[outputs.start] : starts[outputs.stop]])
        pieces.append((chunk, outputs.start, split.cells_for(cells, outputs)))
    segments, sizes = split.assembly_segments(pieces, outputs)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    built = {}
    for few in (0, 10**6):
        monkeypatch.setattr(split, "FEW_SEGMENTS", few)
        built[few] = splitter.outputs(list(frames), segments, bounds, outputs, {})
    where = owner_of_rows(pdf, "k", 6)
    for j, by_gather, by_slices in zip(outputs, built[0], built[10**6], strict=True):
        expected = pdf[where == j] if index else pdf[where == j].reset_index(drop=True)
        assert_frame_equal(by_gather, expected)
        assert_frame_equal(by_slices, expected)


@pytest.mark.parametrize("few", [0, 10**6], ids=["gather", "slices"])
def test_outputs_hold_at_most_two_copies_of_a_group(monkeypatch, few):
    """A receiver builds a group's outputs out of its pieces through copies of them (joined,
    gathered, cut); it lets each go as soon as the next is made, the pieces too (it empties
    the caller's list), so no more than two copies of the group's rows are held at once. A
    group of one output of half the rows (keys skewed) held four on the host, where P2P holds
    two, and its worker of 700 MB was restarted by its nanny where P2P finished."""
    import tracemalloc

    from dask_gpudirect.shuffle import split

    monkeypatch.setattr(split, "FEW_SEGMENTS", few)
    rows, n = 400_000, 6
    rng = np.random.default_rng(3)
    pdf = pd.DataFrame({"k": rng.integers(0, 1000, rows), "v": rng.random(rows)})
    inputs = np.array_split(np.arange(rows), n)
    outputs = range(2, 5)
    splitter = split.HashSplit(["k"], n, "host", pdf.iloc[:0])
    tracemalloc.start()
    try:
        pieces, cells_of = [], []
        for chunk in [(0, 2, 4), (1, 3, 5)]:
            ordered, cells = splitter.split(list(chunk), [pdf.iloc[inputs[i]] for i in chunk])
            starts = np.concatenate([[0], np.cumsum(split.output_rows(cells, n))])
            rows_of = ordered.iloc[starts[outputs.start] : starts[outputs.stop]]
            pieces.append(splitter.owned(rows_of))  # as received: memory of their own
            cells_of.append((chunk, outputs.start, split.cells_for(cells, outputs)))
            del ordered, rows_of
        segments, sizes = split.assembly_segments(cells_of, outputs)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        group = sum(int(p.memory_usage(deep=True).sum()) for p in pieces)
        tracemalloc.reset_peak()
        held, _ = tracemalloc.get_traced_memory()
        built = splitter.outputs(pieces, segments, bounds, outputs, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(len(b) for b in built) == sum(sizes)
    assert held >= group  # the pieces were traced: the peak counts them
    assert peak - (held - group) < 2.5 * group, (peak - held + group) / group
    assert pieces == []


def _days(part: pd.DataFrame) -> pd.Series:
    """Fails on Dask's made-up partition, whose strings are no dates."""
    return pd.to_datetime(part["day"], format="%Y-%m-%d")


def test_then_with_meta_where_it_cannot_run_on_a_made_up_partition(client):
    """``meta=`` says what ``then`` returns, as ``map_partitions``' ``meta=`` does, where
    ``then`` fails on the made-up partition Dask would infer it from."""
    pdf = pd.DataFrame(
        {"k": np.arange(60) % 7, "day": [f"2026-01-{1 + i % 28:02d}" for i in range(60)]}
    )
    df = dd.from_pandas(pdf, npartitions=3)
    with pytest.raises(dg.InputError, match="then=_days failed on a made-up partition"):
        dg.shuffle(df, "k", client=client, then=_days)
    out = dg.shuffle(df, "k", client=client, then=_days, meta=("day", "datetime64[ns]"))
    assert out._meta.dtype == "datetime64[ns]"
    assert_series_equal(compute(client, out).sort_index(), _days(pdf))
    with pytest.raises(dg.InputError, match="pass then= too"):
        dg.shuffle(df, "k", client=client, meta=("day", "datetime64[ns]"))


def test_then_results_are_made_like_meta_as_map_partitions_makes_them(client):
    """``meta=`` is enforced as ``map_partitions`` enforces it: a series named as meta names
    it, and columns that are not meta's an error at the shuffle (the collection said columns
    its partitions did not have, and failed only at a later step)."""
    pdf = sample_frame(300, keys=20, seed=5)
    df = dd.from_pandas(pdf, npartitions=3)
    out = dg.shuffle(df, "k", npartitions=2, client=client, then=_doubled, meta=("z", "f8"))
    want = df.shuffle("k", npartitions=2).map_partitions(_doubled, meta=("z", "f8"))
    assert_series_equal(compute(client, out).sort_index(), compute(client, want).sort_index())
    with pytest.raises(dg.ShuffleError, match="do not match"):
        dg.shuffle(df, "k", client=client, then=_doubled_frame, meta={"a": "f8"})


def _doubled(part: pd.DataFrame) -> pd.Series:
    return part["v"] * 2


def _doubled_frame(part: pd.DataFrame) -> pd.DataFrame:
    return part[["v"]] * 2


def _drawn_table(seed, sizes, rows) -> np.ndarray:
    """The rows ``rows`` of a seed's table that ``contingency_cells`` draws, as a dense table;
    its cells checked to be listed as the split takes them: non-empty, row after row, each
    output after output."""
    from dask_gpudirect.shuffle.split import contingency_cells

    k, j, records = contingency_cells(seed, sizes, rows)
    assert (records > 0).all()
    assert (np.diff(k * len(sizes) + j) > 0).all()
    table = np.zeros((len(rows), len(sizes)), dtype=np.int64)
    table[k, j] = records
    return table


def test_shuffle_array_rows_of_the_table_are_drawn_alone():
    """A worker draws only its chunks' rows of the table, and gets those the whole table has,
    whichever others it draws with them (the same seed, wherever the chunks live). Small
    chunks: the tree's nodes drawn as a random order of their records; large ones: split down
    by hypergeometric draws to each chunk."""
    rng = np.random.default_rng(0)
    for sizes in (rng.integers(0, 50, 300), rng.integers(10**5, 2 * 10**5, 40)):
        n = len(sizes)
        full = _drawn_table(7, sizes, range(n))
        assert (full.sum(axis=0) == sizes).all() and (full.sum(axis=1) == sizes).all()
        for rows in ([5], [n - 1, 0, 17, 17], list(range(0, n, 7)), []):
            got = _drawn_table(7, sizes, rows)
            np.testing.assert_array_equal(got, full[rows].reshape(len(rows), n))


def test_shuffle_array_split_groups_records_by_output_then_input():
    """A split's records, its inputs laid end to end and each cut into its outputs in order,
    are taken output after output and, within one, input after input (each input's run kept
    in its order): the order every worker of a seed's shuffle agrees on. Tables mostly empty
    (many chunks of few records, listed by their non-empty cells), full, with empty rows and
    columns, and with more outputs than 16-bit numbers hold."""
    from dask_gpudirect.shuffle.split import _grouped_by_output, cells_of

    def listed(counts):  # every cell, output-major
        cuts = np.concatenate([[0], np.cumsum(counts)])  # row-major: input k's output j
        runs = [
            np.arange(cuts[k * counts.shape[1] + j], cuts[k * counts.shape[1] + j + 1])
            for j in range(counts.shape[1])
            for k in range(counts.shape[0])
        ]
        return np.concatenate([np.empty(0, dtype=np.int64), *runs])

    rng = np.random.default_rng(0)
    tables = [rng.integers(0, 4, (k, n)) * (rng.random((k, n)) < rng.random()) for k, n in
              rng.integers(0, 40, (200, 2))]  # fmt: skip
    wide = np.zeros((3, 70_000), dtype=np.int64)
    wide[0, 69_999], wide[1, 65_537], wide[2, 5], wide[2, 65_541] = 2, 3, 1, 4
    for counts in [*tables, wide, np.zeros((0, 5), dtype=np.int64)]:
        k, j = np.nonzero(counts)  # row-major, as contingency_cells lists them
        got, cells = _grouped_by_output(np.stack([k, j, counts[k, j]]), counts.shape[1], "host")
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, listed(counts))
        np.testing.assert_array_equal(cells, cells_of(counts))


def test_shuffle_array_seed_gives_the_same_order_as_before(tcp):
    """A seed's order is pinned: an epoch's shuffle replayed from its seed (a resumed training
    run) gets the records in the order it got them before, here with many chunks of two."""
    got = compute(tcp, dg.shuffle_array(da.arange(40, chunks=2), seed=1, client=tcp))
    np.testing.assert_array_equal(
        got,
        [39, 8, 12, 4, 7, 36, 16, 35, 15, 32, 28, 1, 34, 38, 3, 24, 9, 19, 21, 30,
         0, 33, 2, 27, 25, 23, 31, 17, 18, 26, 22, 20, 10, 37, 14, 6, 13, 5, 11, 29],
    )  # fmt: skip


def test_shuffle_array_refuses_a_billion_records(client):
    with pytest.raises(dg.InputError, match="cannot shuffle 1,000,000,001 records"):
        dg.shuffle_array(da.zeros(10**9 + 1, dtype=bool, chunks=10**8), seed=1, client=client)


def record_pieces_memory(dask_worker) -> None:
    """Test instrumentation: each piece this worker's shuffles keep (its own rows and those it
    receives) is recorded as (its string column's bytes, the bytes of the Arrow buffers that
    column holds on to), and the same of its index of strings."""
    from dask_gpudirect.shuffle.buffer import SpillBuffer

    dask_worker.pieces_memory = []
    update = SpillBuffer.update

    def recorded(self, pieces):
        for rows in pieces.values():
            for strings in (rows["s"].array, rows.index.array):
                column = strings._pa_array
                held = sum(b.size for c in column.chunks for b in c.buffers() if b is not None)
                dask_worker.pieces_memory.append((column.nbytes, held))
        return update(self, pieces)

    recorded.original = update
    SpillBuffer.update = recorded


def pieces_memory_recorded(dask_worker) -> list[tuple[int, int]]:
    from dask_gpudirect.shuffle.buffer import SpillBuffer

    SpillBuffer.update = SpillBuffer.update.original
    return dask_worker.pieces_memory


def test_rows_a_worker_keeps_for_itself_hold_only_their_own_memory(tcp):
    """The rows of a worker's split chunk that it keeps for itself wait, with those it
    receives, until its outputs are built: they must hold their own memory, not the whole
    chunk (a slice of it held every row its peers were sent too, its labels as well, while
    the worker counted, and spilled, the slice at its own size)."""
    rows = 200_000
    halves = [
        pd.DataFrame(
            {"k": np.arange(rows) + h * rows, "s": [f"value-{i:012d}" for i in range(rows)]},
            index=pd.Index([f"row-{h}-{i:012d}" for i in range(rows)], dtype="str"),
        )
        for h in range(2)
    ]
    workers = sorted(tcp.nthreads())
    futures = [
        tcp.scatter(half, workers=[w], hash=False) for half, w in zip(halves, workers, strict=True)
    ]
    df = dd.from_delayed(futures, meta=halves[0].iloc[:0], verify_meta=False)
    tcp.run(record_pieces_memory)
    try:
        out = dg.shuffle(df, "k", npartitions=2, client=tcp)
    finally:
        kept = tcp.run(pieces_memory_recorded)
    assert_frame_equal(compute(tcp, out).sort_values("k"), pd.concat(halves))
    for worker, pieces in kept.items():
        assert len(pieces) == 4, pieces  # its own rows and its peer's: values and labels
        for own, held in pieces:
            assert held < 1.1 * own, (worker, pieces)
