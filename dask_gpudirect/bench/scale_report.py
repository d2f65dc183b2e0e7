"""What ``bench scale`` makes of its child runs: one row per GPU count, the table and Markdown.

Kept apart from running the children so that a result can be rendered again without running
anything; every figure here is one a child run measured.
"""

from __future__ import annotations

from .tables import figure_text, footnote, markdown_table, print_table, ratio_text


def count_text(n: int, opts: dict) -> str:
    unit = "GPU" if opts["target"] == "device" else "worker"
    return f"{n} {unit}{'s' if n > 1 else ''}"


def _cell(rec: dict | None, field: str = "gbps") -> dict | None:
    """A figure of a child's record: its value where it ran, else its status and why; and why
    it is of fewer runs than asked (``stopped``: a budget or Ctrl-C), where it is."""
    if rec is None:
        return None
    value = rec.get(field) if rec.get("status") == "ok" else None
    note, stopped = rec.get("note") or "", rec.get("stopped") or ""
    return {"value": value, "status": rec.get("status"), "note": note, "stopped": stopped}


def _read_figures(result: dict) -> dict:
    by = {(r["key"], r["cache"]): r for r in result.get("records", [])}
    ratio = next(
        (
            c["ratio"]
            for c in result.get("checks", [])
            if (c["path"], c["cache"], c["baseline"]) == ("dg-binary", "warm", "h2d-pinned")
        ),
        None,
    )
    return {
        "binary": _cell(by.get(("dg-binary", "warm"))),
        "pinned_sum": _cell(by.get(("h2d-pinned", "-"))),
        "ratio": ratio,
        "pinned_concurrent": _cell(by.get(("h2d-concurrent", "-"))),
        "parquet": _cell(by.get(("dg-parquet", "warm"))),
        "balance": {
            key: spread.get("max_over_mean")
            for key, spread in (result.get("balance") or {}).items()
        },
    }


def _shuffle_figures(result: dict) -> dict:
    by = {r["key"]: r for r in result.get("records", [])}
    check: dict = next(
        (c for c in result.get("checks", []) if c["check"] == "faster of Dask's shuffles"), {}
    )
    return {
        key: _cell(by.get(method), "gbps_per_gpu")
        for key, method in (("dg", "gpudirect"), ("raw", "raw"), ("tasks", "tasks"), ("p2p", "p2p"))
    } | {"ratio": check.get("ratio"), "ratio_baseline": check.get("baseline")}


FIGURES = {"read": _read_figures, "shuffle": _shuffle_figures}


def rows_of(result: dict) -> list[dict]:
    """One row per GPU count, ascending: the figures of its read and shuffle runs."""
    rows = []
    for n in sorted(result["options"]["gpus"]):
        row: dict = {"gpus": n}
        for run in result["runs"]:
            if run["gpus"] == n:
                figures = FIGURES[run["bench"]](run["result"]) if run["result"] else None
                row[run["bench"]] = {"status": run["status"], "note": run.get("note", "")}
                row[run["bench"]]["figures"] = figures
        rows.append(row)
    return rows


def _header(target: str) -> tuple[str, ...]:
    if target == "device":
        return (
            "GPUs",
            "dg.read_binary GB/s",
            "sum of pinned ceilings",
            "ratio",
            "all GPUs copying at once",
            "dg.read_parquet GB/s",
            "dg.shuffle GB/s per GPU",
            "raw GPU->GPU (NVLink) GB/s",
            "tasks / p2p GB/s per GPU",
            "dg vs faster Dask shuffle",
        )
    return (
        "workers",
        "dg.read_binary GB/s",
        "sum of pinned ceilings",
        "ratio",
        "all copying at once",
        "dg.read_parquet GB/s",
        "dg.shuffle GB/s per worker",
        "raw worker->worker GB/s",
        "tasks / p2p GB/s per worker",
        "dg vs faster Dask shuffle",
    )


def table(result: dict) -> tuple[list[tuple[str, ...]], list[str]]:
    """The table's cells and footnotes, from the rows' figures."""
    notes: list[str] = []

    def show(cell: dict | None) -> str:
        if cell is None:
            return "-"
        if cell["value"] is not None:
            stopped = cell.get("stopped")  # not in results written before it was kept
            return figure_text(cell["value"]) + (
                f" [{footnote(notes, stopped)}]" if stopped else ""
            )
        return f"{cell['status']} [{footnote(notes, cell['note'] or 'no reason given')}]"

    def ratio(value: float | None, suffix: str = "") -> str:
        return f"{ratio_text(value)}{suffix}" if value is not None else "-"

    cells = []
    for row in result["rows"]:
        line = [str(row["gpus"])]
        for bench, width in (("read", 5), ("shuffle", 4)):
            run = row.get(bench)
            figures = (run or {}).get("figures")
            if run is None:
                line += ["-"] * width
            elif figures is None:
                line += [show({"value": None, **run})] * width
            elif bench == "read":
                line += [
                    show(figures["binary"]),
                    show(figures["pinned_sum"]),
                    ratio(figures["ratio"]),
                    show(figures["pinned_concurrent"]),
                    show(figures["parquet"]),
                ]
            else:
                baseline = figures["ratio_baseline"]
                line += [
                    show(figures["dg"]),
                    show(figures["raw"]),
                    f"{show(figures['tasks'])} / {show(figures['p2p'])}",
                    ratio(figures["ratio"], f" {baseline}" if baseline else ""),
                ]
        cells.append(tuple(line))
    return cells, [f"[{i + 1}] {n}" for i, n in enumerate(notes)]


EXPLAIN = (
    "Each cell is a figure of the child run named below (its JSON is embedded in this run's). "
    "Read: aggregate file bytes per second of all workers reading their own shards at once, "
    "page cache warm (the median of the warm runs); the ratio is dg.read_binary over the sum of "
    "the GPUs' pinned host->device ceilings, each measured alone in the same run; 'all GPUs "
    "copying at once' is the same copies made together, where host memory and PCIe are shared "
    "(not measured with one GPU). Shuffle: frame bytes / seconds / workers, the median of the "
    "warm runs; raw is one buffer from worker A to worker B (the wire's ceiling: cuda_ipc over "
    "NVLink between GPUs; not run with one worker); the last column is dg.shuffle over the "
    "faster of Dask's task and P2P shuffles."
)


def _balance_lines(result: dict) -> list[str]:
    """How evenly placement spread each read's bytes over the workers (max/mean, 1 is even)."""
    lines = []
    for row in result["rows"]:
        figures = (row.get("read") or {}).get("figures") or {}
        spread = {k: v for k, v in (figures.get("balance") or {}).items() if v}
        if spread:
            parts = ", ".join(f"{key} {value:.2f}" for key, value in sorted(spread.items()))
            lines.append(f"- {count_text(row['gpus'], result['options'])}: {parts}")
    if not lines:
        return []
    return ["Bytes per worker after each read, max over mean (1.00: even):", "", *lines, ""]


def _setup_lines(result: dict) -> list[str]:
    o = result["options"]
    return [
        f"- date: {result['date']}",
        f"- device: {result['device']} (target `{result['target']}`, "
        f"{result['gpus']} GPU(s) visible)",
        f"- command: `{result['command']}`",
        f"- read args: `{o['read_args']}` (and `--files {o['files']} --dir {o['dir']}`)",
        f"- shuffle args: `{o['shuffle_args']}`",
        f"- protocol: {o['protocol']}",
    ]


def _runs_table(result: dict) -> list[str]:
    count = _header(result["target"])[0]
    rows = [
        (
            run["bench"],
            str(run["gpus"]),
            run["status"],
            f"{run['seconds']:.0f} / {run['limit']}" if "seconds" in run else "-",
            f"`{run['command']}`" if "command" in run else run.get("note", ""),
        )
        for run in result["runs"]
    ]
    return markdown_table(("run", count, "status", "seconds / limit", "command"), rows)


def markdown(result: dict) -> str:
    cells, notes = table(result)
    lines = [
        f"# dask-gpudirect scaling: {result['device']}",
        "",
        *_setup_lines(result),
        "",
        *markdown_table(_header(result["target"]), cells),
        "",
        *(f"{n}  " for n in notes),
        "",
        *_balance_lines(result),
        EXPLAIN,
        "",
        "Runs, in the order they ran:",
        "",
        *_runs_table(result),
    ]
    return "\n".join(lines) + "\n"


def print_result(result: dict) -> None:
    cells, notes = table(result)
    header = _header(result["target"])
    title = f"bench scale: {result['device']} ({result['target']} target)"
    print_table(title, header, cells, notes, right=header)
