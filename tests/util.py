"""Helpers for the tests; shipped to workers by value (see conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import gc
import glob
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dask.dataframe.shuffle import partitioning_index
from distributed import LocalCluster, Nanny
from pandas.testing import assert_frame_equal

import dask_gpudirect as dg
from dask_gpudirect import cluster as dg_cluster
from dask_gpudirect import ledger
from dask_gpudirect.placement import _shards_of
from dask_gpudirect.shuffle.plugin import service as shuffle_service

# Worker processes (and the netns hosts' `dask worker`s) cannot import this directory: helpers
# sent with client.run travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Seconds a test's subprocess may run before it counts as hung. Generous on purpose: CI
#: machines are shared and loaded, and a test asserts what a run did, never how fast it was
#: (speed is for the benchmarks). The per-test pytest timeout (pyproject.toml) is above it.
HANG_GUARD = 600

#: The comm handler a worker's shuffle service receives pieces on.
RECEIVE = "gpudirect_shuffle_receive"

PLUGIN = "gpudirect"


def plugin_options(dask_worker) -> dict:
    """The options the worker's GPUDirectPlugin resolved (run on a worker)."""
    return dict(dask_worker.plugins[PLUGIN].options)


def has_plugin(dask_worker) -> bool:
    return PLUGIN in dask_worker.plugins


def clear_ledger(dask_worker) -> None:
    ledger.of(dask_worker).clear()  # the readers' and the shuffle's, plugin or not


def clear_ledgers(client) -> None:
    """Empty every worker's ledger, so a test sees only its own reads."""
    client.run(clear_ledger)


def workers_info(client) -> dict:
    """Each worker's entry on the scheduler, asked for now.

    ``client.scheduler_info()`` is not safe here: the client's periodic refresh asks for no
    workers, and its empty answer can replace the full one before the call returns. Where only
    the addresses matter, ``client.nthreads()`` asks the scheduler directly.
    """
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def compute(client, collection):
    """``collection`` computed on ``client``'s cluster (never on another default client)."""
    return client.compute(collection).result()


def partitions(client, df) -> list:
    """The partitions of ``df`` as the objects the workers made."""
    return client.gather(client.compute(df.to_delayed()))


def dask_filters(filters):
    """``filters`` as the pyarrow expression ``dd.read_parquet`` filters rows with: its null
    rules (``!=`` and ``not in`` keep nulls, unlike pyarrow's own DNF) are the reference."""
    from dask.dataframe.io.parquet.arrow import _filters_to_expression

    return None if filters is None else _filters_to_expression(filters)


def as_dask_converts(table: pa.Table) -> pd.DataFrame:
    """``table`` in the pandas types ``dd.read_parquet`` gives by default (Dask's
    ``convert-string``: strings as ``string[pyarrow]``, dates and decimals pyarrow-backed)."""
    from dask.dataframe.io.parquet.arrow import ArrowDatasetEngine

    return table.to_pandas(
        types_mapper=ArrowDatasetEngine._determine_type_mapper(convert_string=True)
    )


def expected_parquet(paths, columns=None, filters=None) -> pd.DataFrame:
    """What Dask reads from ``paths`` (one file or a list) with ``filters``, by pyarrow, as
    one pandas frame."""
    if isinstance(paths, (list, tuple)):
        frames = [expected_parquet(p, columns, filters) for p in paths]
        return pd.concat(frames, ignore_index=True)
    return as_dask_converts(pq.read_table(paths, columns=columns, filters=dask_filters(filters)))


def assert_same_frame(got: pd.DataFrame, expected: pd.DataFrame, by=None) -> None:
    """Equal frames up to row order (when ``by`` is given) and index."""
    if by is not None:
        got = got.sort_values(by, kind="stable")
        expected = expected.sort_values(by, kind="stable")
    assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


def sample_frame(n: int, keys: int, seed: int = 0) -> pd.DataFrame:
    """Keys, values of several dtypes (nulls included) and a named, non-default index."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, keys, n)
    return pd.DataFrame(
        {
            "k": k,
            "s": pd.array([f"s{i % 7}" for i in range(n)], dtype="string"),
            "v": rng.random(n),
            "n": pd.array([None if i % 5 == 0 else i for i in range(n)], dtype="Int64"),
            "c": pd.Categorical([("x", "y", "z")[i % 3] for i in range(n)]),
            "t": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 10**6, n), "s"),
        },
        index=pd.Index(np.arange(n) * 3 + 1, name="row"),
    )


def owner_of_rows(frame, on, npartitions: int) -> np.ndarray:
    """The output partition of each row of a pandas or cuDF ``frame``, as Dask's own shuffle
    assigns it: ``partitioning_index`` of the ``on`` columns, numbers (and categories of
    numbers) hashed as float64, so int32, int64 and float64 keys of one value agree."""
    on = list(on) if isinstance(on, (list, tuple)) else [on]
    keys = frame[on]
    numbers = {c: "float64" for c, t in keys.dtypes.items() if _number(t)}
    return partitioning_index(keys.astype(numbers), npartitions).to_numpy()


def _number(dtype) -> bool:
    categories = getattr(dtype, "categories", None)
    kind = dtype if categories is None else categories.dtype
    return pd.api.types.is_numeric_dtype(kind)


def assert_hash_partitions(parts: list, pdf: pd.DataFrame, on, npartitions: int) -> None:
    """Shuffle output ``j`` is exactly the rows of ``pdf`` that hash to ``j``, in input order."""
    assert len(parts) == npartitions
    where = owner_of_rows(pdf, on, npartitions)
    for j, part in enumerate(parts):
        assert isinstance(part, pd.DataFrame)
        assert_frame_equal(part, pdf[where == j])


def received_pieces(outputs: range, inputs: int, interleaved: bool, seed: int) -> list:
    """What a receiver of ``outputs`` gets from two senders of ``inputs`` partitions between
    them (the even and the odd ones, or each a half), each sending two chunks: pieces
    ``(chunk's inputs, first output, counts)`` in input order, with random counts and an output
    that no row of a chunk goes to (``assembly_segments`` takes each table's ``cells_of``)."""
    rng = np.random.default_rng(seed)
    half = inputs // 2
    senders = [tuple(range(w, inputs, 2)) if interleaved else tuple(range(half * w, half * (w + 1)))
               for w in range(2)]  # fmt: skip
    pieces = []
    for sent in senders:
        for chunk in (sent[: half // 2], sent[half // 2 :]):
            counts = rng.integers(0, 3, (len(chunk), len(outputs)))
            counts[:, 2] = 0
            pieces.append((chunk, outputs.start, counts))
    return sorted(pieces, key=lambda piece: piece[0][0])


def load_good(client, path) -> None:
    """The cluster still loads a good dataset after a failure."""
    got = compute(client, dg.read_parquet(path, client=client))
    assert_same_frame(got, expected_parquet(path))


def shard_of(task):
    """The (first) shard a task loads, looking inside fused tasks; None for other tasks."""
    shards = _shards_of(task)
    return shards[0] if shards else None


def shards_of(collection) -> dict:
    """Partition/chunk index -> the Shard its task loads, from the collection's graph."""
    found = {}
    for key, task in dict(collection.__dask_graph__()).items():
        shard = shard_of(task)
        if shard is not None:
            found[key[1]] = shard
    return found


#: UCX on this CPU-only machine, in every process of the tests: set in this one by
#: :func:`ucx_environment`, inherited by the processes it starts.
UCX_CPU_ENV = {"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}
#: How UCXX makes progress in the processes the tests start (workers, schedulers), as in those
#: the package starts; see :func:`ucx_environment` for why, and why not in this process.
UCX_PROGRESS_ENV = dg_cluster.UCX_PROGRESS_ENV


def ucx_environment() -> None:
    """Set :data:`UCX_CPU_ENV` (where not set already) before ucxx is first imported.

    ``UCX_TLS=tcp`` keeps UCX on TCP sockets. The cluster also starts without it (UCX then
    picks shared memory/CMA as well), but those depend on the container (ptrace rules, /dev/shm
    size); TCP works anywhere and is what a CPU-only run should exercise. Worker processes
    inherit the variables, so client, scheduler and workers agree on one transport.
    ``UCX_WARN_UNUSED_ENV_VARS=n`` silences UCX's warning about ``UCX_MEMTYPE_CACHE``, which
    distributed-ucxx sets and this UCX no longer reads.

    :data:`UCX_PROGRESS_ENV` goes to the processes the tests start, not to this one.
    distributed-ucxx's default progress mode, ``blocking``, spins on UCX's event descriptor, so
    every ucxx process takes a whole core while idle (measured: a scheduler and one idle worker,
    100 % each); on 2 cores that starved the rest until heartbeats missed and the scheduler
    dropped a worker. ``thread`` progress with Python futures completes requests from UCXX's
    notifier thread, and an idle process stays near 0 %. But those futures belong to one event
    loop, and this process runs UCXX from several (the session clusters' and each synchronous
    client's): there a request fails with "got Future attached to a different loop". So this
    process keeps the default, and spins alone. See docs/troubleshooting.md.
    """
    for name, value in UCX_CPU_ENV.items():
        os.environ.setdefault(name, value)


class PatientNanny(Nanny):
    """A Nanny that gives its worker process 30 s to stop when the cluster closes, not 5.

    ``Nanny.close`` waits 4 s for the worker to stop, kills it, and leaves what is left of the
    5 s to reap it: on a loaded machine ``cluster.close()`` then raises TimeoutError after the
    test itself has passed. Only that deadline differs from a user's cluster.
    """

    async def close(self, timeout: float = 30, reason: str = "nanny-close") -> str:
        return await super().close(timeout=timeout, reason=reason)


def start_cluster(protocol: str, n_workers: int = 2, threads: int = 2, **kwargs) -> LocalCluster:
    """A LocalCluster with worker processes over ``protocol`` (dashboard on a free port).

    ``kwargs`` go to LocalCluster, and from there to each worker's Nanny where LocalCluster does
    not take them (e.g. ``config=``).
    """
    if protocol == "ucxx":
        pytest.importorskip("distributed_ucxx")
        ucx_environment()
        kwargs["env"] = {**UCX_PROGRESS_ENV, **kwargs.get("env", {})}
    return LocalCluster(
        protocol=protocol,
        n_workers=n_workers,
        threads_per_worker=threads,
        processes=True,
        dashboard_address=":0",
        host="127.0.0.1",
        worker_class=PatientNanny,
        **kwargs,
    )


def delay_receive(dask_worker, seconds: float) -> None:
    """Make this worker sleep ``seconds`` before it takes each shuffle message."""
    service = shuffle_service(dask_worker)

    async def receive(**msg):
        await asyncio.sleep(seconds)
        return await service.receive(**msg)

    dask_worker.handlers[RECEIVE] = receive


# --- dask scheduler / dask worker as real processes -----------------------------------------


def dask_command(name: str) -> list[str]:
    """The ``dask <name>`` command of this environment."""
    script = shutil.which("dask", path=os.path.dirname(sys.executable))
    if script:
        return [script, name]
    return [sys.executable, "-m", f"distributed.cli.dask_{name}"]


def spawn(args: list[str], log, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=os.path.dirname(log.name),
    )


def wait_for_address(scheduler_file, procs, timeout=300) -> str:
    """The scheduler's address, once it has written its file (whole)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(scheduler_file) as f:
                return json.load(f)["address"]
        except (OSError, ValueError, KeyError):
            pass
        for p in procs:
            assert p.poll() is None, f"{p.args} exited with {p.returncode}"
        assert time.monotonic() < deadline, f"{scheduler_file} never appeared"
        time.sleep(0.2)


# --- config on running workers ---------------------------------------------------------------


def set_config(values: dict) -> dict:
    """Set ``values`` in this process's Dask config for good; the values they replace."""
    old = {key: dask.config.get(key) for key in values}
    dask.config.set(values)
    return old


def spill_at(dask_worker, fraction) -> None:
    """Set the worker's spill threshold (``distributed.worker.memory.spill``), as it runs."""
    dask_worker.memory_manager.memory_spill_fraction = fraction


@contextlib.contextmanager
def worker_config(client, values: dict):
    """``values`` in every worker's config (read when a shuffle run starts), then restored."""
    old = client.run(set_config, values)
    try:
        yield
    finally:
        for worker, previous in old.items():
            client.run(set_config, previous, workers=[worker])


# --- Parquet of every kind of column (issue 15) --------------------------------------------------

NESTED_ROWS = 40  # per file, in two row groups


def nested_columns(k: int) -> dict[str, pa.Array]:
    ks = range(k * NESTED_ROWS, (k + 1) * NESTED_ROWS)
    point = pa.struct([("a", pa.int32()), ("b", pa.string())])
    return {
        "id": pa.array(ks, pa.int64()),
        "map": pa.array(
            [None if i % 7 == 0 else [(f"k{j}", i + j) for j in range(i % 3)] for i in ks],
            pa.map_(pa.string(), pa.int32()),
        ),
        "list_of_struct": pa.array(
            [[{"a": i + j, "b": f"s{j}"} for j in range(i % 4)] for i in ks], pa.list_(point)
        ),
        "struct_of_list": pa.array(
            [None if i % 5 == 0 else {"x": list(range(i % 3)), "y": f"y{i}"} for i in ks],
            pa.struct([("x", pa.list_(pa.int64())), ("y", pa.string())]),
        ),
        "deep": pa.array(
            [[[{"a": i, "b": None}] * (i % 2)] * (i % 3) for i in ks],
            pa.list_(pa.list_(point)),
        ),
        "half": pa.array(np.arange(len(ks), dtype=np.float16) / 4, pa.float16()),
    }


#: apache/parquet-testing's files, where ``scripts/parquet-corpus.sh`` put them.
CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".corpus")


#: Why the corpus tests skip where it is missing.
NO_CORPUS = f"no Parquet corpus in {CORPUS}: run scripts/parquet-corpus.sh first"


def corpus_files() -> list[str]:
    """The public corpus of unusual Parquet files (Impala, Spark, parquet-mr, Arrow and Rust
    writers), empty where it was not fetched."""
    return sorted(glob.glob(os.path.join(CORPUS, "parquet-testing", "data", "*.parquet")))


def assert_refused_by_name(client, path: str, target: str, cause: Exception) -> None:
    """A file the reference reader refused (``cause``): dg must refuse it too, naming it."""
    with pytest.raises(dg.InputError) as info:
        client.compute(dg.read_parquet(path, target=target, client=client)).result()
    assert info.value.path == path, (str(info.value), repr(cause))


def write_nested_parquet(directory) -> list[str]:
    """Three files of :func:`nested_columns`, two row groups each: maps, lists of structs,
    structs of lists, a list of lists of structs, float16."""
    paths = []
    for k in range(3):
        paths.append(os.path.join(directory, f"part-{k}.parquet"))
        pq.write_table(pa.table(nested_columns(k)), paths[-1], row_group_size=NESTED_ROWS // 2)
    return paths


#: The client's phases of a shuffle, in order, as the benchmarks report them ("client: plan", ...),
#: then the garbage collector's time inside them: waiting for the inputs first, except where they
#: are reads placed on their workers, which the stages take as they are read.
CLIENT_PHASES = ("inputs", "plan", "start", "stages", "publish")
PLACED_PHASES = CLIENT_PHASES[1:]
GC = "garbage collection"


def assert_released(client, held, *args, timeout: float = 10.0) -> None:
    """What a user dropped leaves the workers: ``held(*args)``, run on each worker, finds
    nothing left within ``timeout`` seconds of a garbage collection here (the release is a
    message on the client's stream)."""
    gc.collect()
    deadline = time.monotonic() + timeout
    while any(client.run(held, *args).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(client.run(held, *args).values())


def wait_for_file(path, what: str) -> None:
    """Wait until ``path`` exists: a step of another process (a worker's task or handler) that
    touches it has happened. Fails after :data:`HANG_GUARD` seconds naming ``what``."""
    deadline = time.monotonic() + HANG_GUARD
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


@contextlib.contextmanager
def stopped(client, worker: str):
    """``worker``'s process stopped (SIGSTOP: alive to the kernel and the scheduler, answering
    nothing) for the block, and going on (SIGCONT) after it, however the block ends."""
    pid = client.run(os.getpid, workers=[worker])[worker]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def error_while_stopped(client, worker: str, call, error: type, match: str) -> BaseException:
    """The ``error`` (its message matching ``match``) that ``call()``, run in a thread, ends in
    while ``worker`` is stopped: not a wait for as long as the worker stays stopped."""
    with ThreadPoolExecutor(1) as pool, stopped(client, worker):  # goes on before the join
        running = pool.submit(call)
        with pytest.raises(error, match=match) as info:
            running.result(timeout=HANG_GUARD)
    return info.value


def later(path) -> None:
    """Move ``path``'s modification time a second on, as a real later write would (two writes
    within one tick of a coarse file system clock may share it)."""
    info = os.stat(path)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


#: (name, one file's type, another's, the type the read gives both): pyarrow's permissive
#: unify, as a dataset written over time stores a column (pandas writes an int column with a
#: missing value as double, a column of None alone as null)
EVOLVED_TYPES = [
    ("int-widths", pa.int32(), pa.int64(), pa.int64()),
    ("int-and-double", pa.int64(), pa.float64(), pa.float64()),
    ("float-widths", pa.float32(), pa.float64(), pa.float64()),
    ("timestamp-units", pa.timestamp("ns"), pa.timestamp("us"), pa.timestamp("ns")),
    ("large-string", pa.string(), pa.large_string(), pa.large_string()),
    ("nulls-alone", pa.null(), pa.string(), pa.string()),
    ("nulls-and-ints", pa.null(), pa.int64(), pa.int64()),
    ("nulls-and-bools", pa.null(), pa.bool_(), pa.bool_()),
    ("decimal-widths", pa.decimal128(10, 2), pa.decimal128(12, 3), pa.decimal128(12, 3)),
]


def write_evolved_parquet(
    root, first: pa.DataType, second: pa.DataType, read_as: pa.DataType
) -> tuple[pathlib.Path, pathlib.Path]:
    """In ``root/data``, four files of 50 rows, ``v`` stored as ``first`` in two and
    ``second`` in the others (alternating, so runs of one type and joined partitions of both
    are read), with a null; and ``root/unified.parquet``, their rows in one file with ``v``
    stored as ``read_as``, what a reader's result is compared with. Both paths."""
    data = root / "data"
    data.mkdir()
    tables = []
    for i, kind in enumerate([first, second, first, second]):
        ids = np.arange(50) + 50 * i
        values = [None if pa.types.is_null(kind) or k % 7 == 3 else int(k) for k in ids]
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            values = [None if v is None else f"v{v}" for v in values]
        elif pa.types.is_decimal(kind):
            values = [None if v is None else decimal.Decimal(v) / 4 for v in values]
        elif pa.types.is_boolean(kind):
            values = [None if v is None else v % 3 == 0 for v in values]
        tables.append(pa.table({"id": ids, "v": pa.array(values, kind)}))
        pq.write_table(tables[-1], data / f"part.{i}.parquet", row_group_size=20)
    unified = pa.schema([("id", pa.int64()), ("v", read_as)])
    pq.write_table(pa.concat_tables(t.cast(unified) for t in tables), root / "unified.parquet")
    return data, root / "unified.parquet"


# --- Parquet files the host tests and the GPU suite read alike -----------------------------------


def frame(start: int, n: int = 50) -> pd.DataFrame:
    """Rows in the types ``dd.read_parquet`` gives them (strings as ``string[pyarrow]``)."""
    ids = np.arange(start, start + n)
    text = pd.array([f"v{i}" for i in ids], dtype=pd.StringDtype("pyarrow"))
    return pd.DataFrame({"id": ids, "x": ids * 0.5, "s": text})


def write_index_named_by_the_empty_string(stored, column) -> None:
    """In ``stored``, one file of 4 row groups whose index pandas stored under the name ``""``
    (the squares 0..361); in ``column``, one file whose column ``""`` holds 0..19."""
    os.makedirs(stored, exist_ok=True)
    os.makedirs(column, exist_ok=True)
    pdf = frame(0, 20).set_index(pd.Index(np.arange(20) ** 2, name=""))
    pdf.to_parquet(os.path.join(stored, "0.parquet"), row_group_size=5)
    frame(0, 20).rename(columns={"id": ""}).to_parquet(os.path.join(column, "0.parquet"))


#: Two files' indexes as pandas stores them (``index``: ``to_parquet``'s; ``range``: a
#: RangeIndex of that name), and how the refusal names the second's and the first's.
OTHER_INDEXES = [
    ({}, {"index": False}, "none", "column 'k'"),
    ({"index": False}, {}, "column 'k'", "none"),
    ({"range": "r"}, {"range": None}, "none", "a RangeIndex named 'r'"),
    ({"range": "r"}, {"range": "s"}, "a RangeIndex named 's'", "a RangeIndex named 'r'"),
]
OTHER_INDEX_IDS = ["indexed-first", "indexed-second", "named-range-first", "two-range-names"]


def write_other_indexes(directory, first: dict, second: dict) -> None:
    """``part.0.parquet`` and ``part.1.parquet`` in ``directory``, columns ``k`` and ``v``,
    their indexes stored as ``first`` and ``second`` say (:data:`OTHER_INDEXES`)."""
    for i, how in enumerate([first, second]):
        rows = pd.DataFrame({"k": [5 + 3 * i, 1 + 3 * i, 2 + 3 * i], "v": np.arange(3.0)})
        if "range" in how:
            rows = rows.set_index(pd.RangeIndex(3, name=how["range"]))
        else:
            rows = rows.set_index("k") if how.get("index", True) else rows
        rows.to_parquet(os.path.join(directory, f"part.{i}.parquet"), index=how.get("index"))


def write_noted_in_one_file(directory, noted: str) -> None:
    """Two files of ``c`` and ``v``: ``c`` a pandas categorical of integers (plain integers
    and pandas' note) in the ``noted`` one ("first" or "second"), plain integers in the other."""
    categories = pd.DataFrame({"c": pd.Categorical([1, 2, 1]), "v": np.arange(3.0)})
    plain = pd.DataFrame({"c": [3, 4, 3], "v": np.arange(3.0)})
    files = [categories, plain] if noted == "first" else [plain, categories]
    for i, rows in enumerate(files):
        rows.to_parquet(os.path.join(directory, f"part.{i}.parquet"))


#: Hive folders of the keys ``a`` and ``b`` in either order, one under a folder of no key, and
#: the ``x`` each holds.
KEYS_IN_OTHER_ORDERS = (("a=1/b=x", 1), ("b=y/a=2", 2), ("a=3/sub/b=z", 3))


def write_one_row_folders(root, folders) -> None:
    """``root/<folder>/part.parquet`` for each ``(folder, x)`` of ``folders``: one row, ``x``."""
    for folder, x in folders:
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        pq.write_table(pa.table({"x": [x]}), os.path.join(root, folder, "part.parquet"))


#: Runs its arguments as a command with SIGINT's default disposition (exec keeps it; not a
#: ``preexec_fn``, unsafe in a process with threads).
_SIGINT_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def interrupt_at(cmd: list[str], marker: str) -> tuple[int, str]:
    """Run the command ``cmd``, send it SIGINT (Ctrl-C) once its stderr shows ``marker``, and
    wait for it to end: its exit code and the stderr it wrote. The command gets SIGINT's default
    disposition: a test process started in the background (``cmd &`` in a script, as CI may
    start it) ignores SIGINT, its children would too, and Python raises no KeyboardInterrupt."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_DEFAULT, *cmd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                proc.send_signal(signal.SIGINT)
                break
        else:
            raise AssertionError(f"ended before {marker!r}:\n" + "".join(seen[-40:]))
        seen.append(proc.communicate(timeout=HANG_GUARD)[1])
    finally:
        proc.kill()
    return proc.returncode, "".join(seen)
