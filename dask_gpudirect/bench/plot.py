"""``--plot out.png`` and ``dask-gpudirect bench plot``: measured GB/s against the ceilings.

Drawn from the result a benchmark writes as JSON, so that a committed result can be drawn again.
One bar per path on a log scale (the paths span three orders of magnitude), each labelled with
its GB/s and its share of the ceiling; the ceilings hatched, with a dashed line across; the
issue's targets (device target only) as red marks on the bar of the path they apply to.
``bench scale`` draws lines instead: GB/s against the GPU count, its ceilings dashed; a
``bench shuffle`` sweep of partition counts, each method's seconds against the count.
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any

import click

from .paths import writable

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INSTALL_HINT = 'plotting needs matplotlib: pip install "dask-gpudirect[plot]"'
COLORS = {"dg": "tab:blue", "baseline": "tab:gray", "ceiling": "white"}
TARGET_COLOR = "tab:red"


def check_matplotlib() -> None:
    """Fail now, before a long run, when the plot could not be drawn at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.UsageError(INSTALL_HINT) from None


def plottable(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """A chart's path, checked at the start, not after the run it would draw: matplotlib is
    there and writes its format (none: PNG), and the place is writable."""
    if path:
        check_matplotlib()
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        ext = os.path.splitext(path)[1][1:].lower()
        if ext and ext not in formats:
            raise click.BadParameter(
                f"{path!r}: matplotlib writes no .{ext} file; use one of {', '.join(formats)}"
            )
    return writable(ctx, param, path)


def draw(result: dict, path: str) -> None:
    """Draw ``result`` (of ``bench read``, ``shuffle``, ``etl`` or ``scale``) to ``path``."""
    check_matplotlib()
    from matplotlib.figure import Figure  # Agg without pyplot: no global backend switched

    from .shuffle_report import is_sweep

    if result["benchmark"] == "scale":
        fig = Figure(figsize=(14, 5), layout="constrained")
        for ax, panel in zip(fig.subplots(1, 2), scale_panels(result), strict=True):
            _draw_lines(ax, panel)
    elif is_sweep(result["records"]):
        fig = Figure(figsize=(7.5, 5), layout="constrained")
        _draw_lines(fig.subplots(), sweep_panel(result))
    else:
        panels = {"read": _read_panels, "etl": _etl_panels}.get(
            result["benchmark"], _shuffle_panels
        )(result)
        by_keys = keys_panel(result) if result["benchmark"] == "etl" else None
        lines = [by_keys] if by_keys else []
        rows = max(len(p["rows"]) for p in panels)
        height = max(1.6 + 0.42 * rows, 5 if lines else 0)
        count = len(panels) + len(lines)
        fig = Figure(figsize=(7.5 * count, height), layout="constrained")
        axes = fig.subplots(1, count, squeeze=False)[0]
        for ax, panel in zip(axes[: len(panels)], panels, strict=True):
            _draw_panel(ax, panel)
        for ax, panel in zip(axes[len(panels) :], lines, strict=True):
            _draw_lines(ax, panel)
    title = f"bench {result['benchmark']}: {result['device']} ({result['target']} target)"
    fig.suptitle(f"{title}, {str(result.get('date', ''))[:10]}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


# --- what to draw ---------------------------------------------------------------------------


def _row(label: str, rec: dict, value: Any, kind: str) -> dict:
    ok = rec["status"] == "ok" and bool(value)  # a log scale has no room for 0
    return {"label": label, "value": value if ok else None, "status": rec["status"], "kind": kind}


def _read_panels(result: dict) -> list[dict]:
    """Warm page cache against the pinned copy, dropped cache against ``dd iflag=direct``."""
    from .read_report import ORDER, label_of

    target = result["target"]
    by = {(r["key"], r["cache"]): r for r in result["records"]}
    panels = []
    for title, caches, ceiling in (
        ("page cache warm", ("-", "warm"), "h2d-pinned"),
        ("page cache dropped", ("cold",), "dd-direct"),
    ):
        rows: list[dict] = []
        index: dict[str, int] = {}
        for key, cache in ORDER:
            rec = by.get((key, cache))
            if rec is None or cache not in caches:
                continue
            kind = "dg" if key.startswith("dg-") else "baseline"
            if key in (ceiling, "h2d-concurrent"):
                kind = "ceiling"
            index[key] = len(rows)
            label = rec.get("label") or label_of(key, target)
            rows.append(_row(label, rec, rec.get("gbps"), kind))
        targets = [
            (index[c["path"]], c["target"] * by[(c["baseline"], c["baseline_cache"])]["gbps"], c)
            for c in result["checks"]
            if c["cache"] in caches and _has_target(c, by[(c["baseline"], c["baseline_cache"])])
        ]
        panels.append(_panel(title, "GB/s (file bytes)", rows, targets))
    return panels


def _shuffle_panels(result: dict) -> list[dict]:
    """GB/s per GPU of each shuffle against the raw single-buffer transfer."""
    from .shuffle_report import METHODS, data_of, label_of

    target, data = result["target"], data_of(result)
    by = {r["key"]: r for r in result["records"]}
    rows: list[dict] = []
    index: dict[str, int] = {}
    for key in METHODS:
        if key in by:
            dg = key in ("gpudirect", "rapidsmpf")
            kind = "ceiling" if key == "raw" else "dg" if dg else "baseline"
            index[key] = len(rows)
            label = label_of(key, target, data)
            rows.append(_row(label, by[key], by[key].get("gbps_per_gpu"), kind))
    targets = [
        (index[c["path"]], c["target"] * by[c["baseline"]]["gbps_per_gpu"], c)
        for c in result["checks"]
        if _has_target(c, by[c["baseline"]])
    ]
    unit = "GB/s per worker" if target == "host" else "GB/s per GPU"
    return [_panel("shuffle", unit, rows, targets)]


def _etl_panels(result: dict) -> list[dict]:
    """One panel per query: each pipeline's Parquet GB/s end to end, dg's target against tasks;
    where ``--keys`` swept the key's cardinality, the group-bys are :func:`keys_panel`'s."""
    from .etl_report import DG_METHODS, METHODS, SCAN, label, queries_of, sweep

    swept = bool(sweep(result)[1])
    panels = []
    for query in queries_of(result):
        if swept and query != SCAN:
            continue
        by = {r["key"]: r for r in result["records"] if r.get("query") == query}
        if not by:  # a result of before the scan was measured
            continue
        rows: list[dict] = []
        index: dict[str, int] = {}
        for key in METHODS:
            if key in by:
                index[key] = len(rows)
                kind = "dg" if key in DG_METHODS else "baseline"
                name = label(key, query, result["target"])
                rows.append(_row(name, by[key], by[key].get("gbps"), kind))
        targets = [
            (index[c["path"]], c["target"] * by[c["baseline"]]["gbps"], c)
            for c in result["checks"]
            if c["check"].startswith(f"{query}:")
            and c.get("path") in index
            and c["baseline"] in by
            and _has_target(c, by[c["baseline"]])
        ]
        panels.append(_panel(query, "GB/s (Parquet file bytes, end to end)", rows, targets))
    return panels


#: ``bench scale``'s lines per panel: (figure of a row, label, line style: ceilings black).
SCALE_LINES = {
    "read": [
        ("binary", "dg.read_binary (aggregate)", "-"),
        ("parquet", "dg.read_parquet (aggregate)", "-"),
        ("pinned_sum", "sum of the pinned copy ceilings", "--"),
        ("pinned_concurrent", "pinned copies, all GPUs at once", ":"),
    ],
    "shuffle": [
        ("dg", "dg.shuffle", "-"),
        ("tasks", "Dask task shuffle", "-"),
        ("p2p", "Dask P2P shuffle", "-"),
        ("raw", "raw worker-to-worker transfer", "--"),
    ],
}


def scale_panels(result: dict) -> list[dict]:
    """The read and shuffle panels of ``bench scale``: per line, (count, GB/s) where measured."""
    unit = "GPUs" if result["target"] == "device" else "workers"
    panels = []
    for bench, title, ylabel in (
        ("read", "read, page cache warm", "GB/s, all workers together"),
        ("shuffle", "shuffle", f"GB/s per {unit[:-1]}"),
    ):
        lines = []
        for field, label, style in SCALE_LINES[bench]:
            points = []
            for row in result["rows"]:
                figures = (row.get(bench) or {}).get("figures") or {}
                cell = figures.get(field)
                if cell and cell["value"]:
                    points.append((row["gpus"], cell["value"]))
            lines.append({"label": label, "style": style, "points": points})
        counts = [row["gpus"] for row in result["rows"]]
        panels.append(
            {"title": title, "xlabel": unit, "ylabel": ylabel, "counts": counts, "lines": lines}
        )
    return panels


def _has_target(check: dict, baseline: dict) -> bool:
    return check["target"] is not None and baseline["status"] == "ok"


def _panel(title: str, unit: str, rows: list[dict], targets: list) -> dict:
    """A panel's rows, its ceiling row's value, and (row, GB/s, text) of each target."""
    roof = next((r["value"] for r in rows if r["kind"] == "ceiling"), None)
    marks = [
        (i, v, f"target >= {c['target']:g}x {c['baseline']}: {c['result']}") for i, v, c in targets
    ]
    return {"title": title, "unit": unit, "rows": rows, "ceiling": roof, "targets": marks}


# --- drawing -------------------------------------------------------------------------------------


def _draw_panel(ax: Axes, panel: dict) -> None:
    rows, roof = panel["rows"], panel["ceiling"]
    values = [r["value"] for r in rows if r["value"]] + [v for _, v, _ in panel["targets"]]
    low = 10 ** math.floor(math.log10(min(values) / 2)) if values else 0.1
    high = max(values) * 300 if values else 10.0  # room for the text right of the bars
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    for y, row in enumerate(rows):
        if row["value"] is None:
            ax.text(low * 1.15, y, row["status"], va="center", fontsize=8, style="italic")
            continue
        ceiling = row["kind"] == "ceiling"
        ax.barh(
            y,
            row["value"] - low,
            left=low,
            color=COLORS[row["kind"]],
            edgecolor="black" if ceiling else "none",
            hatch="//" if ceiling else None,
        )
        text = _figure(row["value"]) + (" (ceiling)" if ceiling else _share(row["value"], roof))
        marks = [(v, t) for i, v, t in panel["targets"] if i == y]
        for value, _ in marks:
            ax.vlines(value, y - 0.4, y + 0.4, color=TARGET_COLOR, linewidth=2.5)
        right = max([row["value"], *(v for v, _ in marks)]) * 1.25
        ax.text(right, y, "\n".join([text, *(t for _, t in marks)]), va="center", fontsize=7.5)
    if roof:
        ax.axvline(roof, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top
    marked = "; red: the issue's targets" if panel["targets"] else ""
    ax.set_xlabel(f"{panel['unit']}, log scale{marked}")
    ax.set_title(panel["title"])
    ax.grid(axis="x", which="major", alpha=0.3)


def sweep_panel(result: dict) -> dict:
    """``bench shuffle --partitions 8,64,...``: each method's seconds against the count."""
    from .shuffle_report import METHODS, counts_of, data_of, label_of

    records = result["records"]
    lines = []
    for key in METHODS:
        mine = [r for r in records if r["key"] == key]
        if mine:
            points = [(r["partitions"], r["seconds"]) for r in mine if r["status"] == "ok"]
            label = label_of(key, result["target"], data_of(result))
            lines.append({"label": label, "style": "-", "points": points})
    return {
        "title": "shuffle of the same bytes by partition count",
        "lines": lines,
        "counts": counts_of(records),
        "xlabel": "input partitions, log scale",
        "ylabel": "seconds (median warm run)",
        "xlog": True,
    }


def keys_panel(result: dict) -> dict | None:
    """``bench etl --keys 1024,65536,...``: each pipeline's seconds against its key's distinct
    values, the nearly unique key's last; None without a sweep."""
    from .etl_report import METHODS, UNIQUE, distinct_keys, label, sweep

    _, rows = sweep(result)
    if not rows:
        return None
    group_bys = [row[0] for row in rows]
    counts = {q: distinct_keys(result, q) for q in group_bys}
    lines = []
    for key in METHODS:
        mine = {r["query"]: r for r in result["records"] if r["key"] == key}
        if any(q in mine for q in group_bys):
            points = [
                (counts[q], mine[q]["seconds"])
                for q in group_bys
                if q in mine and mine[q]["status"] == "ok" and counts[q]
            ]
            lines.append(
                {"label": label(key, UNIQUE, result["target"]), "style": "-", "points": points}
            )
    return {
        "title": "group-by sum by the key's distinct values",
        "lines": lines,
        "counts": sorted({c for c in counts.values() if c}),
        "xlabel": "distinct keys (the last: the nearly unique key), log scale",
        "ylabel": "seconds (median warm run)",
        "xlog": True,
    }


def _draw_lines(ax: Axes, panel: dict) -> None:
    ax.set_yscale("log")
    if panel.get("xlog"):
        ax.set_xscale("log")
    for line in panel["lines"]:
        if not line["points"]:
            ax.plot([], [], label=f"{line['label']}: not measured")
            continue
        xs, ys = zip(*line["points"], strict=True)
        style = {"linestyle": line["style"]}
        if line["style"] != "-":
            style["color"] = "black"
        ax.plot(xs, ys, marker="o", label=line["label"], **style)
        for x, y in line["points"]:
            ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xticks(panel["counts"], [str(c) for c in panel["counts"]])
    ax.set_xlabel(panel["xlabel"])
    ax.set_ylabel(f"{panel['ylabel']}, log scale")
    ax.set_title(panel["title"])
    ax.grid(alpha=0.3)
    # below the axes: inside, the long method names hid the points they name
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)


def _figure(value: float) -> str:
    """A bar's value: two decimals, or three significant digits below 0.1 (not a bare 0.00)."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.3g}"


def _share(value: float, roof: float | None) -> str:
    """`` (72% of ceiling)``; two digits below 10%, where a rounded 0% would hide the gap."""
    if not roof:
        return ""
    share = 100 * value / roof
    return f" ({share:.0f}% of ceiling)" if share >= 10 else f" ({share:.2g}% of ceiling)"


# --- the command ---------------------------------------------------------------------------------


@click.command(name="plot")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False), callback=plottable)
def plot(results: str, out: str) -> None:
    """Draw a bench result (the JSON of `bench read`, `shuffle`, `etl` or `scale`) as a chart
    (PNG where OUT names no format)."""
    not_one = f"{results} is not the JSON of `bench read`, `shuffle`, `etl` or `scale`"
    try:
        with open(results) as f:
            result = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise click.UsageError(f"{not_one}: {exc}") from None
    if not isinstance(result, dict) or result.get("benchmark") not in BENCHMARKS:
        raise click.UsageError(not_one)
    if not os.path.splitext(out)[1]:
        out += ".png"  # what matplotlib writes for a name of no format
    try:
        draw(result, out)
    except (KeyError, TypeError, IndexError) as exc:
        raise click.UsageError(f"{results} lacks what its chart needs ({exc!r})") from None
    click.echo(f"wrote {out}")


#: The benchmarks whose JSON the command draws.
BENCHMARKS = ("read", "shuffle", "etl", "scale")
