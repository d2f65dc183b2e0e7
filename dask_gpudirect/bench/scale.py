"""``dask-gpudirect bench scale``: ``bench read`` and ``bench shuffle`` on 1, 2, ... GPUs.

For each GPU count N it runs ``bench read --workers N`` and ``bench shuffle --workers N`` (one
worker per GPU), each in a fresh process with a time limit, and reads the table from the JSON
they write: every figure in it is one a child run measured. A row names why it has no figure.

Why one process per run: each GPU count gets its own cluster, with nothing left over from the
last (GPU memory, RMM pools, UCX endpoints, kvikio settings), and a run that hangs or crashes
costs its own cells only. On the device target a child sees the first N GPUs
(``CUDA_VISIBLE_DEVICES``); every child has this process's environment besides.
A child runs in a process group of its own: at its limit it gets SIGINT (it then writes what it
measured), and ``GRACE_S`` later its whole group, Dask workers included, gets SIGKILL.

The largest GPU count runs first, so that a run out of time costs the smaller rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import click

from ..cuda import gpu_count
from .common import (
    TARGET_OPTION,
    TIME_LIMIT_REACHED,
    child_env,
    cpu_name,
    log,
    output_options,
    progress_bar,
    result_head,
    unmeasured,
    visible_devices,
    write_outputs,
)
from .scale_report import count_text, markdown, print_result, rows_of

BENCHES = ("read", "shuffle")
#: Seconds from a child's SIGINT to the SIGKILL of its process group.
GRACE_S = 30.0
#: Seconds a shuffle child's own --time-limit keeps back from its hard limit.
SHUFFLE_MARGIN_S = 20.0
#: The least hard limit a child is started with.
MIN_LIMIT_S = {"read": 30.0, "shuffle": 30.0 + SHUFFLE_MARGIN_S}
#: Seconds that --time-limit keeps back to write the table.
RESERVE_S = 10.0
#: The least --time-limit: the first run of either bench starts within it, after the
#: command's own start (60 ran nothing).
LEAST_TIME_LIMIT_S = RESERVE_S + GRACE_S + max(MIN_LIMIT_S.values()) + RESERVE_S


def _log(message: str) -> None:
    log("scale", message)


# --- running the children ---------------------------------------------------------------------


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group ``pgid``, from /proc."""
    pids = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    pids.append(int(name))
    return pids


def _end_group(pgid: int, wait: float) -> None:
    """Give what is left of a child's process group ``wait`` seconds to exit, then SIGKILL it."""
    deadline = time.monotonic() + wait
    while _members(pgid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(0.2)


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGINT to the child (it writes what it measured and closes its cluster), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run_child(cmd: list[str], env: dict, log_path: str, limit: float) -> dict:
    """Run ``cmd`` with its output to ``log_path``, stopped at ``limit`` seconds."""
    start = time.monotonic()
    status = None
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            status = "timed out"
            _stop(proc, GRACE_S)
        except KeyboardInterrupt:
            status = "interrupted"
            _stop(proc, GRACE_S / 2)
        finally:
            if proc.poll() is None:  # an exception of our own: leave nothing running
                _stop(proc, 0)
            _end_group(proc.pid, 10)
    seconds = round(time.monotonic() - start, 1)
    return {"exit": proc.returncode, "seconds": seconds, "status": status}


def _load(path: str) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            return json.load(f)
    return None


def _tail(path: str) -> list[str]:
    """The last 12 lines of a child's log (none where it cannot be read)."""
    with contextlib.suppress(OSError):
        with open(path, errors="replace") as f:
            return [line.rstrip() for line in f.readlines()[-12:]]
    return []


def _command(bench: str, n: int, opts: dict, paths: dict, limit: float) -> list[str]:
    """The child's command line: scale's choices first, so that the user's args win."""
    cmd = [sys.executable, "-m", "dask_gpudirect.bench", bench]
    cmd += ["--target", opts["target"], "--workers", str(n), "--protocol", opts["protocol"]]
    cmd += ["--json", paths["json"], "--markdown", paths["markdown"]]
    if bench == "read":
        cmd += ["--dir", opts["dir"], "--files", str(opts["files"])]
        return cmd + opts["read_args"]
    cmd += ["--time-limit", f"{limit - SHUFFLE_MARGIN_S:.0f}"]
    return cmd + opts["shuffle_args"]


def _one_run(bench: str, n: int, opts: dict, devices: list[str], limit: float) -> dict:
    """Run ``bench`` on ``n`` GPUs (workers) in a child; its record, its JSON result inside."""
    stem = os.path.join(opts["runs_dir"], f"{bench}-{n}gpu")
    paths = {"json": f"{stem}.json", "markdown": f"{stem}.md", "log": f"{stem}.log"}
    for path in paths.values():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # no figure from an earlier run can pass for this one's
    changes = {"PYTHONUNBUFFERED": "1"}
    if opts["target"] == "device":
        changes["CUDA_VISIBLE_DEVICES"] = ",".join(devices[:n])
    cmd = _command(bench, n, opts, paths, limit)
    _log(f"{bench} on {count_text(n, opts)} (limit {limit:.0f} s): {shlex.join(cmd)}")
    done = _run_child(cmd, child_env(changes), paths["log"], limit)
    result = _load(paths["json"])
    status = done["status"] or ("ok" if done["exit"] == 0 and result else "failed")
    run = {
        "bench": bench,
        "gpus": n,
        "status": status,
        "exit": done["exit"],
        "seconds": done["seconds"],
        "limit": round(limit),
        "command": shlex.join(cmd),
        "env": {k: v for k, v in changes.items() if k != "PYTHONUNBUFFERED"},
        **paths,
        "result": result,
    }
    if status != "ok":
        tail = _tail(paths["log"])
        run["note"] = f"{bench} on {count_text(n, opts)}: {status} (exit {done['exit']}"
        run["note"] += f", limit {limit:.0f} s)" if status == "timed out" else ")"
        run["note"] += f": {tail[-1]}" if tail else ""
        _log(
            f"{bench} on {count_text(n, opts)}: {status}, exit {done['exit']}; the end of its log:"
        )
        for line in tail:
            _log(f"  | {line}")
    else:
        _log(f"{bench} on {count_text(n, opts)}: ok in {done['seconds']:.0f} s")
    return run


def _not_run(bench: str, n: int, why: str) -> dict:
    return {"bench": bench, "gpus": n, "status": "not run", "note": why, "result": None}


def _plan(opts: dict) -> list[tuple[str, int]]:
    """(bench, GPU count) in the order they run: the largest count first."""
    return [(b, n) for n in sorted(opts["gpus"], reverse=True) for b in opts["benches"]]


def _run_all(result: dict, opts: dict, devices: list[str], deadline: float | None) -> None:
    runs = result["runs"]
    for bench, n in _plan(opts):
        limit = opts[f"{bench}_limit"]
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic() - GRACE_S)
        if opts["target"] == "device" and n > len(devices):
            runs.append(_not_run(bench, n, f"{len(devices)} GPU(s) visible"))
        elif limit < MIN_LIMIT_S[bench]:
            runs.append(_not_run(bench, n, TIME_LIMIT_REACHED))
        else:
            runs.append(_one_run(bench, n, opts, devices, limit))
            if runs[-1]["status"] == "interrupted":
                raise KeyboardInterrupt


# --- the command ------------------------------------------------------------------------------


def _counts(text: str | None, target: str, gpus: int) -> list[int]:
    if text is None:
        return sorted({1, gpus if target == "device" else 2})
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise click.UsageError(f"--gpus {text!r}: comma-separated counts, e.g. 1,2") from None
    if not counts or counts[0] < 1:
        raise click.UsageError(f"--gpus {text!r}: counts of at least 1")
    return counts


#: The options scale gives each run itself: its count, its place, its outputs and limits.
SET_BY_SCALE = {
    "--target", "--workers", "--protocol", "--json", "--markdown", "--dir", "--files",
    "--time-limit",
}  # fmt: skip


def _words(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    """More options for each run of ``--read-args``' or ``--shuffle-args``' bench, split as a
    shell splits them and parsed as that bench parses them, at the start: a usage error where
    one is not the bench's, or is one scale sets itself (a child then failed after its run,
    or ran with a count its row did not say)."""
    from .read import read
    from .shuffle import shuffle

    try:
        words = shlex.split(value)
    except ValueError as exc:  # "No closing quotation"
        raise click.BadParameter(f"{value!r}: {exc}") from None
    command = read if param.name == "read_args" else shuffle
    try:
        given, _, _ = command.make_parser(click.Context(command)).parse_args(list(words))
    except click.UsageError as exc:
        raise click.BadParameter(f"{value!r}: {exc.format_message()}") from None
    taken = sorted(
        flag for p in command.params if p.name in given for flag in p.opts if flag in SET_BY_SCALE
    )
    if taken:
        raise click.BadParameter(f"{', '.join(taken)}: scale sets it for each run")
    return words


@click.command(name="scale")
@click.option(
    "--gpus",
    "counts_text",
    default=None,
    help="comma-separated GPU counts (workers on the host target) [default: 1 and all visible "
    "GPUs; 1,2 on the host target]",
)
@TARGET_OPTION
@click.option(
    "--protocol",
    default=None,
    type=click.Choice(["tcp", "ucxx"]),
    help="of every run's cluster [default: ucxx on the device target, tcp on the host target]",
)
@click.option(
    "--benches", default="read,shuffle", show_default=True, help="comma-separated: read, shuffle"
)
@click.option(
    "--read-args", default="", callback=_words, help="more options for each `bench read` run"
)
@click.option(
    "--shuffle-args", default="", callback=_words, help="more options for each `bench shuffle` run"
)
@click.option(
    "--files",
    default=None,
    type=click.IntRange(1),
    help="files of each read dataset [default: max(8, 2 per worker of the largest count run)]",
)
@click.option(
    "--dir",
    "data_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="bench read's data directory, one for every count [default: a temporary one]",
)
@click.option(
    "--runs-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="each run's JSON, Markdown and log [default: beside --json as NAME-runs, else temporary]",
)
@click.option(
    "--read-limit",
    default=180.0,
    show_default=True,
    type=click.FloatRange(30),
    help=f"seconds for each bench read run; then SIGINT, and SIGKILL {GRACE_S:.0f} s later",
)
@click.option(
    "--shuffle-limit",
    default=240.0,
    show_default=True,
    type=click.FloatRange(50),
    help=f"seconds for each bench shuffle run; its own --time-limit is {SHUFFLE_MARGIN_S:.0f} s "
    "less",
)
@click.option(
    "--time-limit",
    default=None,
    type=click.FloatRange(LEAST_TIME_LIMIT_S),
    help="seconds for the whole command: runs that no longer fit are not started (at least "
    f"{LEAST_TIME_LIMIT_S:.0f}, what the first run of either bench needs)",
)
@output_options
def scale(
    counts_text: str | None,
    target: str,
    protocol: str | None,
    benches: str,
    read_args: list[str],
    shuffle_args: list[str],
    files: int | None,
    data_dir: str | None,
    runs_dir: str | None,
    read_limit: float,
    shuffle_limit: float,
    time_limit: float | None,
    json_path: str | None,
    md_path: str | None,
    plot_path: str | None,
    progress: bool,
) -> None:
    """bench read and bench shuffle on 1, 2, ... GPUs (one worker each): a scaling table."""
    started = time.monotonic()
    gpus = gpu_count()
    if target == "auto":
        target = "device" if gpus else "host"
    if target == "device" and not gpus:
        raise click.UsageError("--target device needs a GPU, and none is visible here")
    chosen = [b.strip() for b in benches.split(",") if b.strip()]
    if not chosen or set(chosen) - set(BENCHES):
        raise click.UsageError(f"--benches {benches!r}: choose from {', '.join(BENCHES)}")
    counts = _counts(counts_text, target, gpus)
    temporary = []
    if data_dir is None:
        data_dir = tempfile.mkdtemp(prefix="dask-gpudirect-scale-data-")
        temporary.append(data_dir)
    if runs_dir is None and json_path:
        runs_dir = os.path.splitext(json_path)[0] + "-runs"
    if runs_dir is None:
        runs_dir = tempfile.mkdtemp(prefix="dask-gpudirect-scale-runs-")
        temporary.append(runs_dir)
    os.makedirs(runs_dir, exist_ok=True)
    opts: dict[str, Any] = {
        "gpus": counts,
        "target": target,
        "protocol": protocol or ("ucxx" if target == "device" else "tcp"),
        "benches": [b for b in BENCHES if b in chosen],
        "read_args": read_args,
        "shuffle_args": shuffle_args,
        "files": files or max([8, *(2 * n for n in counts if n <= gpus or target == "host")]),
        "dir": os.path.abspath(data_dir),
        "runs_dir": os.path.abspath(runs_dir),
        "read_limit": read_limit,
        "shuffle_limit": shuffle_limit,
        "time_limit": time_limit,
    }
    from .common import device_names

    names = device_names() if target == "device" else []
    result = {
        **result_head("scale", target, gpus, opts),
        "device": names[0] if names else f"CPU {cpu_name()}",
        "device_names": names,
        "runs": [],
    }
    deadline = started + time_limit - RESERVE_S if time_limit else None
    total = len(counts) * len(opts["benches"])
    try:
        with progress_bar("scale", result["runs"], total, progress):
            _run_all(result, opts, visible_devices(), deadline)
    except KeyboardInterrupt:  # e.g. `timeout -s INT`: the table of what ran
        result["interrupted"] = True
        _log("interrupted: writing the table of the runs that finished")
    finally:
        for path in temporary:
            shutil.rmtree(path, ignore_errors=True)
    done = {(r["bench"], r["gpus"]) for r in result["runs"]}
    result["runs"] += [_not_run(b, n, "interrupted") for b, n in _plan(opts) if (b, n) not in done]
    result["rows"] = rows_of(result)
    write_outputs(result, json_path, md_path, markdown, plot_path)
    print_result(result)
    if result.get("interrupted"):  # as the other benches and a shell say Ctrl-C: 130
        raise SystemExit(130)
    failed = [f"{r['bench']} on {r['gpus']}" for r in unmeasured(result["runs"])]
    if failed:
        raise SystemExit(f"not every run finished: {', '.join(failed)}; see the table")
