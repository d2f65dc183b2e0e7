"""What ``bench read`` makes of its records: the targets judged, and the table and Markdown.

Kept apart from the measurements so that a result (a run's JSON, a committed one included) can be
judged and rendered again without measuring anything.
"""

from __future__ import annotations

from .tables import check_ratio_text, footnote, judge, markdown_table, print_table

LABELS = {
    "h2d-pinned": {"device": "pinned host->device copy (ceiling)"},
    "h2d-concurrent": {"device": "pinned host->device copies, all GPUs at once"},
    "naive": {"device": "open().read() + cupy.asarray", "host": "open().read()"},
    "cudf-default": {
        "device": "cudf.read_parquet per file (defaults)",
        "host": "pyarrow.parquet.read_table per file",
    },
    "cudf-tuned": {"device": "cudf.read_parquet per file (KVIKIO_NTHREADS=16)"},
    "dask-default": {
        "device": "dask_cudf.read_parquet(dir).persist()",
        "host": "dask.dataframe.read_parquet(dir).persist()",
    },
    "dd-direct": {"device": "dd iflag=direct (disk ceiling)", "host": "dd iflag=direct (disk)"},
    "dg-binary": {
        "device": "dg.read_binary(dir).persist()",
        "host": "dg.read_binary(dir).persist()",
    },
    "dg-parquet": {
        "device": "dg.read_parquet(dir).persist()",
        "host": "dg.read_parquet(dir).persist()",
    },
}
#: A baseline's name in a ratio where its key names another target's: on the host target
#: ``cudf-default`` is pyarrow's read.
SHORT = {"cudf-default": {"host": "pyarrow"}}
#: Table order.
ORDER = [
    ("h2d-pinned", "-"),
    ("h2d-concurrent", "-"),  # only with several workers
    ("naive", "warm"),
    ("cudf-default", "warm"),
    ("cudf-tuned", "warm"),
    ("dask-default", "warm"),
    ("dg-binary", "warm"),
    ("dg-parquet", "warm"),
    ("dd-direct", "cold"),
    ("naive", "cold"),
    ("cudf-default", "cold"),
    ("cudf-tuned", "cold"),
    ("dask-default", "cold"),
    ("dg-binary", "cold"),
    ("dg-parquet", "cold"),
]
#: (path, cache) measured against (baseline, cache), with the issue's target ratio on the device
#: target; on the host target the same ratios are shown without a target.
CHECKS = [
    ("dg-binary", "warm", "h2d-pinned", "-", 0.85),
    ("dg-binary", "warm", "h2d-concurrent", "-", None),
    ("dg-binary", "warm", "naive", "warm", None),
    ("dg-parquet", "warm", "cudf-tuned", "warm", 1.0),
    ("dg-parquet", "warm", "cudf-default", "warm", None),
    ("dg-parquet", "warm", "dask-default", "warm", 2.0),
    ("dg-binary", "cold", "dd-direct", "cold", 1.5),
    ("dg-parquet", "cold", "dd-direct", "cold", 1.5),
]
#: Baselines measured in one process on one GPU: with several workers a target against them
#: would compare N GPUs with one, so those ratios are shown without a target.
ONE_GPU = {"naive", "cudf-default", "cudf-tuned"}


def checks_of(records: list[dict], target: str, workers: int = 1) -> list[dict]:
    by = {(r["key"], r["cache"]): r for r in records}
    out = []
    for key, cache, base, base_cache, factor in CHECKS:
        rec, ref = by.get((key, cache)), by.get((base, base_cache))
        if rec is None or ref is None:
            continue
        one_gpu = workers > 1 and base in ONE_GPU
        want = factor if target == "device" and not one_gpu else None
        if want is None and ref.get("status") != "ok":
            continue  # on the host target, ratios only against baselines that ran
        ratio = None
        if rec.get("gbps") and ref.get("gbps"):
            ratio = rec["gbps"] / ref["gbps"]
        verdict = judge(ratio, want)
        out.append(
            {
                "path": key,
                "cache": cache,
                "baseline": base,
                "baseline_cache": base_cache,
                "ratio": ratio,
                "target": want,
                "result": verdict,
            }
        )
    return out


def label_of(key: str, target: str) -> str:
    return LABELS[key].get(target) or LABELS[key]["device"]


def _rows(result: dict) -> tuple[list[tuple[str, ...]], list[str]]:
    """Table rows (path, cache, GB/s, ratio vs baseline, target, result) and footnotes."""
    target = result["target"]
    by = {(r["key"], r["cache"]): r for r in result["records"]}
    checks: dict[tuple[str, str], list[dict]] = {}
    for c in result["checks"]:
        checks.setdefault((c["path"], c["cache"]), []).append(c)
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for key, cache in ORDER:
        rec = by.get((key, cache))
        if rec is None:
            continue
        label = rec.get("label") or label_of(key, target)
        if rec["status"] == "ok" and rec.get("gbps") is not None:
            speed = f"{rec['gbps']:.2f}"
        else:
            speed = f"{rec['status']} [{footnote(notes, rec.get('note') or 'no reason given')}]"
        cells: list[dict | None] = list(checks.get((key, cache), [])) or [None]
        for i, c in enumerate(cells):
            first = i == 0
            head = (label, cache, speed) if first else ("", "", "")
            if c is None:
                rows.append((*head, "", "", ""))
                continue
            base = SHORT.get(c["baseline"], {}).get(target, c["baseline"])
            ratio = "-" if c["ratio"] is None else f"{check_ratio_text(c)} {base}"
            want = f">= {c['target']:.2f}x" if c["target"] is not None else "-"
            rows.append((*head, ratio, want, c["result"]))
    return rows, [f"[{i + 1}] {n}" for i, n in enumerate(notes)]


HEADER = ("path", "cache", "GB/s", "ratio vs baseline", "target", "result")


def markdown(result: dict) -> str:
    lines = [
        f"# dask-gpudirect read benchmark: {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- device: {result['device']} (target `{result['target']}`)",
        f"- command: `{result['command']}`",
        f"- data: {_data_line(result)}",
        f"- page cache: {result.get('page_cache', 'not reached')}",
        *_workers_lines(result),
        "",
    ]
    rows, notes = _rows(result)
    lines.extend(markdown_table(HEADER, rows))
    lines.append("")
    lines.extend(f"{n}  " for n in notes)
    lines.append("")
    lines.append(
        "GB/s are file bytes per second (Parquet: compressed bytes on disk). Targets apply to the "
        "device target: binary warm >= 0.85x the pinned copy ceiling; Parquet >= 1.0x tuned "
        "cudf.read_parquet and >= 2x dask_cudf defaults; dropped cache >= 1.5x dd iflag=direct."
    )
    if result["options"]["workers"] > 1:
        lines += ["", MULTI_WORKER_NOTE]
    return "\n".join(lines) + "\n"


MULTI_WORKER_NOTE = (
    "With several workers (one per GPU) every GB/s is the aggregate of all of them, reading "
    "their own shards at once. The ceiling row is the sum of the GPUs' pinned copy ceilings, each "
    "measured alone, and the binary target is judged against it; the row after it is all GPUs "
    "copying at once, which shows how much of the sum the host's memory and PCIe links allow. "
    "The single-process baselines (naive, cudf.read_parquet per file) use one GPU: ratios "
    "against them carry no target."
)


def _workers_lines(result: dict) -> list[str]:
    """Markdown lines of a run with several workers: the GPUs and how placement spread bytes."""
    if result["options"]["workers"] == 1:
        return []
    per = "one per GPU" if result["target"] == "device" else "worker processes"
    lines = [f"- workers: {result['options']['workers']}, {per}"]
    devices = result.get("devices")
    if devices:
        lines[0] += " (" + ", ".join(f"{d['device']}: {d['name']}" for d in devices) + ")"
    for key, spread in sorted((result.get("balance") or {}).items()):
        if spread.get("max_over_mean"):
            gbs = ", ".join(f"{b / 1e9:.3g}" for b in spread["bytes_per_worker"].values())
            parts = ", ".join(map(str, spread["partitions_per_worker"].values()))
            lines.append(
                f"- placement of {key}: GB per worker {gbs} (max/mean "
                f"{spread['max_over_mean']:.2f}); partitions per worker {parts}"
            )
    return lines


def _data_line(result: dict) -> str:
    d = result.get("data") or {}
    parts = []
    if d.get("binary"):
        b = d["binary"]
        parts.append(f"binary {b['bytes'] / 1e9:.2f} GB in {b['files']} .npy files")
    if d.get("parquet"):
        p = d["parquet"]
        parts.append(
            f"Parquet {p['bytes'] / 1e9:.2f} GB, {p['rows']} rows, {p['row_groups']} row groups "
            f"in {p['files']} files"
        )
    return "; ".join(parts) + f" on {d.get('filesystem', '?')}"


def print_result(result: dict) -> None:
    rows, notes = _rows(result)
    title = f"bench read: {result['device']} ({result['target']} target)"
    if result["options"]["workers"] > 1:
        title += f", {result['options']['workers']} workers"
    print_table(title, HEADER, rows, notes)
