"""Where cuDF and pyarrow read the same Parquet file differently (issue 15), over the corpus of
``scripts/parquet-corpus.sh``, on a GPU machine: one Markdown row per file that either refuses
or whose values differ. dg's device target reads as cuDF does and its host target as pyarrow
does (the corpus tests check both), so this table is what a user sees change between targets.

    python3 scripts/parquet-corpus-diff.py [.corpus/parquet-testing/data] > diff.md
"""

from __future__ import annotations

import glob
import os
import sys

import pyarrow.parquet as pq


def _outcome(read):
    try:
        return read(), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def _values(column) -> list | None:
    """Python values, or None where Python cannot hold them (dates past 9999)."""
    try:
        return column.to_pylist()
    except OverflowError:
        return None


def _first_difference(a, b) -> str | None:
    if a.column_names != b.column_names:
        return f"columns {a.column_names} vs {b.column_names}"
    if a.num_rows != b.num_rows:
        return f"{a.num_rows} vs {b.num_rows} rows"
    for name in a.column_names:
        x, y = _values(a.column(name)), _values(b.column(name))
        if x is None or y is None:  # compared by Arrow instead
            same = a.column(name).combine_chunks().equals(b.column(name).combine_chunks())
            if not same:
                return f"`{name}` ({a.column(name).type} vs {b.column(name).type}) differs"
            continue
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            if u != v and not (u != u and v != v):  # NaN equals NaN here
                types = f"{a.column(name).type} vs {b.column(name).type}"
                return f"`{name}` ({types}) row {i}: {u!r} vs {v!r}"
    return None


def main(folder: str) -> None:
    import cudf

    rows = []
    files = sorted(glob.glob(os.path.join(folder, "*.parquet")))
    for path in files:
        arrow, arrow_error = _outcome(lambda p=path: pq.read_table(p))
        frame, cudf_error = _outcome(lambda p=path: cudf.read_parquet(p))
        if arrow_error or cudf_error:
            rows.append((path, arrow_error or "reads", cudf_error or "reads", ""))
            continue
        got = frame.to_arrow(preserve_index=False)
        if (diff := _first_difference(arrow, got)) is not None:
            rows.append((path, "reads", "reads", diff))
    print(
        f"{len(files)} files; {len(files) - len(rows)} read alike by pyarrow and cuDF "
        f"{cudf.__version__}; the others:\n"
    )
    print("| file | pyarrow | cuDF | first difference |")
    print("| --- | --- | --- | --- |")
    for path, a, c, diff in rows:
        cells = [os.path.basename(path), a, c, diff]
        print("| " + " | ".join(s.replace("|", "\\|") for s in cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".corpus/parquet-testing/data")
