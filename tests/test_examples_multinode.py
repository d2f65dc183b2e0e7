"""examples/multinode and docs/deployment.md, as far as a CPU machine without SLURM can check.

- both shell scripts parse (``bash -n``);
- ``client.py`` runs end to end against a ``dask scheduler`` and two ``dask worker --preload
  dask_gpudirect.preload`` processes (host target, tcp);
- every command-line flag, config key and ``DASK_*`` variable docs/deployment.md names exists.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import dask.config
import numpy as np
import pandas as pd
import pytest
import yaml
from util import HANG_GUARD, dask_command, wait_for_address

import dask_gpudirect  # noqa: F401  (loads the gpudirect.* defaults)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "multinode"
DOC = ROOT / "docs" / "deployment.md"


@pytest.mark.parametrize("script", ["launch.sh", "slurm.sbatch"])
def test_shell_scripts_parse(script):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    subprocess.run([bash, "-n", os.fspath(EXAMPLES / script)], check=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no reaper has collected yet counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _eventually(condition) -> bool:
    """Whether ``condition()`` holds within HANG_GUARD seconds (what a process does at once
    after its start or a signal, on a loaded machine)."""
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_launch_starts_and_stops_its_processes(tmp_path):
    """launch.sh with ``ssh`` and ``dask`` stand-ins (no other host and no GPU here: ``ssh``
    runs the command on this machine, ``dask`` prints what the scheduler prints and waits):
    ``start`` on a fresh LOGDIR returns the address, each pid file holds its service's pid
    (not a shell's), every service has UCXX progressed in a thread, and ``stop`` ends them."""
    if shutil.which("bash") is None or not os.path.isdir("/proc"):
        pytest.skip("needs bash and /proc")
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"  # logs: made by launch.sh
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/usr/bin/env bash\nshift\nexec bash -c "$*"\n')
    (bin_dir / "dask").write_text(
        "#!/usr/bin/env bash\n"
        '[[ $1 == scheduler ]] && echo "Scheduler at:   ucxx://127.0.0.1:18786"\n'
        'echo "progress=$UCXPY_PROGRESS_MODE future=$UCXPY_ENABLE_PYTHON_FUTURE"\n'
        'exec -a "stand-in-dask-$1" sleep 600\n'
    )
    for tool in ("ssh", "dask"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOSTS": "localhost",
           "PORT": "18786", "LOGDIR": os.fspath(logs)}  # fmt: skip
    launch = ["bash", os.fspath(EXAMPLES / "launch.sh")]
    pids: dict[str, int] = {}
    try:
        started = subprocess.run([*launch, "start"], env=env, capture_output=True, text=True,
                                 timeout=HANG_GUARD)  # fmt: skip
        pids = {f.stem: int(f.read_text()) for f in logs.glob("*.pid")}
        assert started.returncode == 0, started.stderr
        assert started.stdout.split() == ["ucxx://127.0.0.1:18786"]
        assert set(pids) == {"scheduler", "worker"}
        for name, kind in (("scheduler", b"scheduler"), ("worker", b"cuda")):
            command = Path(f"/proc/{pids[name]}/cmdline")  # once the stand-in has started
            started = b"stand-in-dask-" + kind
            assert _eventually(lambda c=command, s=started: c.read_bytes().startswith(s))
            assert "progress=thread future=1" in (logs / f"{name}.log").read_text()
        stopped = subprocess.run([*launch, "stop"], env=env, timeout=HANG_GUARD)
        assert stopped.returncode == 0
        assert _eventually(lambda: not any(map(_alive, pids.values())))
        assert not list(logs.glob("*.pid"))
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- client.py against real scheduler and worker processes ------------------------------


def test_client_runs_against_preloaded_workers(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        pd.DataFrame(
            {"id": rng.integers(0, 50, 2000), "x": rng.normal(size=2000), "y": np.arange(2000)}
        ).to_parquet(data / f"part{i}.parquet", row_group_size=500)

    log = open(tmp_path / "processes.log", "w")
    common = ["--host", "127.0.0.1", "--no-dashboard"]
    env = {**os.environ, "DASK_GPUDIRECT__TARGET": "host"}
    procs = []

    def spawn(args):
        procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))

    try:
        scheduler_file = tmp_path / "scheduler.json"
        spawn(
            [*dask_command("scheduler"), *common, "--port", "0", "--scheduler-file", scheduler_file]
        )
        address = wait_for_address(scheduler_file, procs)
        for _ in range(2):
            spawn(
                [
                    *dask_command("worker"),
                    address,
                    *common,
                    "--nthreads",
                    "1",
                    "--preload",
                    "dask_gpudirect.preload",
                    "--gpudirect-threads",
                    "4",
                ]
            )
        got = subprocess.run(
            [
                sys.executable,
                os.fspath(EXAMPLES / "client.py"),
                address,
                "--data",
                os.fspath(data / "*.parquet"),
                "--columns",
                "id,x",
                "--filter",
                "x",
                ">",
                "0",
                "--on",
                "id",
                "--npartitions",
                "4",
                "--workers",
                "2",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=HANG_GUARD,
        )
        assert got.returncode == 0, got.stdout + got.stderr
        out = got.stdout
        assert "2 worker(s)" in out
        assert "columns ['id', 'x']" in out
        expected = pd.concat(pd.read_parquet(p) for p in sorted(data.glob("*.parquet")))
        kept = expected[expected.x > 0]
        assert f"{len(kept)} rows, {kept.id.nunique()} keys" in out
        assert "posix-host" in out and "tcp-host" in out  # the read and the shuffle paths
        assert "registering GPUDirectPlugin" not in got.stderr  # the preload had put it there

        from distributed import Client

        with Client(address, set_as_default=False) as client:
            threads = client.run(lambda dask_worker: dask_worker.plugins["gpudirect"].options)
            assert {o["threads"] for o in threads.values()} == {4}
            client.shutdown()
    finally:
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        log.close()


@pytest.mark.parametrize(
    ("flags", "env"),
    [([], {"DASK_GPUDIRECT__READER__THREADS": "0"}), (["--gpudirect-threads", "0"], {})],
    ids=["worker-config", "flag"],
)
def test_a_bad_reader_value_stops_a_preloaded_worker(tmp_path, flags, env):
    """As the docs say, with the error in the worker's log: such a worker joined without
    the plugin (Distributed only logs a preload's error), and every read on the cluster then
    failed with a ConfigError that named no worker."""
    from distributed import LocalCluster

    log_path = tmp_path / "worker.log"
    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=":0") as cluster:
        args = [*dask_command("worker"), cluster.scheduler_address, "--no-nanny"]
        args += ["--no-dashboard", "--preload", "dask_gpudirect.preload", *flags]
        with open(log_path, "w") as log:
            worker = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
            )
            try:
                assert worker.wait(timeout=HANG_GUARD) != 0
            finally:
                if worker.poll() is None:
                    worker.kill()
        assert not cluster.scheduler.workers
    # "gpudirect.reader.threads=0" from the config, "GPUDirectPlugin(threads=0)" from the flag
    assert re.search(r"ConfigError: \S*threads=0\)?: use a whole number", log_path.read_text())


# --- every name docs/deployment.md uses exists ------------------------------------------


def command_lines(text: str, markdown: bool = True) -> list[str]:
    """Code lines, backslash continuations joined: a script's lines, or a Markdown file's
    indented blocks and `inline code`."""
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith("    ") or not markdown]
    lines += re.findall(r"`([^`]+)`", text) if markdown else []
    joined, buf = [], ""
    for ln in lines:
        if ln.endswith("\\"):
            buf += ln[:-1] + " "
        else:
            joined.append(buf + ln)
            buf = ""
    return joined


def options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def known_flags() -> dict[str, set[str]]:
    from distributed.cli.dask_scheduler import main as scheduler
    from distributed.cli.dask_worker import main as worker

    from dask_gpudirect.cli import main as cli
    from dask_gpudirect.preload import dask_setup

    flags = {
        "dask-gpudirect probe": options(cli.commands["probe"]),
        "dask scheduler": options(scheduler),
        "dask worker": options(worker) | options(dask_setup),
    }
    try:
        from dask_cuda.cli import worker as cuda_worker
    except ImportError:  # the CPU install: no dask-cuda, its flags are checked where it is
        pass
    else:
        flags["dask cuda worker"] = options(cuda_worker) | options(dask_setup)
    return flags


@pytest.mark.parametrize(
    "path", [DOC, EXAMPLES / "launch.sh", EXAMPLES / "slurm.sbatch"], ids=lambda p: p.name
)
def test_every_flag_exists(path):
    flags = known_flags()
    checked = 0
    for line in command_lines(path.read_text(), markdown=path.suffix == ".md"):
        # the longest command the line names ("dask cuda worker" before "dask worker")
        for name in sorted(flags, key=len, reverse=True):
            if name in line:
                tail = line.split(name, 1)[1]
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", tail):
                    assert flag in flags[name], f"{name} has no {flag}: {line}"
                    checked += 1
                break
    assert checked >= 3
    if "dask cuda worker" in flags:  # launch.sh keeps dask-cuda's UCX flags in an array
        for flag in re.findall(r"--enable-[a-z-]+", path.read_text()):
            assert flag in flags["dask cuda worker"], f"dask cuda worker has no {flag}"


def test_preload_flags_named_in_the_doc_exist():
    from dask_gpudirect.preload import dask_setup

    named = set(re.findall(r"--gpudirect-[a-z-]+", DOC.read_text()))
    assert named and named <= options(dask_setup)


def env_to_key(var: str, prefix: str, namespace: str) -> str:
    return namespace + "." + var[len(prefix) :].lower().replace("__", ".").replace("_", "-")


def test_config_keys_and_variables_in_the_doc_exist():
    text = DOC.read_text() + (EXAMPLES / "launch.sh").read_text()
    text += (EXAMPLES / "slurm.sbatch").read_text()
    gpudirect = set(re.findall(r"\bgpudirect\.[a-z][a-z.-]*[a-z]", text)) - {"gpudirect.yaml"}
    gpudirect |= {
        env_to_key(v, "DASK_GPUDIRECT__", "gpudirect")
        for v in re.findall(r"DASK_GPUDIRECT__[A-Z_]+", text)
    }
    defaults = yaml.safe_load((ROOT / "dask_gpudirect" / "gpudirect.yaml").read_text())
    assert gpudirect
    for key in gpudirect:
        node = defaults
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{key} is not in gpudirect.yaml"
            node = node[part]

    ucxx_vars = set(re.findall(r"DASK_DISTRIBUTED_UCXX__[A-Z_]+", text))
    short = set(re.findall(r"`(__[A-Z_]+)(?:=[^`]*)?`", text))  # the table's `__TCP`
    ucxx_vars |= {f"DASK_DISTRIBUTED_UCXX{s}" for s in short}
    pytest.importorskip("distributed_ucxx")
    import distributed_ucxx

    ucxx_defaults = yaml.safe_load(
        (Path(distributed_ucxx.__file__).parent / "distributed-ucxx.yaml").read_text()
    )["distributed-ucxx"]
    assert ucxx_vars
    for var in ucxx_vars:
        key = env_to_key(var, "DASK_DISTRIBUTED_UCXX__", "")[1:]
        top = key.split(".")[0]
        assert top in ucxx_defaults, f"{var}: distributed-ucxx has no {top!r}"

    for var in re.findall(r"DASK_DISTRIBUTED__COMM__[A-Z_]+", text):
        key = env_to_key(var, "DASK_DISTRIBUTED__", "distributed")
        if key.startswith("distributed.comm.ucx."):  # the legacy keys distributed-ucxx reads
            assert key.split(".")[-1] in ucxx_defaults
        else:
            dask.config.get(key)  # raises where Distributed has no such key


def test_the_preload_starts_under_dask_cuda_worker():
    """``dask cuda worker ADDR --preload dask_gpudirect.preload`` runs our preload with the
    argv it builds (dask_cuda/cuda_worker.py): ours plus ``--create-cuda-context``."""
    import asyncio

    from distributed.preloading import process_preloads

    class Worker:  # what the preload touches of a Worker (dask cuda worker needs a GPU)
        _pending_plugins: tuple = ()

    worker = Worker()
    preloads = process_preloads(worker, ["dask_gpudirect.preload"], ["--create-cuda-context"])
    asyncio.run(preloads.start())
    assert [p.name for p in worker._pending_plugins] == ["gpudirect"]
