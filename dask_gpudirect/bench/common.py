"""What every ``bench`` command shares: progress, versions, the cluster, the outputs, options.

One place, so that ``bench read`` and ``bench shuffle`` start their clusters the same way and write
JSON, Markdown and the printed table in one form.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..cuda import gpu_count
from ..measure import byte_size
from ..progress import Bar
from .paths import writable
from .plot import draw, plottable

if TYPE_CHECKING:
    from distributed import Client, Worker

#: A click command, given options by a decorator.
F = TypeVar("F", bound=Callable[..., Any])
#: A result as Markdown: each benchmark's report renders its own.
Markdown = Callable[[dict], str]

GIB = 1 << 30

VERSIONED = [
    "dask-gpudirect",
    "dask",
    "distributed",
    "dask-cuda",
    "cudf-cu13",
    "pylibcudf-cu13",
    "dask-cudf-cu13",
    "kvikio-cu13",
    "rmm-cu13",
    "cupy-cuda13x",
    "ucxx-cu13",
    "distributed-ucxx-cu13",
    "pyarrow",
    "numpy",
    "pandas",
]


def _positive_gib(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A size in GiB: a usage error where it is not a positive number (0, -1, nan, inf)."""
    if not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value}: use a positive number of GiB, like 0.25")
    return value


def gib_option(name: str, help: str) -> Callable[[F], F]:
    """A size option in GiB, 0.25 unless given: a usage error where it is no positive number."""
    return click.option(
        name, default=0.25, show_default=True, type=float, callback=_positive_gib, help=help
    )


#: The running command's bar and the records it counts, while ``--progress`` shows one.
_steps: tuple[Bar, list] | None = None

PROGRESS_OPTION = click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="A bar of the measurements done (plain lines when stderr is not a terminal).",
)
PLOT_OPTION = click.option(
    "--plot",
    "plot_path",
    default=None,
    type=click.Path(dir_okay=False),
    callback=plottable,
    help="Draw the GB/s against the ceilings to this PNG (needs the plot extra).",
)
TARGET_OPTION = click.option(
    "--target",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "host", "device"]),
    help="auto: device where a GPU is visible, host otherwise.",
)


def counts_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> list[int] | None:
    """A count option's value: one count or a comma-separated sweep of distinct counts, each at
    least 1, in ascending order (``--partitions`` of ``bench shuffle``, ``--keys`` of ``etl``)."""
    if value is None:
        return None
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise click.BadParameter(f"{value!r}: use a count (>= 1) or distinct counts like 8,64,256")
    if max(counts) > MAX_COUNT:  # keys are int64 values drawn below the count
        raise click.BadParameter(f"{value!r}: counts go up to 2^62")
    return sorted(counts)


#: The largest count a count option takes.
MAX_COUNT = 2**62


def cluster_options(command: F) -> F:
    """``--workers``, ``--threads-per-worker``, ``--protocol`` and ``--rmm-pool-size``: the
    cluster of ``bench shuffle`` and ``bench etl``, resolved by :func:`resolve_run`."""
    for option in reversed(
        [
            click.option(
                "--workers",
                default=None,
                type=click.IntRange(1),
                help="default: one per GPU; 2 on the host",
            ),
            click.option(
                "--threads-per-worker", default=1, show_default=True, type=click.IntRange(1)
            ),
            click.option(
                "--protocol",
                default=None,
                type=click.Choice(["tcp", "ucxx"]),
                help="default: ucxx on the device target, tcp on the host target",
            ),
            click.option(
                "--rmm-pool-size",
                default=None,
                callback=byte_size,
                help="RMM pool per worker, e.g. 40GB (default: no pool; device target only)",
            ),
        ]
    ):
        command = option(command)
    return command


def resolve_target(target: str, rmm_pool_size: str | None) -> tuple[str, int]:
    """The target a run will use (``auto`` made concrete) and the GPUs visible: a usage error
    where that target, or an RMM pool on it, cannot run here."""
    gpus = gpu_count()
    if target == "auto":
        target = "device" if gpus else "host"
    if target == "device" and not gpus:
        raise click.UsageError("--target device needs a GPU, and none is visible here")
    if target == "host" and rmm_pool_size is not None:
        raise click.UsageError("--rmm-pool-size: the host target has no RMM pool")
    return target, gpus


def resolve_run(
    target: str,
    methods: str,
    known: Sequence[str],
    workers: int | None,
    protocol: str | None,
    rmm_pool_size: str | None = None,
) -> tuple[str, int, list[str], int, str]:
    """The target, GPU count, methods, workers and protocol a run will use, from its options:
    ``auto`` made concrete, and a usage error for what cannot run here."""
    target, gpus = resolve_target(target, rmm_pool_size)
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown or not chosen:
        what = f"unknown {unknown}" if unknown else "none given"
        raise click.UsageError(f"--methods: {what}; choose from {', '.join(known)}")
    twice = sorted({m for m in chosen if chosen.count(m) > 1})
    if twice:
        raise click.UsageError(f"--methods: {', '.join(twice)} given twice")
    workers = workers or (gpus if target == "device" else 2)
    protocol = protocol or ("ucxx" if target == "device" else "tcp")
    return target, gpus, chosen, workers, protocol


def device_only(chosen: list[str], only: Sequence[str], target: str, by_default: bool) -> list[str]:
    """``chosen`` without the methods that need GPU workers on the host target: left out of a
    default list, a usage error when asked for by name."""
    if target == "device":
        return chosen
    asked = [m for m in chosen if m in only]
    if asked and not by_default:
        raise click.UsageError(f"--methods {','.join(asked)}: runs on GPU workers only")
    return [m for m in chosen if m not in only]


def output_options(command: F) -> F:
    """``--json``, ``--markdown``, ``--plot`` and ``--progress``: what every benchmark writes
    and shows."""
    for option in reversed(
        [
            click.option(
                "--json",
                "json_path",
                default=None,
                type=click.Path(dir_okay=False),
                callback=writable,
            ),
            click.option(
                "--markdown",
                "md_path",
                default=None,
                type=click.Path(dir_okay=False),
                callback=writable,
            ),
            PLOT_OPTION,
            PROGRESS_OPTION,
        ]
    ):
        command = option(command)
    return command


def log(bench: str, message: str) -> None:
    """A progress line on stderr, so that stdout keeps only the table; above the bar if shown."""
    line = f"[bench {bench} {time.strftime('%H:%M:%S')}] {message}"
    if _steps is None:
        click.echo(line, err=True)
        return
    bar, records = _steps
    bar.print(line)
    bar.update(len(records))


@contextlib.contextmanager
def progress_bar(bench: str, records: list, total: int, enabled: bool) -> Iterator[None]:
    """While enabled, a bar of ``len(records)`` of ``total`` measurements, moved by ``log``."""
    global _steps
    if not enabled:
        yield
        return
    with Bar(f"bench {bench}: measurements", total) as bar:
        _steps = bar, records
        try:
            yield
        finally:
            _steps = None
            bar.update(len(records))


def versions() -> dict[str, str]:
    """Python, the packages that shape the numbers, and the git commit when run from a checkout."""
    out = {"python": platform.python_version()}
    for dist in VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    if out["dask-gpudirect"] == "not installed":  # run from a source tree on PYTHONPATH
        out["dask-gpudirect"] = "source tree"
    with contextlib.suppress(Exception):
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if sha:
            out["dask-gpudirect-git"] = sha
    return out


def cpu_name() -> str:
    """The CPU model, for the host description and the device name of host-target runs."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def child_env(changes: Mapping[str, str | None]) -> dict[str, str]:
    """The environment of a bench's child process: this one's with ``changes`` (None removes a
    name), and this source tree first on PYTHONPATH."""
    import dask_gpudirect

    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    root = os.path.dirname(os.path.dirname(os.path.abspath(dask_gpudirect.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def visible_devices() -> list[str]:
    """The GPUs this process may use, named as ``CUDA_VISIBLE_DEVICES`` names them ("0", "1"...
    when it is unset): worker ``i`` of a ``LocalCUDACluster`` gets the ``i``-th."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(gpu_count())]
    return [d.strip() for d in listed.split(",") if d.strip()][: gpu_count()]


def device_names() -> list[str]:
    """Names of the visible GPUs, from ``nvidia-smi`` (no CUDA context in this process)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = (line.split(", ", 1) for line in out.splitlines() if ", " in line)
    names = {index: name.strip() for index, name in rows}
    # CUDA_VISIBLE_DEVICES by index; by UUID (not matched here): every GPU's name
    return [names[d] for d in visible_devices() if d in names] or list(names.values())


def held_keys(dask_worker: Worker) -> int:
    """Keys a worker holds (run on the workers): a measurement waits for zero before the next."""
    try:
        return len(dask_worker.data)
    except TypeError:
        return 0


def wait_released(client: Client, baseline: int = 0) -> None:
    """Until the workers hold no more keys than ``baseline`` (the input); an error after 30 s:
    the next run would find the last one's partitions in memory and time nothing. Then the
    run's garbage is collected, here and on the workers, so that no later run pays for it: a
    full collection took 120-240 ms in a worker or a client that holds cuDF (H200), and landed
    in whichever run came next (the shuffle's phases count the collector's time)."""
    deadline = time.monotonic() + 30
    while (held := sum(client.run(held_keys).values())) > baseline:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the workers still hold {held} keys 30 s after a run (expected {baseline}): "
                "a result was not let go of"
            )
        time.sleep(0.05)
    gc.collect()
    client.run(gc.collect)


def _last_stage(dask_worker: Worker) -> dict[str, float]:
    from ..shuffle.plugin import service

    return service(dask_worker).last_phases


def stage_phases(client: Client) -> dict[str, float]:
    """The phases of the last shuffle stage (wait for inputs where they were read as it ran,
    split, send, wait for peers, take pieces, order, combine, keep), each the longest over the
    workers, named ``"shuffle: <phase>"``, then the client's own (inputs where it waited for
    them, plan, start, stages, publish) as ``"client: <phase>"``; each side's ``garbage
    collection`` is the collector's time inside its phases. Asked after the clock stopped."""
    from ..shuffle import coordinator

    out: dict[str, float] = {}
    for phases in client.run(_last_stage).values():
        for phase, seconds in phases.items():
            out[f"shuffle: {phase}"] = max(out.get(f"shuffle: {phase}", 0.0), seconds)
    return out | {f"client: {phase}": s for phase, s in coordinator.last_phases.items()}


def shuffle_engine() -> str | None:
    """The engine of the last shuffle this process ran on the package's exchange, which
    ``auto`` and Dask's own shuffles choose for themselves: a record says which one it timed."""
    from ..shuffle import coordinator

    return coordinator.last_engine


def write_outputs(
    result: dict,
    json_path: str | None,
    md_path: str | None,
    markdown: Markdown,
    plot_path: str | None = None,
) -> None:
    """``result`` as JSON, ``markdown(result)`` as Markdown and its bar chart, where asked for."""
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2, default=str)
    if md_path:
        os.makedirs(os.path.dirname(os.path.abspath(md_path)), exist_ok=True)
        with open(md_path, "w") as f:
            f.write(markdown(result))
    if plot_path:
        draw(result, plot_path)


#: Benchmark methods that are Dask's own calls on the package's exchange
#: (``shuffle_method="gpudirect"``): over Dask's read, and over ``dg.read_parquet``'s.
DASK_ON_EXCHANGE = ("dask-gpudirect", "dg-dask")


def dask_shuffle_method(method: str) -> str:
    """The ``shuffle_method`` a Dask pipeline of a benchmark's ``method`` passes: its own name,
    but ``"gpudirect"`` for :data:`DASK_ON_EXCHANGE`."""
    return "gpudirect" if method in DASK_ON_EXCHANGE else method


#: What happens between two timed runs of a method (:func:`wait_released`), as results say.
BETWEEN_RUNS = "the run's keys released and its garbage collected in the client and the workers"


def result_head(benchmark: str, target: str, gpus: int, opts: dict) -> dict:
    """What every benchmark's result starts with: what ran, when, where, with which options."""
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
        "target": target,
        "gpus": gpus,
        "host": {"cpu": cpu_name(), "cpus": os.cpu_count(), "hostname": platform.node()},
        "options": opts,
        "versions": versions(),
        "between_runs": BETWEEN_RUNS,
    }


def stop_reason(result: dict) -> str:
    """Why a run left measurements out: "interrupted", the error that stopped it, or "not
    reached" where it ran to the end."""
    return "interrupted" if result.get("interrupted") else result.get("error") or "not reached"


def unrecorded(records: list[dict], planned: Sequence[tuple], fields: Sequence[str]) -> list:
    """The ``planned`` measurements (values of ``fields``) that have no record among
    ``records``, for the caller to record as not measured: a table then names them."""
    done = {tuple(r.get(f) for f in fields) for r in records}
    return [p for p in planned if p not in done]


#: Why a planned measurement was not run where ``--time-limit`` left no time for it.
TIME_LIMIT_REACHED = "--time-limit reached"


def unmeasured(records: list[dict]) -> list[dict]:
    """The ``records`` of planned measurements that failed, timed out or found no time left
    under ``--time-limit``: a run with any exits non-zero, as not all was measured. Not those
    that cannot run here (a package missing, too few workers or GPUs), nor those a Ctrl-C or
    a stopped run left out (130, or the run's own error)."""
    failed = ("error", "failed", "timed out")
    return [r for r in records if r["status"] in failed or r.get("note") == TIME_LIMIT_REACHED]


def finish(result: dict, target: str, print_result: Callable[[dict], None], outputs: tuple) -> None:
    """Name the device where it was not found, write ``outputs`` (``write_outputs``' paths and
    renderer) and print the result; then exit non-zero if a measurement or the run failed (or
    a method timed out: :func:`unmeasured`), or 130 where Ctrl-C stopped it (as a shell says
    so: ``bench ... && next`` stops)."""
    result["device"] = result["device"] or (
        f"CPU {result['host']['cpu']}" if target == "host" else "unknown GPU"
    )
    write_outputs(result, *outputs)
    print_result(result)
    errors = unmeasured(result["records"])
    if result.get("error") or errors:
        why = f"{len(errors)} measurement(s) failed or timed out"
        if result.get("error"):
            why += f"; the run stopped: {result['error']}"
        raise SystemExit(f"{why}: see the table and the log")
    if result.get("interrupted"):
        raise SystemExit(130)


def ucx_environment() -> dict[str, str]:
    """This process's UCX and UCXX settings (``UCX_*``, ``UCXPY_*``): which transports UCX
    may use and how UCXX makes progress, for the record of a run over ucxx."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(("UCX_", "UCXPY_"))}


def ucx_record(client: Client) -> dict[str, dict[str, str]]:
    """:func:`ucx_environment` of this process and of the first worker."""
    first = min(client.nthreads())
    return {"ucx_env": ucx_environment(), "worker_ucx_env": client.run(ucx_environment)[first]}
