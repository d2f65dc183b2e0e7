"""The tables every benchmark prints and writes: Markdown and rich tables, footnotes, verdicts.

A leaf of the bench package: the ``*_report`` modules and ``plot`` import it, and it imports
none of them, so ``common -> plot -> *_report`` does not lead back to ``common``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence


def figure_text(value: float) -> str:
    """A rate or a ratio: two decimals, or two significant digits below 0.1, where 0.00 would
    hide the figure."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


#: What a ratio of first (cold) runs says after it (:func:`comparable`).
FIRST_RUNS = " (first runs)"


def ratio_text(value: float, cold: bool = False) -> str:
    """A ratio with its ``x``, as :func:`figure_text` writes it: a small one is never "0.0x";
    ``cold``: of first runs (:func:`comparable`), which it says."""
    return f"{figure_text(value)}x" + (FIRST_RUNS if cold else "")


def comparable(field: str, *records: dict) -> tuple[str, bool]:
    """Which figure of ``records`` (timed runs' records) to set against each other, like for
    like: ``field``, the median of their warm runs, or ``first_<field>``, their first (cold)
    runs, where any of them has no warm run (a budget, Ctrl-C or ``--repeat 0``): a cold run
    pays once for what warm runs reuse, so a cold figure against a warm one favours the warm
    method. And whether it is the first runs."""
    cold = any(r.get("warm_runs", 1) == 0 for r in records)  # results before it: warm
    return (f"first_{field}" if cold else field), cold


def ratio_of(field: str, top: dict, bottom: dict, *others: dict) -> tuple[float, bool]:
    """``top``'s ``field`` over ``bottom``'s, like for like (:func:`comparable` of the two and
    ``others``: first runs where any of them has no warm run), and whether of first runs."""
    name, cold = comparable(field, top, bottom, *others)
    return top[name] / bottom[name], cold


def check_ratio_text(check: dict, unit: str = "x") -> str:
    """A check's ratio as :func:`judged_text` writes it, with ``unit``, and where it is of first
    runs, that it is; ``-`` where there is none."""
    if check["ratio"] is None:
        return "-"
    text = judged_text(check["ratio"], check["target"], check.get("at_most", False)) + unit
    return text + (FIRST_RUNS if check.get("cold") else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a Markdown table (``|`` in cells escaped)."""
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return lines


def print_table(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    notes: Sequence[str],
    right: Sequence[str] = ("GB/s",),
) -> None:
    """The rich table printed at the end of a run, then its footnotes."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name in header:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console = Console(width=max(140, shutil.get_terminal_size((140, 24)).columns))
    console.print(table)
    for note in notes:
        console.print(note, markup=False, highlight=False)


def footnote(notes: list[str], note: str) -> int:
    """The number of ``note`` among a table's footnotes, added if new."""
    if note not in notes:
        notes.append(note)
    return notes.index(note) + 1


def judged_text(ratio: float, want: float | None, at_most: bool = False) -> str:
    """``ratio`` as :func:`figure_text` writes it, with more decimals where that would round
    it onto the other side of its target (2.996 against ">= 3" is "2.996", not "3.00")."""
    text = figure_text(ratio)
    digits = 2
    while want is not None and judge(float(text), want, at_most) != judge(ratio, want, at_most):
        digits += 1
        text = f"{ratio:.{digits}f}"
    return text


def judge(ratio: float | None, want: float | None, at_most: bool = False) -> str:
    """A target's verdict: ``-`` without a target, ``not run`` without a ratio, else pass/miss
    (``ratio >= want``, or ``ratio <= want`` for a bound ``at_most``)."""
    if want is None:
        return "-"
    if ratio is None:
        return "not run"
    return "pass" if (ratio <= want if at_most else ratio >= want) else "miss"


def between_runs_note(result: dict) -> str:
    """The report's sentence on what came between two timed runs, for results that say."""
    between = result.get("between_runs")
    return f" Between runs: {between}." if between else ""
