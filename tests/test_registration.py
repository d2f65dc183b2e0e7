"""The ways the plugin reaches workers, and how its options get there.

1. ``client.register_plugin(GPUDirectPlugin(...))`` on a running cluster;
2. ``read_*`` on a cluster without it registers it with defaults and logs that it did;
3. ``dask worker --preload dask_gpudirect.preload [--gpudirect-threads=N]`` (real CLI processes).
Options come from Dask config (``DASK_GPUDIRECT__...`` env vars) with keywords on top.
``dg.LocalCUDACluster(plugins=...)`` needs a GPU: tests/gpu covers it.
"""

from __future__ import annotations

import asyncio
import decimal
import logging
import os
import re
import subprocess

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client, LocalCluster
from util import (
    HANG_GUARD,
    assert_same_frame,
    compute,
    dask_command,
    expected_parquet,
    has_plugin,
    plugin_options,
    spawn,
    start_cluster,
    wait_for_address,
    wait_for_file,
    workers_info,
)

import dask_gpudirect as dg
from dask_gpudirect.cuda import gpu_count

LOGGER = "dask_gpudirect.cluster"


@pytest.fixture(scope="module")
def fresh_client():
    """A tcp cluster of its own: these tests add and remove the plugin."""
    cluster = start_cluster("tcp", threads=1)
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(2)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def bare(fresh_client):
    """``fresh_client`` with no GPUDirectPlugin on any worker at the start of the test."""
    held = fresh_client.run_on_scheduler(lambda dask_scheduler: set(dask_scheduler.worker_plugins))
    for name in held & {"gpudirect", "gpudirect-defaults"}:
        fresh_client.unregister_worker_plugin(name)
    fresh_client.run(drop_readers)  # set up by gpudirect-defaults, or given at start
    assert not any(fresh_client.run(has_plugin).values())
    with fresh_client.as_current():
        yield fresh_client


async def drop_readers(dask_worker) -> None:
    if "gpudirect" in dask_worker.plugins:
        await dask_worker.plugin_remove("gpudirect")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("reg") / "d.parquet"
    pq.write_table(pa.table({"i": np.arange(1000), "s": [str(i) for i in range(1000)]}), path)
    return os.fspath(path)


def options_by_worker(client) -> list[dict]:
    return list(client.run(plugin_options).values())


def test_register_plugin_with_options(bare, data):
    bare.register_plugin(dg.GPUDirectPlugin(threads=3, task_size="1MiB"))
    for options in options_by_worker(bare):
        assert options["threads"] == 3
        assert options["task_size"] == 1 << 20  # made bytes where the plugin is set up
        assert options["compat_mode"] == dask.config.get("gpudirect.reader.compat-mode")
    assert_same_frame(compute(bare, dg.read_parquet(data, client=bare)), expected_parquet(data))
    assert all(o["threads"] == 3 for o in options_by_worker(bare))  # read_* kept it


def test_register_plugin_replaces_auto_registered_defaults(bare, data):
    """A user's explicit registration wins over the defaults ``read_*`` registered first."""
    compute(bare, dg.read_parquet(data, client=bare))
    assert all(o["threads"] == 16 for o in options_by_worker(bare))
    bare.register_plugin(dg.GPUDirectPlugin(threads=3))
    assert all(o["threads"] == 3 for o in options_by_worker(bare))


def test_read_registers_missing_plugin_and_logs(bare, data, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    df = dg.read_parquet(data, client=bare)
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("registering GPUDirectPlugin with defaults on 2 worker(s)" in m for m in messages)
    assert all(bare.run(has_plugin).values())
    assert all(o["threads"] == 16 for o in options_by_worker(bare))
    assert_same_frame(compute(bare, df), expected_parquet(data))

    caplog.clear()  # the plugin is there now: no second registration, no message
    x = dg.read_binary(data, dtype="u1", client=bare)
    assert not [r for r in caplog.records if r.name == LOGGER]
    assert compute(bare, x).nbytes == os.path.getsize(data)


def test_read_binary_registers_missing_plugin(bare, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    np.save(tmp_path / "a.npy", np.arange(10))
    x = dg.read_binary(tmp_path / "a.npy", client=bare)
    assert any("registering GPUDirectPlugin" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(compute(bare, x), np.arange(10))


def test_unknown_plugin_option():
    with pytest.raises(TypeError, match="unknown GPUDirectPlugin option.*thread"):
        dg.GPUDirectPlugin(thread=3)


@pytest.mark.parametrize(
    ("option", "value", "wanted"),
    [
        ("threads", "abc", "at least 1"),
        ("threads", 0, "at least 1"),
        ("threads", np.float32(1.5), "at least 1"),
        ("threads", np.True_, "at least 1"),
        ("max_records", decimal.Decimal("2.5"), "at least 0"),
        ("task_size", "10 XB", "a positive size"),
        ("task_size", 0, "a positive size"),
        ("max_records", -1, "at least 0"),
        ("target", "gpu", "'device', 'host' or None"),
        ("target", np.array(["host", "device"]), "'device', 'host' or None"),
        ("target", pd.NA, "'device', 'host' or None"),
        ("compat_mode", "maybe", "'AUTO', 'ON' or 'OFF'"),
    ],
)
def test_a_bad_plugin_option_fails_where_it_is_given(option, value, wanted):
    """Not in a read task on a worker, with an error of Python's or kvikio's."""
    pattern = rf"GPUDirectPlugin\({option}=.*: use .*{re.escape(wanted)}"
    with pytest.raises(dg.ConfigError, match=pattern):
        dg.GPUDirectPlugin(**{option: value})


def test_a_bad_config_value_fails_the_plugins_setup(tmp_path):
    """``gpudirect.reader.threads=0`` in a worker's config: registering the plugin fails with
    the key and the value (a worker given the plugin at start fails to start so), and the
    plugin's teardown does not fail again."""
    zero = {"gpudirect.reader.threads": 0}
    with dask.config.set(zero):
        with pytest.raises(dg.ConfigError, match=r"gpudirect.reader.threads=0: use"):
            dg.GPUDirectPlugin()
    with start_cluster("tcp", n_workers=1, threads=1) as cluster:
        with Client(cluster, set_as_default=False) as client:
            [failed] = client.run(_set_up, plugin=dg.GPUDirectPlugin(), config=zero).values()
            assert failed == "gpudirect.reader.threads=0: use a whole number of at least 1"
            client.run(dask.config.set, zero)  # the workers' own config from now on
            with pytest.raises(dg.ConfigError, match=r"gpudirect.reader.threads=0: use"):
                client.register_plugin(dg.GPUDirectPlugin())


def _set_up(dask_worker, plugin, config) -> str | None:
    """``plugin`` set up on this worker under ``config``, then torn down: the error."""
    try:
        with dask.config.set(config):
            plugin.setup(dask_worker)
    except dg.ConfigError as exc:
        plugin.teardown(dask_worker)  # setup failed: nothing to undo, and no second error
        return str(exc)
    return None


def test_the_workers_plugin_target_is_the_reads(bare, data):
    """``GPUDirectPlugin(target="host")``: reads that name no target load to host memory,
    whatever the client's own ``gpudirect.target`` says; a call's ``target=`` still wins, and
    on workers without a GPU ``target="device"`` is refused by name."""
    bare.register_plugin(dg.GPUDirectPlugin(target="host"))
    with dask.config.set({"gpudirect.target": "device"}):
        df = dg.read_parquet(data, client=bare)
        assert isinstance(df._meta, pd.DataFrame)
    bare.register_plugin(dg.GPUDirectPlugin(target="device"))
    with pytest.raises(dg.InputError, match="target='device' but these workers have no GPU"):
        dg.read_parquet(data, client=bare)
    assert isinstance(dg.read_parquet(data, target="host", client=bare)._meta, pd.DataFrame)


def test_env_var_reaches_workers(monkeypatch, data):
    """``DASK_GPUDIRECT__READER__THREADS`` set before the cluster starts sets the option."""
    monkeypatch.setenv("DASK_GPUDIRECT__READER__THREADS", "7")
    monkeypatch.setenv("DASK_GPUDIRECT__READER__TASK_SIZE", "2MiB")
    dask.config.refresh()
    try:
        assert dask.config.get("gpudirect.reader.threads") == 7
        with start_cluster("tcp", n_workers=1, threads=1) as cluster:
            with Client(cluster, set_as_default=False) as client:
                compute(client, dg.read_parquet(data, client=client))
                [options] = options_by_worker(client)
                assert options["threads"] == 7
                assert options["task_size"] == 2 << 20
    finally:
        monkeypatch.undo()
        dask.config.refresh()
    assert dask.config.get("gpudirect.reader.threads") == 16


# --- dask scheduler / dask worker --preload, as real processes ------------------------


def test_dask_worker_preload(tmp_path, data, caplog):
    """``dask worker ADDR --preload dask_gpudirect.preload --gpudirect-threads=5``: options
    from the flags, which the worker CLI hands to the preload because it does not know them,
    and from ``DASK_GPUDIRECT__...`` in the worker's environment.

    The address must be given as the argument: with ``--scheduler-file`` and no address,
    click takes ``--gpudirect-threads=5`` for the address and the option is silently lost.
    """
    caplog.set_level(logging.INFO, logger=LOGGER)
    scheduler_file = os.fspath(tmp_path / "scheduler.json")
    log = open(tmp_path / "processes.log", "w")
    common = ["--host", "127.0.0.1", "--no-dashboard"]
    procs = []
    try:
        scheduler = [*dask_command("scheduler"), *common, "--port", "0"]
        procs.append(spawn([*scheduler, "--scheduler-file", scheduler_file], log))
        address = wait_for_address(scheduler_file, procs)
        worker = [*dask_command("worker"), address, *common, "--nthreads", "1"]
        preload = ["--preload", "dask_gpudirect.preload"]
        procs.append(spawn([*worker, "--name", "flags", *preload, "--gpudirect-threads=5"], log))
        procs.append(
            spawn(
                [*worker, "--name", "env", *preload],
                log,
                env={"DASK_GPUDIRECT__READER__THREADS": "7"},
            )
        )
        with Client(scheduler_file=scheduler_file, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=300)
            info = workers_info(client)
            names = {addr: w["name"] for addr, w in info.items()}
            threads = {names[a]: o["threads"] for a, o in client.run(plugin_options).items()}
            assert threads == {"flags": 5, "env": 7}

            got = compute(client, dg.read_parquet(data, blocksize=1, client=client))
            assert_same_frame(got, expected_parquet(data))
            registered = [r for r in caplog.records if "registering" in r.getMessage()]
            assert not registered  # the preload had put the plugin on every worker
            threads = {names[a]: o["threads"] for a, o in client.run(plugin_options).items()}
            assert threads == {"flags": 5, "env": 7}
            report = dg.report(client)
            assert set(report["path"]) == {"posix-host"}
            client.shutdown()  # scheduler and workers exit on their own, quickly
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()


def test_a_worker_that_joins_later_gets_the_plugin_and_takes_part(tmp_path):
    """``register_plugin`` is kept by the scheduler: a worker that joins afterwards has the
    plugin with the same options and loads shards in the next read."""
    np.save(tmp_path / "x.npy", np.arange(4000, dtype=np.int64))
    with start_cluster("tcp", n_workers=1, threads=1) as cluster, Client(cluster) as client:
        client.register_plugin(dg.GPUDirectPlugin(threads=3))
        cluster.scale(2)
        client.wait_for_workers(2)
        assert [o["threads"] for o in options_by_worker(client)] == [3, 3]
        arr = dg.read_binary(tmp_path / "x.npy", blocksize=4000, client=client)  # 8 chunks
        np.testing.assert_array_equal(client.compute(arr).result(), np.arange(4000))
        readers = set(dg.ledger_report.records(client).query("op == 'read'").worker)
        assert readers == set(client.nthreads())


def test_a_plain_worker_that_joins_gets_default_readers_and_others_keep_theirs(tmp_path):
    """A cluster given the plugin at start (``plugins=``), then a worker started without it:
    the first read left defaults with the scheduler, which that worker sets up as it joins
    (it had none, and a read moved to it from a lost worker failed), while the first worker
    keeps its own options (each read re-registered defaults on every worker, options and the
    readers of running reads replaced)."""
    np.save(tmp_path / "x.npy", np.arange(4000, dtype=np.int64))
    plugins = {dg.GPUDirectPlugin(threads=3)}
    log = open(tmp_path / "worker.log", "w")
    with (
        start_cluster("tcp", n_workers=1, threads=1, plugins=plugins) as cluster,
        Client(cluster) as client,
    ):
        (first,) = client.nthreads()
        arr = dg.read_binary(tmp_path / "x.npy", client=client)
        np.testing.assert_array_equal(compute(client, arr), np.arange(4000))
        worker = [*dask_command("worker"), cluster.scheduler_address, "--nthreads", "1"]
        plain = spawn([*worker, "--no-dashboard"], log)
        try:
            client.wait_for_workers(2, timeout=300)
            (joined,) = set(client.nthreads()) - {first}
            options = client.run(plugin_options)
            assert (options[first]["threads"], options[joined]["threads"]) == (3, 16)
            arr = dg.read_binary(tmp_path / "x.npy", blocksize=4000, client=client)  # 8 chunks
            np.testing.assert_array_equal(compute(client, arr), np.arange(4000))
            assert client.run(plugin_options)[first]["threads"] == 3
        finally:
            plain.terminate()
            plain.wait(timeout=60)
            log.close()


def test_registering_the_plugin_again_mid_read_lets_the_read_finish(tmp_path):
    """``register_plugin(GPUDirectPlugin(threads=3))`` (the documented way to change the
    readers' options) while a read runs: the old readers close once that read has ended (they
    closed at once, and the read failed with "cannot schedule new futures after shutdown")."""
    np.save(tmp_path / "x.npy", np.arange(4000, dtype=np.int64))
    started, release = tmp_path / "started", tmp_path / "release"

    def hold_reads(dask_worker) -> None:
        """Test instrumentation: each read touches ``started`` and waits for ``release``."""
        from dask_gpudirect.targets.host import HostTarget

        read_run = HostTarget.read_run

        def held(self, shards):
            dask_worker.held_target = self
            started.touch()
            wait_for_file(release, "the release")
            return read_run(self, shards)

        HostTarget.read_run = held

    def old_readers_closed(dask_worker) -> bool:
        return dask_worker.held_target.pool._shutdown

    with (
        start_cluster("tcp", n_workers=1, threads=1, plugins={dg.GPUDirectPlugin()}) as cluster,
        Client(cluster) as client,
    ):
        arr = dg.read_binary(tmp_path / "x.npy", client=client)
        client.run(hold_reads)
        future = client.compute(arr)
        wait_for_file(started, "the read's start")
        client.register_plugin(dg.GPUDirectPlugin(threads=3))
        assert not any(client.run(old_readers_closed).values())  # the read still uses them
        release.touch()
        np.testing.assert_array_equal(future.result(timeout=HANG_GUARD), np.arange(4000))
        assert all(client.run(old_readers_closed).values())
        assert [o["threads"] for o in options_by_worker(client)] == [3]


def test_reads_that_start_while_the_plugin_is_registered_again_finish(tmp_path):
    """Distributed's ``plugin_add`` removes the old plugin, tears it down, then holds the new
    one before its ``setup``. A read task that looked its plugin up in either gap failed with
    ``ClusterError`` ("has no GPUDirectPlugin") or an ``AttributeError`` of a plugin not set
    up; the last plugin set up now serves it, as it serves the reads already running."""
    for k in range(2):
        np.save(tmp_path / f"x{k}.npy", np.arange(4000, dtype=np.int64) + k)
    gaps = {"teardown": tmp_path / "in-teardown", "setup": tmp_path / "in-setup"}

    def hold_lookups_in_the_gaps(dask_worker) -> None:
        """Test instrumentation: the worker's teardown of the old plugin and setup of the new
        each wait until a read task has looked its plugin up inside them; the first read
        task looks up in the teardown, the second in the setup."""
        import itertools

        from dask_gpudirect import loading
        from dask_gpudirect.plugin import GPUDirectPlugin

        gap_of_task = itertools.cycle(gaps.values()).__next__
        lookup, setup, teardown = (
            loading.current_plugin,
            GPUDirectPlugin.setup,
            GPUDirectPlugin.teardown,
        )

        def looked_up_in_a_gap():
            gap = gap_of_task()
            gap.with_suffix(".running").touch()
            wait_for_file(gap, "the re-registration")
            try:
                return lookup()
            finally:
                gap.with_suffix(".looked").touch()

        def in_gap(method, gap):
            def held(self, worker):
                gap.touch()
                wait_for_file(gap.with_suffix(".looked"), "a read's lookup")
                return method(self, worker)

            return held

        loading.current_plugin = looked_up_in_a_gap
        GPUDirectPlugin.teardown = in_gap(teardown, gaps["teardown"])
        GPUDirectPlugin.setup = in_gap(setup, gaps["setup"])

    with (
        start_cluster("tcp", n_workers=1, threads=2, plugins={dg.GPUDirectPlugin()}) as cluster,
        Client(cluster) as client,
    ):
        arrays = [dg.read_binary(tmp_path / f"x{k}.npy", client=client) for k in range(2)]
        client.run(hold_lookups_in_the_gaps)
        futures = [client.compute(a) for a in arrays]
        for gap in gaps.values():  # both read tasks in the worker's threads
            wait_for_file(gap.with_suffix(".running"), "a read task")
        client.register_plugin(dg.GPUDirectPlugin(threads=3))
        got = sorted((f.result(timeout=HANG_GUARD) for f in futures), key=lambda a: a[0])
        for k in range(2):
            np.testing.assert_array_equal(got[k], np.arange(4000) + k)
        assert [o["threads"] for o in options_by_worker(client)] == [3]


# --- what a user gets wrong first ---------------------------------------------------------


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
def test_local_cuda_cluster_without_a_gpu_says_what_to_use():
    """The README's first line on a CPU machine: not an NVML traceback, but what to use."""
    with pytest.raises(dg.ClusterError, match=r"has none.*distributed\.LocalCluster\(plugins="):
        dg.LocalCUDACluster(protocol="ucxx", plugins={dg.GPUDirectPlugin()})


def test_a_closed_or_wrong_client_is_a_clear_error(tcp_client, tmp_path):
    np.save(tmp_path / "x.npy", np.arange(10))
    closed = Client(tcp_client.scheduler.address, set_as_default=False)
    closed.close()
    calls = {
        "read_binary": lambda c: dg.read_binary(tmp_path / "x.npy", client=c),
        "read_parquet": lambda c: dg.read_parquet(tmp_path, client=c),
        "shuffle": lambda c: dg.shuffle(dd.from_pandas(pd.DataFrame({"k": [1]})), "k", client=c),
        "report": lambda c: dg.report(c),
    }
    for call in calls.values():
        with pytest.raises(dg.InputError, match="client= is closed, not running"):
            call(closed)
        with pytest.raises(dg.InputError, match="must be a distributed.Client, not str"):
            call(tcp_client.scheduler.address)
    # the cluster itself is fine
    assert compute(tcp_client, dg.read_binary(tmp_path / "x.npy", client=tcp_client)).sum() == 45


def test_an_asynchronous_client_is_told_to_call_from_a_thread(tcp_client, tmp_path):
    """On an asynchronous client's event loop every call that waits for the cluster says to
    run it in a thread (not a ``TypeError`` about a coroutine from deep inside); from a thread,
    as the message says, the same client shuffles and Dask's own shuffle runs through it."""
    np.save(tmp_path / "x.npy", np.arange(10))
    pdf = pd.DataFrame({"k": np.arange(60) % 7, "v": np.arange(60)})
    df = dd.from_pandas(pdf, npartitions=3)
    sums = df.groupby("k").v.sum(split_out=2, shuffle_method="gpudirect")

    async def use(address: str) -> tuple[int, int]:
        async with Client(address, asynchronous=True, set_as_default=False) as c:
            calls = {
                "read_binary": lambda: dg.read_binary(tmp_path / "x.npy", client=c),
                "read_parquet": lambda: dg.read_parquet(tmp_path, client=c),
                "shuffle": lambda: dg.shuffle(df, "k", client=c),
                "report": lambda: dg.report(c),
            }
            for call in calls.values():
                with pytest.raises(dg.InputError, match=r"asyncio\.to_thread"):
                    call()
            out = await asyncio.to_thread(dg.shuffle, df, "k", client=c)
            rows = len(await c.compute(out))
            with c.as_current():  # Dask's own shuffles go through the current client
                with pytest.raises(dg.InputError, match=r"asynchronous Client"):
                    c.compute(sums)
                persisted = await asyncio.to_thread(c.persist, sums)
            return rows, int((await c.compute(persisted)).sum())

    assert asyncio.run(use(tcp_client.scheduler.address)) == (60, pdf["v"].sum())


def _frozen(dask_worker) -> int:
    import gc

    return gc.get_freeze_count()


@pytest.mark.parametrize(
    ("freeze", "holding", "frozen"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_the_plugin_freezes_what_the_worker_imported(freeze, holding, frozen):
    """``gpudirect.worker.freeze-gc``: a full collection of a worker then skips the objects of
    its imported libraries (on an H200 worker 110-170 ms a collection, unfrozen); not where the
    worker holds data already, which would then never be collected if caught in a cycle."""
    config = {"gpudirect.worker.freeze-gc": freeze}
    with dask.config.set(config), start_cluster("tcp", n_workers=1, threads=1) as cluster:
        with Client(cluster) as client:
            data = client.scatter(list(range(3))) if holding else None
            client.register_plugin(dg.GPUDirectPlugin())
            counts = client.run(_frozen)
            del data
    assert all((count > 10_000) == frozen for count in counts.values()), counts


@pytest.mark.parametrize("value", ["no", "false", 1])
def test_a_freeze_gc_that_is_no_boolean_is_named(value):
    """``DASK_GPUDIRECT__WORKER__FREEZE_GC=no`` (Dask reads "no" as a string) or
    ``dask.config.set`` of "false": the string was taken as true and the worker's objects
    frozen; a ConfigError, where the plugin is set up, as ``gpudirect.shuffle.progress``
    refuses its strings."""
    config = {"gpudirect.worker.freeze-gc": value}
    with dask.config.set(config), start_cluster("tcp", n_workers=1, threads=1) as cluster:
        with Client(cluster, set_as_default=False) as client:
            with pytest.raises(dg.ConfigError, match=r"gpudirect.worker.freeze-gc=.*: use true or"):
                client.register_plugin(dg.GPUDirectPlugin())
            assert all(count == 0 for count in client.run(_frozen).values())


def test_workers_in_the_users_own_process_freeze_nothing():
    """``LocalCluster(processes=False)`` runs its workers in this process: its objects are the
    user's, and the plugin leaves their collection alone."""
    import gc

    before = gc.get_freeze_count()
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.register_plugin(dg.GPUDirectPlugin())
        assert client.run(has_plugin) and gc.get_freeze_count() == before


def test_workers_of_one_process_given_one_plugin_object_each_read_on_their_own(tmp_path):
    """``LocalCluster(processes=False, plugins={GPUDirectPlugin()})`` hands one plugin object
    to both workers: each sets up a copy of its own, so the first to close leaves the other's
    readers open (they shared them, and the address of the last one set up)."""
    np.save(tmp_path / "a.npy", np.arange(1000))
    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            threads_per_worker=1,
            dashboard_address=None,
            plugins={dg.GPUDirectPlugin(threads=2)},
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        first, second = sorted(client.nthreads())
        plugins = client.run(lambda dask_worker: dask_worker.plugins["gpudirect"])
        assert plugins[first] is not plugins[second]
        assert {w: p.address for w, p in plugins.items()} == {first: first, second: second}
        assert plugins[second].options["threads"] == 2
        arr = dg.read_binary(tmp_path / "a.npy", blocksize=800, client=client)
        np.testing.assert_array_equal(compute(client, arr), np.arange(1000))
        client.retire_workers([first], close_workers=True)
        client.wait_for_workers(1)
        arr = dg.read_binary(tmp_path / "a.npy", blocksize=800, client=client)
        np.testing.assert_array_equal(compute(client, arr), np.arange(1000))
