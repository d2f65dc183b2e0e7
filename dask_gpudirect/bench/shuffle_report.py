"""What ``bench shuffle`` makes of its records: the targets judged, and the tables and Markdown.

Kept apart from the measurements so that a result (a run's JSON, a committed one included) can be
judged and rendered again without a cluster.
"""

from __future__ import annotations

from .tables import (
    between_runs_note,
    check_ratio_text,
    comparable,
    figure_text,
    footnote,
    judge,
    markdown_table,
    print_table,
    ratio_of,
    ratio_text,
)

#: The methods, in table order.
METHODS = ("gpudirect", "rapidsmpf", "dask-gpudirect", "tasks", "p2p", "raw")
#: The methods of ``--data array``: RapidsMPF shuffles cuDF tables and Dask's array shuffle is
#: a task graph only.
ARRAY_METHODS = ("gpudirect", "tasks", "raw")
#: Methods that need GPU workers: left out of the host target's default.
DEVICE_ONLY = ("rapidsmpf",)
LABELS = {
    "gpudirect": {"device": "dg.shuffle(df, 'key')", "host": "dg.shuffle(df, 'key')"},
    "rapidsmpf": {
        "device": "dg.shuffle(df, 'key', engine='rapidsmpf')",
        "host": "dg.shuffle(df, 'key', engine='rapidsmpf')",
    },
    "dask-gpudirect": {
        "device": "dask_cudf df.shuffle('key', shuffle_method='gpudirect')",
        "host": "df.shuffle('key', shuffle_method='gpudirect')",
    },
    "tasks": {
        "device": "dask_cudf df.shuffle('key', shuffle_method='tasks')",
        "host": "df.shuffle('key', shuffle_method='tasks')",
    },
    "p2p": {
        "device": "dask_cudf df.shuffle('key', shuffle_method='p2p')",
        "host": "df.shuffle('key', shuffle_method='p2p')",
    },
    "raw": {
        "device": "raw transfer: one CuPy buffer, worker A -> B",
        "host": "raw transfer: one NumPy buffer, worker A -> B",
    },
}
#: ``--data array``'s labels, where they differ from the frame's.
ARRAY_LABELS = {
    "gpudirect": {"device": "dg.shuffle_array(arr)", "host": "dg.shuffle_array(arr)"},
    "tasks": {
        "device": "arr.shuffle(groups, axis=0) (CuPy chunks)",
        "host": "arr.shuffle(groups, axis=0)",
    },
}
#: The issue's targets on the device target: dg.shuffle per GPU against each baseline.
TARGET_VS_DASK = 3.0
TARGET_VS_RAW = 0.5
LEDGER_TITLE = "dg's ledger of the last dg.shuffle run, summed over the workers"


#: The most dg.shuffle's time may grow from the fewest partitions of a sweep to the most (the
#: same bytes): 1.5x on GPUs that exchange (8 -> 1024), 4x on the host target (8 -> 512).
SCALING_BOUND = {"device": 1.5, "host": 4.0}
#: GB/s per GPU dg.shuffle must reach at 256 partitions on GPUs that exchange.
TARGET_GBPS_AT_256 = 20.0


def counts_of(records: list[dict]) -> list[int]:
    """The partition counts measured, fewest first."""
    return sorted({r["partitions"] for r in records if "partitions" in r})


def is_sweep(records: list[dict]) -> bool:
    """Whether ``records`` hold more than one partition count (``--partitions 8,64,...``)."""
    return len(counts_of(records)) > 1


def checks_of(records: list[dict], target: str, workers: int, data: str = "frame") -> list[dict]:
    """Against the baselines for one partition count; for a sweep of counts, how dg.shuffle's
    (or ``dg.shuffle_array``'s) time grows with them."""
    if is_sweep(records):
        return _scaling_checks(records, target, workers, data)
    return _baseline_checks(records, target, workers)


def _scaling_checks(records: list[dict], target: str, workers: int, data: str) -> list[dict]:
    """Per dg engine: its time at the most partitions over its time at the fewest, and (on GPUs
    that exchange) its GB/s per GPU at 256 partitions."""
    counts = counts_of(records)
    exchanging = target == "host" or workers > 1
    out = []
    for engine in ("gpudirect", "rapidsmpf"):
        dg = {r["partitions"]: r for r in records if r["key"] == engine}
        if not dg:
            continue
        fewest, most = dg.get(counts[0]), dg.get(counts[-1])
        ratio, cold = None, False
        if fewest and most and fewest["status"] == most["status"] == "ok":
            ratio, cold = ratio_of("seconds", most, fewest)
        want = SCALING_BOUND[target] if exchanging else None
        out.append(
            {
                "check": f"{label_of(engine, target, data)}: time at {counts[-1]} partitions over "
                f"its time at {counts[0]}",
                "path": engine,
                "baseline": f"{counts[0]} partitions",
                "ratio": ratio,
                "target": want,
                "at_most": True,
                "result": judge(ratio, want, at_most=True),
                **({"cold": True} if cold else {}),
            }
        )
        at_256 = dg.get(256)
        if at_256 is not None and target == "device":
            gbps = at_256["gbps_per_gpu"] if at_256["status"] == "ok" else None
            want = TARGET_GBPS_AT_256 if workers > 1 else None
            out.append(
                {
                    "check": f"{label_of(engine, target, data)}: GB/s per GPU at 256 partitions",
                    "path": engine,
                    "baseline": "GB/s",
                    "ratio": gbps,
                    "target": want,
                    "at_most": False,
                    "absolute": True,
                    "result": judge(gbps, want),
                }
            )
    return out


#: The check of dg.shuffle against the faster of Dask's task and P2P shuffles.
FASTER_DASK = "faster of Dask's shuffles"


def _baseline_checks(records: list[dict], target: str, workers: int) -> list[dict]:
    """dg.shuffle against Dask's shuffles and the raw transfer; targets apply to GPUs that
    exchange (with one worker every row stays where it is)."""
    by = {r["key"]: r for r in records}
    dg = by.get("gpudirect")
    if dg is None:
        return []
    out = []
    dask = [by[k] for k in ("tasks", "p2p") if k in by]
    ran = [r for r in dask if r["status"] == "ok"]
    pairs: list[tuple[str, dict, float | None]] = []
    if dask:  # chosen by the figure its ratio sets against dg's (first runs where any is cold)
        faster = comparable("gbps_per_gpu", dg, *ran)[0]
        base = max(ran, key=lambda r: r[faster]) if ran else dask[0]
        pairs.append((FASTER_DASK, base, TARGET_VS_DASK))
    # the faster of Dask's shuffles is not known where one of them failed or was left out
    # (one that timed out took longer than its budget): its ratio is shown, not judged
    unknown = [r["key"] for r in dask if r["status"] in ("not run", "error")]
    if "raw" in by:
        pairs.append(("raw single-buffer transfer", by["raw"], TARGET_VS_RAW))
    if "rapidsmpf" in by:  # which engine is faster: no target, the figure sets the default
        pairs.append(("dg.shuffle on the rapidsmpf engine", by["rapidsmpf"], None))
    if "dask-gpudirect" in by:  # what Dask's own expression costs around the same exchange
        pairs.append(("Dask's df.shuffle on dg's exchange", by["dask-gpudirect"], None))
    for name, base, factor in pairs:
        want = factor if target == "device" and workers > 1 and factor else None
        ratio, cold = None, False
        if dg["status"] == "ok" and base["status"] == "ok":
            others = ran if name == FASTER_DASK else []  # the faster was chosen among them
            ratio, cold = ratio_of("gbps_per_gpu", dg, base, *others)
        verdict = judge(ratio, want)
        if name == FASTER_DASK and unknown and want is not None:
            verdict = "not run"
        out.append(
            {
                "check": name,
                "path": "gpudirect",
                "baseline": base["key"],
                "ratio": ratio,
                "target": want,
                "result": verdict,
                **({"cold": True} if cold else {}),
            }
        )
    return out


def label_of(key: str, target: str, data: str = "frame") -> str:
    """What ran as method ``key``, on a frame or (``data="array"``) an array."""
    labels = ARRAY_LABELS if data == "array" and key in ARRAY_LABELS else LABELS
    return labels[key][target]


def data_of(result: dict) -> str:
    """What a result shuffled: ``frame`` or ``array`` (results before ``--data``: a frame)."""
    return (result.get("options") or {}).get("data") or "frame"


def _options_note(result: dict) -> str:
    """How the shuffles treated the index and the order, where ``--ignore-index`` dropped the
    one or ``--no-keep-order`` let dg drop the other."""
    options = result.get("options") or {}
    notes = ["`ignore_index=True`"] if options.get("ignore_index") else []
    if options.get("keep_order") is False:  # results before the option kept the order
        notes.append("dg's with `keep_order=False`")
    return f", shuffled with {' and '.join(notes)}" if notes else ""


HEADER = ("method", "GB/s per GPU", "best", "first run", "seconds", "runs")
#: The host target has no GPUs: the same figure is per worker there.
HOST_HEADER = ("method", "GB/s per worker", *HEADER[2:])
CHECK_HEADER = ("dg.shuffle per GPU against", "ratio", "target", "result")
HOST_CHECK_HEADER = ("dg.shuffle per worker against", *CHECK_HEADER[1:])
SWEEP_CHECK_HEADER = ("check", *CHECK_HEADER[1:])


def _check_header(result: dict) -> tuple[str, ...]:
    return HOST_CHECK_HEADER if result["target"] == "host" else CHECK_HEADER


def _ledger_header(result: dict) -> tuple[str, ...]:
    """The ledger's columns, its bytes also as a multiple of the frame's (or the array's)."""
    return ("op", "path", "transfers", "GB", "copies", f"x {data_of(result)} bytes")


def _rows(result: dict) -> tuple[list[tuple[str, ...]], list[str]]:
    """Method rows (label, GB/s per GPU, best, first, seconds, runs) and footnotes."""
    by = {r["key"]: r for r in result["records"]}
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for key in METHODS:
        rec = by.get(key)
        if rec is None:
            continue
        label = label_of(key, result["target"], data_of(result))
        if rec["status"] == "ok":
            if rec["stopped"]:
                label += f" [{footnote(notes, rec['stopped'])}]"
            rows.append(
                (
                    label,
                    figure_text(rec["gbps_per_gpu"]),
                    figure_text(rec["best_gbps_per_gpu"]),
                    figure_text(rec["first_gbps_per_gpu"]),
                    f"{rec['seconds']:.3f}",
                    f"1 + {rec['warm_runs']}",
                )
            )
        else:
            why = rec.get("note") or "no reason given"
            rows.append((label, f"{rec['status']} [{footnote(notes, why)}]", "", "", "", ""))
    return rows, [f"[{i + 1}] {n}" for i, n in enumerate(notes)]


def _header(result: dict) -> tuple[str, ...]:
    return HOST_HEADER if result["target"] == "host" else HEADER


def _check_rows(result: dict) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for c in result["checks"]:
        unit = "" if c.get("absolute") else "x"
        ratio = check_ratio_text(c, unit)
        bound = "<=" if c.get("at_most") else ">="
        want = f"{bound} {c['target']:.2f}{unit}" if c["target"] is not None else "-"
        plain = c.get("at_most") or c.get("absolute")
        label = c["check"] if plain else f"{c['check']} ({c['baseline']})"
        rows.append((label, ratio, want, c["result"]))
    return rows


def _ledger_rows(result: dict) -> list[tuple[str, ...]]:
    """The ledger summed over the workers, per (op, path)."""
    sums: dict[tuple[str, str], list] = {}
    for r in result.get("ledger") or []:
        acc = sums.setdefault((r["op"], r["path"]), [0, 0, r["copies"]])
        acc[0] += int(r["count"])
        acc[1] += int(r["bytes"])
    frame = (result.get("data") or {}).get("bytes") or 0
    return [
        (
            op,
            path,
            str(count),
            f"{nbytes / 1e9:.3f}",
            str(copies),
            f"{nbytes / frame:.2f}" if frame else "-",
        )
        for (op, path), (count, nbytes, copies) in sorted(sums.items())
    ]


def _setup_line(result: dict) -> str:
    c = result.get("cluster") or {}
    line = f"{c.get('workers', '?')} worker(s), {c.get('threads_per_worker', '?')} thread(s) each"
    line += f", protocol {c.get('protocol', '?')}"
    if c.get("ucx_transports"):
        line += f" (UCX transports: {c['ucx_transports']})"
    if c.get("rmm_pool_size"):
        line += f", RMM pool {c['rmm_pool_size']} per worker"
    return line


#: How the report says where ``bench shuffle --placement`` made the partitions.
PLACEMENTS = {"dealt": "round-robin", "blocks": "in blocks of consecutive ones"}


def _placement(result: dict) -> str:
    return PLACEMENTS[(result.get("options") or {}).get("placement", "dealt")]


def _data_line(result: dict) -> str:
    d = result.get("data")
    if not d:
        return "not made"
    data = data_of(result)
    rows = "records" if data == "array" else "rows"
    return (
        f"{d['kind']} {data} of {d['bytes'] / 1e9:.3f} GB, {d['rows']} {rows} "
        f"({d['columns']}), {d['partitions']} partitions placed {_placement(result)} on the "
        "workers"
        f"{_options_note(result)}"
    )


def _device_line(result: dict) -> str:
    if result["target"] == "host":
        return f"{result['device']} (target `host`)"
    return f"{result['gpus']} x {result['device']} (target `device`)"


SCALING_NOTE = (
    "Seconds: the median warm run, the whole call until every output partition is in memory; "
    "GB/s per GPU (per worker on the host target): {data} bytes / seconds / workers; x: the time "
    "over the method's own time at the fewest partitions. The same bytes at every count, each "
    "count in a fresh cluster."
)


def _scaling_rows(
    result: dict,
) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[str]]:
    """One row per partition count, one cell per method: seconds, GB/s, growth; and the
    footnotes: why a cell has no figure, and where a figure is of fewer runs than asked."""
    records = result["records"]
    methods = [m for m in METHODS if any(r["key"] == m for r in records)]
    by = {(r["key"], r["partitions"]): r for r in records}
    header = ("partitions", *(label_of(m, result["target"], data_of(result)) for m in methods))
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    counts = counts_of(records)
    for n in counts:
        cells = [str(n)]
        for m in methods:
            rec = by.get((m, n))
            if rec is None or rec["status"] != "ok":
                status = rec["status"] if rec else "not run"
                why = (rec or {}).get("note") or "no reason given"
                cells.append(f"{status} [{footnote(notes, why)}]")
                continue
            # the growth is over the method's time at the fewest partitions, where that ran
            fewest = by.get((m, counts[0]))
            growth = "-"
            if fewest is not None and fewest["status"] == "ok":
                growth = ratio_text(*ratio_of("seconds", rec, fewest))
            cell = f"{rec['seconds']:.2f} s, {figure_text(rec['gbps_per_gpu'])} GB/s, {growth}"
            if rec.get("stopped"):
                cell += f" [{footnote(notes, rec['stopped'])}]"
            cells.append(cell)
        rows.append(tuple(cells))
    return header, rows, [f"[{i + 1}] {n}" for i, n in enumerate(notes)]


def _sweep_markdown(result: dict) -> str:
    header, rows, notes = _scaling_rows(result)
    counts = ", ".join(map(str, counts_of(result["records"])))
    made = [s["data"]["bytes"] for s in result.get("sweep", []) if s.get("data")]
    data = made[0] if made else None
    lines = [
        f"# dask-gpudirect shuffle scaling: {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- device: {_device_line(result)}",
        f"- cluster: {_setup_line(result)}",
        f"- command: `{result['command']}`",
        f"- data: the same {data / 1e9:.3f} GB {data_of(result)} cut into {counts} partitions, "
        f"placed {_placement(result)} on the workers{_options_note(result)}"
        if data
        else f"- data: not made ({counts} partitions asked for)",
        "",
        *markdown_table(header, rows),
        "",
        *([*(f"{n}  " for n in notes), ""] if notes else []),
        *(
            [*markdown_table(SWEEP_CHECK_HEADER, _check_rows(result)), ""]
            if result["checks"]
            else []
        ),
        SCALING_NOTE.format(data=data_of(result)) + between_runs_note(result),
    ]
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    if is_sweep(result["records"]):
        return _sweep_markdown(result)
    rows, notes = _rows(result)
    lines = [
        f"# dask-gpudirect shuffle benchmark: {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- device: {_device_line(result)}",
        f"- cluster: {_setup_line(result)}",
        f"- command: `{result['command']}`",
        f"- data: {_data_line(result)}",
        "",
        *markdown_table(_header(result), rows),
        "",
    ]
    if notes:
        lines += [*(f"{n}  " for n in notes), ""]
    if result["checks"]:
        lines += [*markdown_table(_check_header(result), _check_rows(result)), ""]
    ledger = _ledger_rows(result)
    if ledger:
        lines += [
            f"{LEDGER_TITLE}:",
            "",
            *markdown_table(_ledger_header(result), ledger),
            "",
        ]
    lines.append(
        f"GB/s per GPU (per worker on the host target): {data_of(result)} bytes / seconds / "
        "workers, the median of the warm runs (best and the first, cold, run beside it); a run "
        "is the whole call until every output partition is in memory. Raw: the buffer's bytes / "
        "the seconds its fetch took as the receiving worker logged it (one GPU sends, one "
        "receives). Targets apply to the device target: dg.shuffle "
        f">= {TARGET_VS_DASK:g}x the faster of Dask's two shuffles and >= {TARGET_VS_RAW:g}x the "
        "raw transfer."
    )
    return "\n".join(lines) + "\n"


def print_result(result: dict) -> None:
    if is_sweep(result["records"]):
        header, rows, notes = _scaling_rows(result)
        title = f"bench shuffle by partition count: {_device_line(result)}, {_setup_line(result)}"
        print_table(
            title,
            header,
            rows,
            [*notes, SCALING_NOTE.format(data=data_of(result)) + between_runs_note(result)],
            right=header[1:],
        )
        if result["checks"]:  # none where dg did not run
            print_table("targets", SWEEP_CHECK_HEADER, _check_rows(result), [], right=("ratio",))
        return
    rows, notes = _rows(result)
    title = f"bench shuffle: {_device_line(result)}, {_setup_line(result)}"
    header = _header(result)
    print_table(title, header, rows, notes, right=header[1:])
    if result["checks"]:
        print_table("targets", _check_header(result), _check_rows(result), [], right=("ratio",))
    ledger = _ledger_rows(result)
    if ledger:
        header = _ledger_header(result)
        print_table(LEDGER_TITLE, header, ledger, [], right=header[2:])
