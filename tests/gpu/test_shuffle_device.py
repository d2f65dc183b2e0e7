"""The shuffle on the GPU: cuDF and CuPy pieces move worker to worker over UCXX.

Three clusters: two workers sharing GPU 0 over UCXX and over tcp, and one worker per GPU over
UCXX (where the machine has two or more). Results are checked against pandas / NumPy, and the
ledger must say how the pieces went: as device buffers over UCX (``ucx-device``, one copy) or
staged through host memory over tcp (``tcp-host-staged``, two copies), and that tiny limits
spill them.
"""

from __future__ import annotations

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask.dataframe.shuffle import partitioning_index
from util import owner_of_rows, spill_at, worker_config

import dask_gpudirect as dg
from dask_gpudirect.cuda import gpu_count

pytestmark = pytest.mark.gpu

ROWS = 200_000


PATHS = {"ucxx": ("ucx-device", 1), "tcp": ("tcp-host-staged", 2)}


@pytest.fixture(
    scope="module",
    params=["ucxx-two-workers-one-gpu", "tcp-two-workers-one-gpu", "ucxx-one-worker-per-gpu"],
)
def client(request):
    from distributed import Client, LocalCluster

    protocol = request.param.partition("-")[0]
    if request.param.endswith("one-worker-per-gpu"):
        if gpu_count() < 2:
            pytest.skip("one worker per GPU needs 2 or more GPUs (nvidia-h200-x2)")
        cluster = dg.LocalCUDACluster(
            protocol="ucxx", dashboard_address=None, plugins={dg.GPUDirectPlugin()}
        )
    else:
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            protocol=protocol,
            dashboard_address=None,
            env={"CUDA_VISIBLE_DEVICES": "0"},
        )
    with Client(cluster) as c:
        c.register_plugin(dg.GPUDirectPlugin())
        yield c
    cluster.close()


@pytest.fixture(autouse=True)
def fresh_ledgers(client):
    client.run(_clear_ledger)
    yield
    client.run(dask.config.set, {"gpudirect.shuffle": DEFAULTS})  # undo a test's limits


DEFAULTS = dict(dg.config.defaults["gpudirect"]["shuffle"])


def _clear_ledger(dask_worker):
    dask_worker.plugins["gpudirect"].ledger.clear()


def _frame(rows: int, keys: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "k": rng.integers(0, keys, rows),
            "x": rng.random(rows),
            "i": np.arange(rows, dtype=np.int64),
        }
    )


def _check_hash_shuffle(
    client,
    pdf: pd.DataFrame,
    npartitions_in: int,
    npartitions: int,
    engine: str | None = None,
    check_dtype: bool = True,
):
    ddf = dd.from_pandas(pdf, npartitions=npartitions_in).to_backend("cudf")
    out = dg.shuffle(ddf, "k", npartitions=npartitions, client=client, engine=engine)
    assert out.npartitions == npartitions
    parts = client.gather(client.compute([out.get_partition(j) for j in range(npartitions)]))
    for j, part in enumerate(parts):
        assert type(part).__module__.startswith("cudf")
        if len(part):
            assert (owner_of_rows(part, "k", npartitions) == j).all()
    import cudf

    got = pd.concat([p.to_pandas() for p in parts]).sort_values("i")  # any order within one
    expected = cudf.from_pandas(pdf).to_pandas()  # the dtypes cuDF gives back (strings: <NA>)
    pd.testing.assert_frame_equal(got, expected, check_index_type=False, check_dtype=check_dtype)
    return out


def _rapidsmpf():
    pytest.importorskip("rapidsmpf")
    pytest.importorskip("cudf_streaming")
    return "rapidsmpf"


def test_rapidsmpf_engine_matches_pandas_and_the_distributed_engine(client):
    engine = _rapidsmpf()
    pdf = _frame(ROWS, 1000, seed=4)
    pdf["s"] = pdf["k"].astype(str) + "-label"  # strings
    pdf["n"] = pd.array(np.where(pdf["i"] % 7 == 0, None, pdf["i"]), dtype="Int64")  # nulls
    # pandas' string flavour (na_value) is cuDF's to choose: the dtypes are compared between
    # the engines below, as cuDF types
    ours = _check_hash_shuffle(client, pdf, 8, 6, engine=engine, check_dtype=False)
    theirs = _check_hash_shuffle(client, pdf, 8, 6, engine="distributed", check_dtype=False)
    got, want = (o.get_partition(0).compute() for o in (ours, theirs))
    assert got.dtypes.to_dict() == want.dtypes.to_dict() == ours._meta.dtypes.to_dict()
    for j in range(6):  # the same splitter: the same rows in each partition, in any order
        a, b = (set(o.get_partition(j)["i"].compute().to_pandas()) for o in (ours, theirs))
        assert a == b
    moved = _moved_paths(client)
    assert "rapidsmpf-ucx" in moved


def _mark_communicator(dask_worker) -> bool:
    """Mark this worker's RapidsMPF communicator; False where it has none."""
    from dask_gpudirect.shuffle.rapidsmpf_engine import RANKS

    ranks = getattr(dask_worker, RANKS, None)
    if ranks is not None:
        ranks.marked = True
    return ranks is not None


def _marked_communicator(dask_worker) -> bool:
    from dask_gpudirect.shuffle.rapidsmpf_engine import RANKS

    return getattr(getattr(dask_worker, RANKS, None), "marked", False)


def test_rapidsmpf_keeps_one_communicator_for_the_same_workers(client):
    """A RapidsMPF shuffle on workers that already share a communicator starts none: the plan
    learns it from the room each worker reports, and every row still lands in its partition."""
    engine = _rapidsmpf()
    pdf = _frame(ROWS, 1000, seed=9)
    _check_hash_shuffle(client, pdf, 4, 4, engine=engine)
    assert all(client.run(_mark_communicator).values())
    _check_hash_shuffle(client, pdf, 6, 3, engine=engine)
    assert all(client.run(_marked_communicator).values())


def test_rapidsmpf_engine_one_skewed_many_and_empty_partitions(client):
    engine = _rapidsmpf()
    pdf = _frame(ROWS, 1000, seed=5)
    pdf.loc[: ROWS * 9 // 10, "k"] = 7
    _check_hash_shuffle(client, pdf, 5, 64, engine=engine)
    _check_hash_shuffle(client, pdf, 5, 1, engine=engine)
    _check_hash_shuffle(client, pdf, 3, 1024, engine=engine)


def test_rapidsmpf_engine_keeps_decimals_lists_and_the_index(client):
    import cudf

    engine = _rapidsmpf()
    frame = cudf.DataFrame(
        {
            "k": cudf.Series(np.arange(5000) % 97),
            "d": cudf.Series(np.arange(5000) / 4).astype(cudf.Decimal64Dtype(12, 2)),
            "l": cudf.Series([[i, i + 1] if i % 5 else None for i in range(5000)]),
        },
        index=cudf.Index(np.arange(5000) * 3, name="row"),
    )
    ddf = dd.from_pandas(frame, npartitions=4)
    out = dg.shuffle(ddf, "k", npartitions=5, client=client, engine=engine)
    assert out._meta.dtypes.to_dict() == frame.dtypes.to_dict()
    got = out.compute().sort_index()
    assert got.index.name == "row"
    assert got.dtypes.to_dict() == frame.dtypes.to_dict()
    assert got.to_arrow().equals(frame.to_arrow())


@pytest.mark.parametrize("engine", ["distributed", "rapidsmpf"])
def test_a_read_shuffled_as_it_is_read_matches_pandas(client, engine, tmp_path):
    """An unpersisted ``dg.read_parquet``: its partitions are pinned to their workers, so the
    stages start before the files are read and take each partition as it is decoded on the
    GPU; the client never waits for the read."""
    from dask_gpudirect.shuffle import coordinator

    if engine == "rapidsmpf":
        _rapidsmpf()
    paths = []
    for k in range(6):
        frame = _frame(ROWS // 6, 500, seed=10 + k)
        frame["i"] += k * ROWS  # unique across the files
        paths.append(str(tmp_path / f"part-{k}.parquet"))
        frame.to_parquet(paths[-1], index=False)
    df = dg.read_parquet(paths, blocksize=1, client=client)
    out = dg.shuffle(df, "k", npartitions=4, client=client, engine=engine)
    assert "inputs" not in coordinator.last_phases, coordinator.last_phases
    parts = client.gather(client.compute([out.get_partition(j) for j in range(4)]))
    for j, part in enumerate(parts):
        assert type(part).__module__.startswith("cudf")
        assert (owner_of_rows(part, "k", 4) == j).all()
    got = pd.concat([p.to_pandas() for p in parts]).sort_values("i").reset_index(drop=True)
    expected = pd.concat([pd.read_parquet(p) for p in paths]).sort_values("i")
    pd.testing.assert_frame_equal(got, expected.reset_index(drop=True))


@pytest.mark.parametrize("engine", ["distributed", "rapidsmpf"])
@pytest.mark.parametrize("npartitions", [5, 300])
def test_ignore_index_labels_each_output_from_zero(client, engine, npartitions):
    """``ignore_index=True`` on the GPU, both engines: each output labelled 0, 1, 2... and
    holding exactly its rows (at 300 outputs a receiver gathers, at 5 it copies slices); a
    categorical column goes the way cuDF takes it and ends the same."""
    if engine == "rapidsmpf":
        _rapidsmpf()
    pdf = _frame(ROWS, 1000, seed=6)
    pdf.index = pd.Index(np.arange(ROWS) * 3, name="row")
    if engine == "distributed":  # RapidsMPF's tables carry no categories
        pdf["c"] = pd.Categorical(np.where(pdf["k"] % 2 == 0, "even", "odd"))
    ddf = dd.from_pandas(pdf, npartitions=8).to_backend("cudf")
    out = dg.shuffle(
        ddf, "k", npartitions=npartitions, client=client, engine=engine, ignore_index=True
    )
    parts = client.gather(client.compute([out.get_partition(j) for j in range(npartitions)]))
    for j, part in enumerate(parts):
        assert part.index.to_pandas().equals(pd.RangeIndex(len(part))), j
        if len(part):
            assert (owner_of_rows(part, "k", npartitions) == j).all()
    got = pd.concat([p.to_pandas() for p in parts]).sort_values("i").reset_index(drop=True)
    expected = pdf.reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_categorical=False)
    assert got.dtypes.astype(str).to_dict() == out._meta.dtypes.astype(str).to_dict()


def test_categories_of_outputs_follow_the_inputs_wherever_they_are(client):
    """cuDF inputs with categories of their own: every output holds their union in input
    order, whichever worker held which input (tests/test_shuffle.py, on the host)."""
    parts = [
        pd.DataFrame({"k": pd.Categorical([f"c{2 * i}", f"c{2 * i + 1}"] * 3), "x": range(6)})
        for i in range(4)
    ]
    whole = pd.concat(parts, ignore_index=True).astype({"k": "category"})
    ddf = dd.from_pandas(whole, npartitions=4, sort=False).to_backend("cudf")
    a, b = sorted(client.nthreads())
    for n, placement in enumerate(([a, a, b, b], [a, b, a, b])):
        # keys of their own: the same keys would stay where the first placement put them
        pieces = ddf.map_partitions(_own_categories, token=f"own-categories-{n}").to_delayed()
        futures = [client.compute(p, workers=[w]) for p, w in zip(pieces, placement, strict=True)]
        df = dd.from_delayed(futures, meta=ddf._meta, verify_meta=False)
        out = dg.shuffle(df, "k", npartitions=3, client=client)
        got = client.gather(client.compute([out.get_partition(j) for j in range(3)]))
        for part in got:
            assert part["k"].cat.categories.to_pandas().tolist() == [f"c{i}" for i in range(8)]
        rows = pd.concat([p.to_pandas() for p in got]).astype({"k": str})
        assert sorted(rows.itertuples(index=False)) == sorted(
            pd.concat(parts).astype({"k": str}).itertuples(index=False)
        )


def _own_categories(part):
    """``part`` with only the categories its rows hold, as a file read alone has them."""
    return part.assign(k=part["k"].astype(str).astype("category"))


def _keyed_frame(rows: int, seed: int) -> pd.DataFrame:
    """Keys of each kind a user shuffles on: integers, strings, nullable integers."""
    pdf = _frame(rows, 1000, seed=seed)
    pdf["s"] = pdf["k"].astype(str) + "-label"
    pdf["n"] = pd.array(np.where(pdf["i"] % 7 == 0, None, pdf["k"]), dtype="Int64")
    return pdf


@pytest.mark.parametrize("on", ["k", "s", "n", ["k", "s"]])
@pytest.mark.parametrize("npartitions", [1, 7, 300])
def test_unordered_cut_puts_rows_where_dasks_hash_does(client, on, npartitions):
    """The GPU's cut for ``keep_order=False`` (libcudf's ``hash_partition``) sends each row to
    the output Dask's ``partitioning_index`` names, for every kind of key, and loses none."""
    import cudf

    from dask_gpudirect import targets

    frame = cudf.from_pandas(_keyed_frame(20_000, seed=8))
    on = on if isinstance(on, list) else [on]
    cut = targets.module("device").hash_partition(frame, on, npartitions, frame.head(0), True)
    ordered, sizes = cut
    assert sizes.sum() == len(frame) and len(ordered) == len(frame)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for j in range(npartitions):
        part = ordered.iloc[bounds[j] : bounds[j + 1]]
        assert (partitioning_index(part[on], npartitions) == j).all(), (on, j)
    got = ordered.sort_values("i").to_pandas()
    pd.testing.assert_frame_equal(got, frame.to_pandas())


@pytest.mark.parametrize("on", ["k", "s", "n", ["k", "s"]])
@pytest.mark.parametrize("npartitions", [1, 7, 300])
def test_unordered_cut_puts_rows_where_dasks_shuffle_does(client, on, npartitions):
    """``dg.shuffle(..., keep_order=False)`` and ``shuffle_method="gpudirect"`` cut cuDF
    partitions with libcudf's ``hash_partition`` of the keys as Dask's own shuffle hashes them
    (numbers as float64), so each row lands where Dask's ``AssignPartitioningIndex`` puts it;
    hashing the integers as they are would not."""
    import cudf
    from dask.dataframe.dask_expr._shuffle import AssignPartitioningIndex

    from dask_gpudirect.shuffle.split import HashSplit, output_rows

    frame = cudf.from_pandas(_keyed_frame(20_000, seed=11))
    on = on if isinstance(on, list) else [on]
    meta = frame.head(0)
    splitter = HashSplit(on, npartitions, "device", meta, keep_order=False)
    ordered, cells = splitter.split([0], [frame])
    assert not cells[1].any() and cells[2].sum() == len(frame)  # all the first input's
    bounds = np.concatenate([[0], np.cumsum(output_rows(cells, npartitions))])
    as_is = 0
    for j in range(npartitions):
        part = ordered.iloc[bounds[j] : bounds[j + 1]]
        dasks = AssignPartitioningIndex.operation(part, on, "p", npartitions, meta, False)["p"]
        assert (dasks == j).all(), (on, j)
        as_is += int((partitioning_index(part[on], npartitions) != j).sum())
    if npartitions > 1 and "k" in on:  # the cast changes where integer keys go
        assert as_is > 0
    got = ordered.sort_values("i").to_pandas()
    pd.testing.assert_frame_equal(got, frame.to_pandas())


@pytest.mark.parametrize("engine", ["distributed", "rapidsmpf"])
@pytest.mark.parametrize("ignore_index", [False, True])
@pytest.mark.parametrize("chunk_size", ["auto", 1])
def test_keep_order_false_shuffles_every_row_to_its_partition(
    client, engine, ignore_index, chunk_size
):
    """``dg.shuffle(..., keep_order=False)`` on the GPU, both engines: each output holds exactly
    the rows Dask's hash gives it (in any order), strings and nulls whole, labels kept or
    dropped as asked; with a 1-byte chunk, every input is cut alone and a receiver joins one
    piece of each, from both workers in turn."""
    if engine == "rapidsmpf":
        _rapidsmpf()
    pdf = _keyed_frame(ROWS, seed=9)
    pdf.index = pd.Index(np.arange(ROWS) * 3, name="row")
    ddf = dd.from_pandas(pdf, npartitions=8).to_backend("cudf")
    with worker_config(client, {"gpudirect.shuffle.chunk-size": chunk_size}):
        out = dg.shuffle(
            ddf, "k", 6, client, engine=engine, ignore_index=ignore_index, keep_order=False
        )
        parts = client.gather(client.compute([out.get_partition(j) for j in range(6)]))
    for j, part in enumerate(parts):
        assert (owner_of_rows(part, "k", 6) == j).all()
    import cudf

    got = pd.concat([p.to_pandas() for p in parts]).sort_values("i")
    expected = cudf.from_pandas(pdf).to_pandas()  # the dtypes cuDF gives back (strings: <NA>)
    if ignore_index:
        expected = expected.reset_index(drop=True)
        got = got.reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert got.dtypes.astype(str).to_dict() == out._meta.dtypes.astype(str).to_dict()


def _indexed_by_row(seed: int) -> tuple[pd.DataFrame, dd.DataFrame]:
    """A keyed frame indexed by ``row`` (0, 3, 6...), and it in six cuDF partitions."""
    pdf = _keyed_frame(20_000, seed=seed)
    pdf.index = pd.Index(np.arange(len(pdf)) * 3, name="row")
    return pdf, dd.from_pandas(pdf, npartitions=6).to_backend("cudf")


def _five_outputs(client, out: dd.DataFrame) -> list:
    return client.gather(client.compute([out.get_partition(j) for j in range(5)]))


@pytest.mark.parametrize("engine", ["distributed", "rapidsmpf"])
@pytest.mark.parametrize("keep_order", [True, False])
@pytest.mark.parametrize("on", ["row", ["s", "row"], ["row", "s"]], ids=str)
def test_on_the_index_of_cudf_partitions(client, engine, keep_order, on):
    """The index's name in ``on`` on the GPU, as on the host: hashed in its place among the
    columns (where Dask's ``df.shuffle`` puts each row), labels kept, both engines."""
    if engine == "rapidsmpf":
        if keep_order:
            pytest.skip("the rapidsmpf engine never keeps the order")
        _rapidsmpf()
    pdf, ddf = _indexed_by_row(seed=10)
    parts = _five_outputs(
        client, dg.shuffle(ddf, on, 5, client, engine=engine, keep_order=keep_order)
    )
    for j, part in enumerate(parts):
        assert (owner_of_rows(part.reset_index(), on, 5) == j).all()
    import cudf

    got = pd.concat([p.to_pandas() for p in parts]).sort_values("i")
    pd.testing.assert_frame_equal(got, cudf.from_pandas(pdf).to_pandas(), check_dtype=False)


@pytest.mark.parametrize(
    ("engine", "keep_order"),
    [("distributed", True), ("distributed", False), ("rapidsmpf", False)],
    ids=["distributed-ordered", "distributed-unordered", "rapidsmpf"],
)
@pytest.mark.parametrize("on", [["row", "row"], ["row", "s", "row"]], ids=str)
def test_the_index_named_twice_in_on_is_hashed_once_after_the_columns(
    client, engine, keep_order, on
):
    """The index named twice in ``on`` on the GPU, as on the host (tests/test_shuffle.py):
    Dask's ``df.shuffle`` hashes it once, after the columns (``_select_columns_or_index``),
    and partition ``j`` holds the rows of dask_cudf's own task shuffle's partition ``j``, both
    engines, labels kept. Keys naming the index never take the unordered cut: each row's
    output is ``HashSplit.destinations``' on every engine."""
    if engine == "rapidsmpf":
        _rapidsmpf()
    pdf, ddf = _indexed_by_row(seed=13)
    parts = _five_outputs(
        client, dg.shuffle(ddf, on, 5, client, engine=engine, keep_order=keep_order)
    )
    tasks = ddf.shuffle(on, npartitions=5, shuffle_method="tasks")
    theirs = client.gather(client.compute(tasks.to_delayed()))
    hashed = [c for c in on if c != "row"] + ["row"]  # the columns, then the index once
    assert sum(map(len, parts)) == len(pdf)
    for j, (mine, dasks) in enumerate(zip(parts, theirs, strict=True)):
        assert type(mine).__module__.startswith("cudf")
        assert mine.index.name == "row"
        assert (owner_of_rows(mine.reset_index(), hashed, 5) == j).all(), (on, j)
        pd.testing.assert_frame_equal(
            mine.to_pandas().sort_values("i"), dasks.to_pandas().sort_values("i"), obj=str(j)
        )


@pytest.mark.parametrize("on", ["s", "k", ["n", "s"]], ids=str)
def test_dasks_shuffle_method_on_cudf_partitions(client, on):
    """``shuffle_method="gpudirect"`` on dask_cudf frames: ``df.shuffle`` gives, partition for
    partition, the rows Dask's task shuffle gives (in no set order within one, as dask_cudf's
    own), on string, integer and nullable keys, and a group-by with ``split_out`` and a merge
    give pandas' results."""
    from dask_gpudirect.shuffle.api import Computed

    pdf = _keyed_frame(20_000, seed=12)
    ddf = dd.from_pandas(pdf, npartitions=6).to_backend("cudf")
    ours = ddf.shuffle(on, npartitions=5, shuffle_method="gpudirect").optimize()
    assert any(isinstance(e, Computed) for e in ours.expr.walk())
    tasks = ddf.shuffle(on, npartitions=5, shuffle_method="tasks")
    got = client.gather(client.compute(ours.to_delayed()))
    expected = client.gather(client.compute(tasks.to_delayed()))
    for mine, dasks in zip(got, expected, strict=True):
        pd.testing.assert_frame_equal(
            mine.to_pandas().sort_values("i"), dasks.to_pandas().sort_values("i")
        )
    right = pd.DataFrame({"k": np.arange(0, 1000, 3), "w": np.arange(334) * 0.5})
    with dask.config.set({"dataframe.shuffle.method": "gpudirect"}):
        sums = ddf.groupby("k").x.sum(split_out=4).compute().to_pandas()
        joined = ddf.merge(dd.from_pandas(right, 3).to_backend("cudf"), on="k").compute()
    pd.testing.assert_series_equal(sums.sort_index(), pdf.groupby("k").x.sum(), rtol=1e-12)
    expected_join = pdf.merge(right, on="k").sort_values("i").reset_index(drop=True)
    got_join = joined.to_pandas().sort_values("i").reset_index(drop=True)
    pd.testing.assert_frame_equal(got_join[expected_join.columns], expected_join, check_dtype=False)


def test_auto_hands_few_unordered_partitions_to_rapidsmpf(client):
    """``engine="auto"`` (the default) picks RapidsMPF only where it was measured the faster and
    gives what was asked for: ``keep_order=False`` and at most 32 partitions. Ordered rows,
    many partitions and a categorical column (which its tables do not carry) stay on the
    package's own exchange; the ledger says which moved the bytes, and every row arrives."""
    _rapidsmpf()
    ours = PATHS[client.scheduler.address.partition("://")[0]][0]
    pdf = _frame(ROWS, 1000, seed=11)
    categorical = pdf.assign(c=pd.Categorical(np.where(pdf["k"] % 2 == 0, "even", "odd")))
    for frame, npartitions, keep_order, path in [
        (pdf, 4, False, "rapidsmpf-ucx"),
        (pdf, 4, True, ours),
        (pdf, 64, False, ours),
        (categorical, 4, False, ours),
    ]:
        client.run(_clear_ledger)
        ddf = dd.from_pandas(frame, npartitions=4).to_backend("cudf")
        out = dg.shuffle(ddf, "k", npartitions, client, ignore_index=True, keep_order=keep_order)
        parts = client.gather(client.compute([out.get_partition(j) for j in range(npartitions)]))
        assert sum(map(len, parts)) == ROWS
        assert _moved_paths(client) == {path}, (npartitions, keep_order, list(frame.columns))


def test_auto_falls_back_where_rapidsmpf_would_spill_and_rapidsmpf_spills_to_host(client):
    """Where a worker's share is beyond its GPU room (``gpudirect.shuffle.device-limit``),
    ``auto`` runs the package's exchange (RapidsMPF was measured only where it need not spill);
    ``engine="rapidsmpf"`` spills to host memory, and says so in the ledger; beyond host room
    too it fails before a byte moves, saying why, and the cluster stays usable."""
    _rapidsmpf()
    ours = PATHS[client.scheduler.address.partition("://")[0]][0]
    ddf = dd.from_pandas(_frame(ROWS, 1000, seed=12), npartitions=4).to_backend("cudf")

    def rows_paths_spilled(**options) -> tuple[int, set, int]:
        client.run(_clear_ledger)
        out = dg.shuffle(ddf, "k", 4, client, ignore_index=True, keep_order=False, **options)
        parts = client.gather(client.compute([out.get_partition(j) for j in range(4)]))
        records = dg.ledger_report.records(client)
        spilled = records.query("op == 'spill' and path == 'device-to-host'").bytes.sum()
        return sum(map(len, parts)), _moved_paths(client), int(spilled)

    client.run(dask.config.set, {"gpudirect.shuffle.device-limit": "1MiB"})
    rows, paths, _ = rows_paths_spilled()
    assert (rows, paths) == (ROWS, {ours})
    rows, paths, spilled = rows_paths_spilled(engine="rapidsmpf")
    assert (rows, paths) == (ROWS, {"rapidsmpf-ucx"}) and spilled > 0
    client.run(dask.config.set, {"gpudirect.shuffle.host-limit": "1MiB"})
    with pytest.raises(dg.ShuffleError, match="'rapidsmpf' engine spills to host memory, not"):
        rows_paths_spilled(engine="rapidsmpf")
    assert rows_paths_spilled(engine="distributed")[:2] == (ROWS, {ours})  # through disk
    client.run(dask.config.set, {"gpudirect.shuffle": DEFAULTS})
    rows, paths, spilled = rows_paths_spilled()
    assert (rows, paths, spilled) == (ROWS, {"rapidsmpf-ucx"}, 0)


def _sums(part):
    return part.groupby("k")["x"].sum()


@pytest.mark.parametrize("engine", ["distributed", "rapidsmpf"])
def test_then_sums_each_output_on_its_gpu(client, engine):
    """``then=`` on the GPU, both engines: each output summed by key where it was built, the
    sums cuDF series, and together pandas' sums."""
    if engine == "rapidsmpf":
        _rapidsmpf()
    pdf = _frame(ROWS, 1000, seed=7)
    ddf = dd.from_pandas(pdf, npartitions=8).to_backend("cudf")
    out = dg.shuffle(ddf, "k", npartitions=6, client=client, engine=engine, then=_sums)
    parts = client.gather(client.compute([out.get_partition(j) for j in range(6)]))
    assert all(type(part).__module__.startswith("cudf") for part in parts)
    got = pd.concat([part.to_pandas() for part in parts]).sort_index()
    assert got.index.is_unique
    pd.testing.assert_series_equal(got, pdf.groupby("k")["x"].sum(), check_index_type=False)


def _device_chunk(dask_worker) -> tuple[int, int]:
    from dask_gpudirect import targets
    from dask_gpudirect.shuffle.plugin import service

    memory = targets.module("device").memory_bytes(dask_worker)
    return service(dask_worker).batches("device")["chunk"], memory


def test_chunk_size_auto_is_2_gib_on_the_gpu(client):
    """``chunk-size: auto`` splits 2 GiB at once on the device target (512 MiB on the host:
    ``tests/test_shuffle.py``), at most 1/16 of the GPU's memory."""
    from dask_gpudirect.cluster import ensure_plugins

    ensure_plugins(client)
    for chunk, memory in client.run(_device_chunk).values():
        assert chunk == min(2 * 2**30, memory // 16)


def test_hash_shuffle_matches_pandas(client):
    pdf = _frame(ROWS, 1000)
    out = _check_hash_shuffle(client, pdf, 8, 6)
    sums = out.groupby("k").x.sum().compute().to_pandas().sort_index()
    pd.testing.assert_series_equal(sums, pdf.groupby("k").x.sum(), check_exact=False)


def test_skewed_keys_empty_and_many_partitions(client):
    pdf = _frame(ROWS, 1000, seed=1)
    pdf.loc[: ROWS * 9 // 10, "k"] = 7  # 90 % of the rows share one key
    _check_hash_shuffle(client, pdf, 5, 64)  # most of the 64 outputs get few or no rows


def _moved_paths(client) -> set:
    return set(dg.ledger_report.records(client).query("op == 'shuffle' and path != 'local'").path)


def test_ledger_says_how_device_buffers_went(client):
    _check_hash_shuffle(client, _frame(ROWS, 1000, seed=2), 8, 8)
    records = dg.ledger_report.records(client)
    moved = records[(records.op == "shuffle") & (records.path != "local")]
    path, copies = PATHS[client.scheduler.address.partition("://")[0]]
    assert set(moved.path) == {path}
    assert set(moved.copies) == {copies}
    assert moved.bytes.sum() > 0


def test_spills_device_to_host_to_disk_and_stays_correct(client):
    client.run(
        dask.config.set,
        {"gpudirect.shuffle.device-limit": "64KiB", "gpudirect.shuffle.host-limit": "64KiB"},
    )
    _check_hash_shuffle(client, _frame(ROWS, 1000, seed=3), 8, 8)
    spills = dg.ledger_report.records(client).query("op == 'spill'")
    assert {"device-to-host", "host-to-disk"} <= set(spills.path)


def test_host_tier_goes_to_disk_while_the_worker_is_past_its_spill_threshold(client):
    """Pieces spilled from the GPU to host memory (``host-limit`` counts only them) leave it for
    disk while the worker's process is past Distributed's spill threshold, as its own data
    does; without a threshold they stay in host memory. Rows exact either way."""
    client.run(
        dask.config.set,
        {"gpudirect.shuffle.device-limit": "64KiB", "gpudirect.shuffle.host-limit": "1GiB"},
    )
    kept = client.run(lambda dask_worker: dask_worker.memory_manager.memory_spill_fraction)
    try:
        for fraction in (False, 0.01):  # 1 %: always past it
            client.run(spill_at, fraction=fraction)
            client.run(_clear_ledger)
            _check_hash_shuffle(client, _frame(ROWS, 1000, seed=4), 8, 8)
            spills = dg.ledger_report.records(client).query("op == 'spill'")
            to_host = spills.query("path == 'device-to-host'").bytes.sum()
            to_disk = spills.query("path == 'host-to-disk'").bytes.sum()
            assert to_host > 0
            assert (to_disk >= 0.9 * to_host) if fraction else to_disk == 0, (to_host, to_disk)
    finally:
        for worker, fraction in kept.items():
            client.run(spill_at, fraction=fraction, workers=[worker])


def test_shuffle_array_is_a_seeded_permutation_on_the_gpu(client):
    import cupy

    records = np.arange(100_000 * 3, dtype=np.float32).reshape(100_000, 3)
    arr = da.from_array(records, chunks=(9_000, 3)).map_blocks(cupy.asarray)
    one = dg.shuffle_array(arr, seed=11, client=client)
    assert one.chunks == arr.chunks
    blocks = client.gather(client.compute(one.to_delayed().ravel().tolist()))
    assert all(isinstance(b, cupy.ndarray) for b in blocks)
    got = cupy.asnumpy(cupy.concatenate(blocks))
    np.testing.assert_array_equal(got[np.argsort(got[:, 0])], records)  # rows kept whole
    assert not np.array_equal(got, records)
    again = cupy.asnumpy(dg.shuffle_array(arr, seed=11, client=client).compute())
    other = cupy.asnumpy(dg.shuffle_array(arr, seed=12, client=client).compute())
    np.testing.assert_array_equal(again, got)
    assert not np.array_equal(other, got)
    assert _moved_paths(client) == {PATHS[client.scheduler.address.partition("://")[0]][0]}
