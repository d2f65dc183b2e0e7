"""``gpudirect.allowed-roots``: workers read only inside the configured directories.

One cluster whose workers get ``allowed-roots = [<tmp>/data]`` through the nanny's config, and
real ``dask worker`` processes that get it from ``DASK_GPUDIRECT__ALLOWED_ROOTS``. Paths outside
(directly, through ``..``, through a symlink that leads out, through a glob) all get one answer
that names only the path given, whether anything exists there or not; a symlink flipped between
inside and outside while workers read through it never yields a byte from outside.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, wait
from util import compute, dask_command, shards_of, spawn, start_cluster, workers_info

import dask_gpudirect as dg
from dask_gpudirect import access, discovery
from dask_gpudirect.errors import ConfigError
from dask_gpudirect.loading import load_chunk


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("roots")
    data, outside = base / "data", base / "outside"
    data.mkdir()
    outside.mkdir()
    np.save(data / "in.npy", np.arange(100, dtype=np.int64))
    np.save(outside / "out.npy", np.arange(50, dtype=np.int64))
    (data / "link").mkdir()
    os.symlink(outside / "out.npy", data / "link" / "out.npy")
    os.symlink(outside / "nothing.npy", data / "dangling.npy")
    os.symlink(outside, data / "outdir")
    return data, outside


@pytest.fixture(scope="module")
def client(roots):
    data, _ = roots
    config = {"gpudirect.allowed-roots": [str(data)]}
    with start_cluster("tcp", config=config) as cluster, Client(cluster) as c:
        yield c


def refused(given) -> str:
    """The one message for a path outside the roots: the path as given (absolute, its ``..``
    kept), nothing else."""
    return f"{os.fspath(given)}: {access.REFUSED}"


def test_inside_the_roots_loads(client, roots):
    data, _ = roots
    arr = dg.read_binary(data / "in.npy", client=client)
    np.testing.assert_array_equal(client.compute(arr).result(), np.arange(100))


@pytest.mark.parametrize(
    "given",
    [
        "outside/out.npy",  # exists outside
        "outside/nothing.npy",  # does not exist outside
        "data/../outside/out.npy",  # .. out of the root
        "data/link/out.npy",  # a symlink inside that leads to a file outside
        "data/dangling.npy",  # a symlink inside that leads nowhere outside
        "data/outdir",  # a symlink to a directory outside
        "outside/*.npy",  # a glob outside
        "data/outdir/*.npy",  # a glob through a link outside
        "data/link/*.npy",  # a glob inside whose one match leads outside
    ],
)
def test_outside_the_roots_gets_one_answer(client, roots, given):
    """Whatever lies outside, the error is the same and names only what the user gave."""
    data, outside = roots
    path = os.path.join(data.parent, given)
    with pytest.raises(dg.InputError) as info:
        dg.read_binary(path, client=client)
    named = os.path.join(data, "link", "out.npy") if given == "data/link/*.npy" else path
    assert str(info.value) == refused(named)
    with pytest.raises(dg.InputError, match="outside gpudirect.allowed-roots") as info:
        dg.read_parquet(path, client=client)
    assert str(outside) not in str(info.value) or str(outside) in os.path.abspath(path)


@pytest.mark.parametrize("name", ["out.npy", "nothing.npy", "**/*.npy"])
def test_a_glob_lists_no_folder_outside_the_roots(client, roots, name):
    """A pattern's folders are listed only inside the roots: through ``outdir`` (a folder link
    inside that leads out), ``glob.glob`` listed the folder outside and the refusal named what
    it found there, so ``out*/out.npy`` against ``out*/nothing.npy`` said what exists outside."""
    data, _ = roots
    pattern = data / "out*" / name
    with pytest.raises(dg.InputError) as info:
        dg.read_binary(pattern, client=client)
    assert str(info.value) == f"{pattern}: no files match this pattern on any worker"


def test_a_glob_inside_the_roots_matches_as_glob_glob(tmp_path):
    """Where roots are set, patterns are expanded by a glob that checks each folder it lists:
    inside the roots it finds what ``glob.glob(recursive=True)`` finds."""
    for folder in ["x/y/z", "x/.h/q", "x/year=1/m=2", "w"]:
        (tmp_path / folder).mkdir(parents=True)
    for name in ["x/a.bin", "x/.b.bin", "x/y/c.bin", "x/y/z/d.bin", "x/.h/q/e.bin", "top.bin"]:
        (tmp_path / name).touch()
    for name in ["x/year=1/m=2/p.parquet", "w/[1].bin", "w/1.bin"]:
        (tmp_path / name).touch()
    os.symlink(tmp_path / "x" / "y", tmp_path / "w" / "ylink")  # a folder link inside
    os.symlink(tmp_path / "nowhere", tmp_path / "w" / "dangling.bin")
    os.symlink(tmp_path / "w" / "loop.bin", tmp_path / "w" / "loop.bin")  # is_dir(): ELOOP
    patterns = ["*", "**", "**/*.bin", "x/**", "x/*/*.bin", "x/.*/**", "x/**/.*", "w/[0-9].bin"]
    patterns += ["w/*/*", "*/y/*.bin", "x/*/../*.bin", "**/m=*/*.parquet", "x/?/*", "nothing/*"]
    with dask.config.set({"gpudirect.allowed-roots": [os.fspath(tmp_path)]}):
        for pattern in patterns:
            path = os.path.join(tmp_path, pattern)
            assert sorted(discovery._glob(path)) == sorted(glob.glob(path, recursive=True))


def test_a_link_loop_a_glob_matches_is_named_as_without_roots(tmp_path):
    """A link that cannot be followed (a loop; a folder it may not search) matched by a
    pattern is a file the read names ("cannot read"), with roots set or not: with roots set
    the glob dropped it, so the read went on without it."""
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", np.arange(3))
    os.symlink(data / "loop.npy", data / "loop.npy")
    pattern = os.fspath(data / "*.npy")
    expected = sorted([os.fspath(data / "a.npy"), os.fspath(data / "loop.npy")])
    for roots in (None, [os.fspath(data)]):
        with dask.config.set({"gpudirect.allowed-roots": roots}):
            assert sorted(f[0] for f in discovery.view(pattern).files) == expected, roots


def test_a_read_outside_the_roots_is_refused_by_the_worker(client, roots):
    """The worker checks what it opened: a shard planned elsewhere is not trusted."""
    data, outside = roots
    planned = dg.read_binary(data / "in.npy", client=client)
    (shard,) = shards_of(planned).values()
    elsewhere = dataclasses.replace(shard, path=str(data / "link" / "out.npy"), stamp=None)
    with pytest.raises(dg.InputError) as info:
        client.submit(load_chunk, (elsewhere,), workers=[shard.worker]).result()
    assert str(info.value) == refused(data / "link" / "out.npy")  # the target is not named
    # the cluster keeps working
    np.testing.assert_array_equal(client.compute(planned).result(), np.arange(100))


def test_a_dotdot_after_a_folder_link_leads_where_the_kernel_takes_it(client, roots):
    """``data/outdir/..`` is the parent of the link's target, not ``data``: was admitted by
    its folded name, so the workers opened a FIFO there (a writer blocked on it went on) and
    listed a folder there (its files' names came back refused)."""
    data, outside = roots
    pipe = outside / "pipe"
    os.mkfifo(pipe)
    opened = threading.Event()

    def write():
        os.close(os.open(pipe, os.O_WRONLY))  # blocks until a reader opens the FIFO
        opened.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        given = data / "outdir" / ".." / "outside" / "pipe"  # by name: data/outside/pipe
        with pytest.raises(dg.InputError) as info:
            dg.read_binary(given, client=client)
        assert str(info.value) == refused(given)
        assert not opened.wait(1), "a worker opened a FIFO outside the roots"
    finally:
        if not opened.is_set():
            os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer go
        writer.join()
        os.remove(pipe)
    folder = data / "outdir" / ".." / "outside"
    for read in (dg.read_binary, dg.read_parquet):
        with pytest.raises(dg.InputError) as info:
            read(folder, client=client)
        assert str(info.value) == refused(folder)


def test_a_symlink_flipped_during_reads_never_leads_outside(client, roots):
    """A link inside the root flipped between a file inside and one outside, as fast as the
    OS allows, while the workers plan and read through it: every read gives the inside file's
    records or the refusal, never the outside file's. Bounded: 400 reads or 30 s."""
    data, outside = roots
    inside_file, outside_file = data / "race-in.npy", outside / "race-out.npy"
    np.save(inside_file, np.ones(1000, dtype=np.int64))
    np.save(outside_file, np.full(1000, 7, dtype=np.int64))  # same size, same header
    link = data / "race.npy"
    os.symlink(inside_file, link)
    (shard,) = shards_of(dg.read_binary(link, client=client)).values()
    unstamped = dataclasses.replace(shard, stamp=None)  # the roots alone must hold
    stop = threading.Event()

    def flip():
        spare = data / "race.tmp"
        while not stop.is_set():
            for target in (outside_file, inside_file):
                os.symlink(target, spare)
                os.replace(spare, link)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    outcomes = {"inside": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 30
        while sum(outcomes.values()) < 400 and time.monotonic() < deadline:
            futures = [
                client.submit(load_chunk, (unstamped,), pure=False, workers=[shard.worker])
                for _ in range(40)
            ]
            wait(futures)
            for future in futures:
                if future.status == "error":
                    # on a starved machine the scheduler may drop the placed worker: the load
                    # then runs elsewhere and the refusal says so after the same words
                    assert str(future.exception()).startswith(refused(link))
                    outcomes["refused"] += 1
                else:
                    assert (future.result() == 1).all(), "read data from outside the roots"
                    outcomes["inside"] += 1
            try:  # planning through the link: never the outside file's footer or header
                arr = dg.read_binary(link, client=client)
                assert arr.shape == (1000,)
            except dg.InputError as exc:
                assert str(exc) in (refused(link), f"{link}: no such file")
    finally:
        stop.set()
        flipper.join()
    assert sum(outcomes.values()) >= 40, outcomes


# --- the config's forms -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        (["/data", "/scratch/x"], ("/data", "/scratch/x")),
        (("/data",), ("/data",)),
        ("/data", ("/data",)),  # the environment's form: one path
        (f"/data{os.pathsep}/scratch", ("/data", "/scratch")),  # or several
        ([], ()),  # nothing at all is allowed
    ],
)
def test_allowed_roots_forms(value, expected):
    with dask.config.set({"gpudirect.allowed-roots": value}):
        assert access.roots() == expected


@pytest.mark.parametrize(
    "value", [5, {"/data": 1}, [1, 2], ["data"], "relative/dir", "", f"/data{os.pathsep}"]
)
def test_bad_allowed_roots_are_an_error_not_an_open_door(value):
    with dask.config.set({"gpudirect.allowed-roots": value}):
        with pytest.raises(ConfigError, match="gpudirect.allowed-roots"):
            access.roots()


def test_bad_allowed_roots_fail_the_plugin_on_a_running_cluster(roots):
    data, _ = roots
    with start_cluster("tcp", n_workers=1, config={"gpudirect.allowed-roots": 5}) as cluster:
        with Client(cluster) as client:
            with pytest.raises(ConfigError, match="gpudirect.allowed-roots must be a list"):
                dg.read_binary(data / "in.npy", client=client)


def test_allowed_roots_in_a_local_clusters_env(roots):
    """``LocalCluster(env={"DASK_GPUDIRECT__ALLOWED_ROOTS": ...})``: each nanny hands its
    worker the client's whole configuration, whose null roots overrode the environment's, so
    every path was read."""
    data, outside = roots
    env = {"DASK_GPUDIRECT__ALLOWED_ROOTS": str(data)}
    with start_cluster("tcp", n_workers=1, env=env) as cluster, Client(cluster) as client:
        arr = dg.read_binary(data / "in.npy", client=client)
        np.testing.assert_array_equal(compute(client, arr), np.arange(100))
        with pytest.raises(dg.InputError) as info:
            dg.read_binary(outside / "out.npy", client=client)
        assert str(info.value) == refused(outside / "out.npy")


def test_allowed_roots_from_the_environment_of_dask_worker(tmp_path, roots):
    """``DASK_GPUDIRECT__ALLOWED_ROOTS`` of real ``dask worker --preload`` processes: several
    roots joined by ``os.pathsep`` on one worker, one root on the other, a bad value that stops
    a third from starting."""
    data, outside = roots
    other = tmp_path / "other"
    other.mkdir()
    np.save(other / "o.npy", np.arange(30, dtype=np.int64))
    log = open(tmp_path / "workers.log", "w")
    procs = []
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=":0") as cluster:
        worker = [*dask_command("worker"), cluster.scheduler_address, "--nthreads", "1"]
        worker += ["--no-dashboard", "--preload", "dask_gpudirect.preload"]
        env = "DASK_GPUDIRECT__ALLOWED_ROOTS"
        try:
            both = f"{data}{os.pathsep}{other}"
            procs.append(spawn([*worker, "--name", "both"], log, env={env: both}))
            procs.append(spawn([*worker, "--name", "one"], log, env={env: str(data)}))
            bad = spawn([*worker, "--name", "bad", "--no-nanny"], log, env={env: "[1, 2]"})
            procs.append(bad)
            with Client(cluster, set_as_default=False) as client:
                client.wait_for_workers(2, timeout=300)
                names = {a: w["name"] for a, w in workers_info(client).items()}
                arr = dg.read_binary(data / "in.npy", blocksize=80, client=client)  # 10 shards
                assert {names[s.worker] for s in shards_of(arr).values()} == {"both", "one"}
                np.testing.assert_array_equal(compute(client, arr), np.arange(100))
                arr = dg.read_binary(other / "o.npy", blocksize=80, client=client)
                assert {names[s.worker] for s in shards_of(arr).values()} == {"both"}
                np.testing.assert_array_equal(compute(client, arr), np.arange(30))
                with pytest.raises(dg.InputError) as info:
                    dg.read_binary(outside / "out.npy", client=client)
                assert str(info.value) == refused(outside / "out.npy")
                assert bad.wait(timeout=300) != 0  # the bad value stopped it
                assert len(client.nthreads()) == 2
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            log.close()
    text = (tmp_path / "workers.log").read_text()
    assert "ConfigError: gpudirect.allowed-roots: 1 in [1, 2] is not an absolute" in text


def test_absolute_paths_are_checked_where_the_working_directory_is_gone(tmp_path, monkeypatch):
    """A worker whose working directory was removed (started in a scratch folder since
    cleaned up) checks the absolute paths it is given as before: the check of a ``..`` after
    a link asked ``os.getcwd()`` for every path, absolute ones too, so each listing and read
    inside the roots raised FileNotFoundError (the survey lost the worker: "the cluster has
    no workers")."""
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "in.npy", np.arange(3))
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    path = os.fspath(data / "in.npy")
    with dask.config.set({"gpudirect.allowed-roots": [os.fspath(data)]}):
        assert access.admits(path)
        assert not access.admits(tmp_path / "elsewhere.npy")
        assert [f[0] for f in discovery.view(path).files] == [path]
        assert [f[0] for f in discovery.view(os.fspath(data / "*.npy")).files] == [path]
        with access.opened(path) as opened:
            assert opened is not None
