"""The data the benches read: ``.npy`` shards and snappy Parquet datasets, written once.

Kept apart from the measurements so that what is read (its sizes, layout and the manifest that
lets a later run reuse it) is in one place; nothing here is timed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import click

from .common import GIB, log

#: .npy shards: float32 records of 256 values (1 KiB each).
BINARY_DTYPE, BINARY_RECORD = "<f4", (256,)
#: Parquet: on-disk bytes per row of (int64 id, float64 x, float64 y, int32 k), snappy.
PARQUET_BYTES_PER_ROW = 24
PARQUET_ROW_GROUP = 1 << 20
#: ``bench etl``'s Parquet: bytes per row in memory of one key column, the unique key, x, y and
#: z (the rows of ``--gib``; each more key count of a sweep adds a column of 8 bytes a row).
ETL_BYTES_PER_ROW = 40
DATA_VERSION = 2
#: What a dataset's folder holds besides its files ('_' files are skipped by every reader).
MANIFEST = "_bench.json"
#: The names of the files a dataset writes.
_WRITTEN = re.compile(r"part-\d{3,}\.(npy|parquet)")


def key_column(keys: int) -> str:
    """``bench etl``'s column of int64 keys over ``[0, keys)``."""
    return f"keys_{keys}"


def etl_columns(keys: Sequence[int]) -> str:
    """``bench etl``'s columns, as its results describe them."""
    many = ", ".join(f"{key_column(n)} int64 over [0, {n})" for n in keys)
    return f"{many}, unique int64 over [0, 2^62), x float64, y float64, z int64"


def _write_npy(path: str, nbytes: int, seed: int) -> None:
    import numpy as np

    dtype = np.dtype(BINARY_DTYPE)
    record_bytes = dtype.itemsize * math.prod(BINARY_RECORD)
    rows = max(1, nbytes // record_bytes)
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": (rows, *BINARY_RECORD),
    }
    chunk = np.random.default_rng(seed).random((16 << 20) // dtype.itemsize, dtype=np.float32)
    view = chunk.data.cast("B")
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        left = rows * record_bytes
        while left:
            n = min(left, len(view))
            f.write(view[:n])
            left -= n


def _write_parquet(path: str, rows: int, first_id: int, seed: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema(
        [("id", pa.int64()), ("x", pa.float64()), ("y", pa.float64()), ("k", pa.int32())]
    )
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        for start in range(0, rows, PARQUET_ROW_GROUP):
            n = min(PARQUET_ROW_GROUP, rows - start)
            table = pa.table(
                {
                    "id": np.arange(first_id + start, first_id + start + n, dtype=np.int64),
                    "x": rng.random(n),
                    "y": rng.standard_normal(n),
                    "k": rng.integers(0, 1000, n, dtype=np.int32),
                },
                schema=schema,
            )
            writer.write_table(table, row_group_size=PARQUET_ROW_GROUP)


def _write_etl_parquet(path: str, rows: int, seed: int, keys: Sequence[int]) -> int:
    """One file of ``bench etl``: a key column of each count of ``keys`` values, a nearly unique
    key, x, y, z; returns the sum of z, which every query's result must add up to."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    first, *more = keys  # drawn first, as when a dataset had one key column
    columns = {key_column(first): rng.integers(0, first, rows, dtype=np.int64)}
    unique = rng.integers(0, 1 << 62, rows, dtype=np.int64)
    x, y = rng.random(rows), rng.standard_normal(rows)
    z = rng.integers(0, 1000, rows, dtype=np.int64)
    columns.update({key_column(n): rng.integers(0, n, rows, dtype=np.int64) for n in more})
    table = pa.table({**columns, "unique": unique, "x": x, "y": y, "z": z})
    pq.write_table(table, path, compression="snappy", row_group_size=PARQUET_ROW_GROUP)
    return int(table["z"].to_numpy().sum())


def _make_room(directory: str) -> None:
    """``directory`` made, or emptied of the files an earlier dataset of the bench wrote there
    (its manifest says it is the bench's); a folder of anything else is refused, never
    emptied: ``--dir .`` must not delete a user's files."""
    os.makedirs(directory, exist_ok=True)
    names = os.listdir(directory)
    if names and MANIFEST not in names:
        raise click.ClickException(
            f"{directory} holds files the bench did not write (it has no {MANIFEST}): give "
            "--dir a new or empty folder"
        )
    for name in names:
        if name == MANIFEST or _WRITTEN.fullmatch(name):
            os.remove(os.path.join(directory, name))


def _bench_of(kind: str) -> str:
    return "etl" if kind == "etl" else "read"


def dataset(
    directory: str, kind: str, gib: float, files: int, keys: Sequence[int] = ()
) -> tuple[list[str], dict]:
    """Files of one dataset under ``directory``: reused when its manifest matches, else written.

    ``kind`` is ``binary``, ``parquet`` (``bench read``) or ``etl`` (``bench etl``, with a key
    column of each count of ``keys`` values)."""
    spec = {"version": DATA_VERSION, "kind": kind, "gib": gib, "files": files}
    if kind == "etl":
        spec["keys"] = list(keys)
    ext = ".npy" if kind == "binary" else ".parquet"
    paths = [os.path.join(directory, f"part-{i:03d}{ext}") for i in range(files)]
    manifest = os.path.join(directory, MANIFEST)
    with contextlib.suppress(OSError, ValueError):
        with open(manifest) as f:
            old = json.load(f)
        if old.get("spec") == spec and all(os.path.isfile(p) for p in paths):
            log(_bench_of(kind), f"reusing {kind} data in {directory}")
            return paths, old["info"]
    _make_room(directory)
    target = int(gib * GIB)
    start = time.perf_counter()
    jobs: list[Future[Any]]
    with ThreadPoolExecutor(max(1, min(files, os.cpu_count() or 1))) as pool:
        if kind == "binary":
            jobs = [pool.submit(_write_npy, p, target // files, i) for i, p in enumerate(paths)]
        elif kind == "etl":
            assert keys, "an etl dataset takes keys"
            rows = max(1, target // ETL_BYTES_PER_ROW // files)
            jobs = [
                pool.submit(_write_etl_parquet, p, rows, 1000 + i, keys)
                for i, p in enumerate(paths)
            ]
        else:
            rows = max(1, target // PARQUET_BYTES_PER_ROW // files)
            jobs = [
                pool.submit(_write_parquet, p, rows, i * rows, 1000 + i)
                for i, p in enumerate(paths)
            ]
        written = [job.result() for job in jobs]
    os.sync()  # written back now, so that later drops are quick and warm runs see clean pages
    info: dict[str, Any] = {"bytes": sum(os.path.getsize(p) for p in paths), "files": files}
    if kind == "binary":
        import numpy as np

        record_bytes = np.dtype(BINARY_DTYPE).itemsize * math.prod(BINARY_RECORD)
        info.update(
            dtype=BINARY_DTYPE,
            record_shape=list(BINARY_RECORD),
            records=files * max(1, target // files // record_bytes),
        )
    else:
        import pyarrow.parquet as pq

        metas = [pq.ParquetFile(p).metadata for p in paths]
        info.update(
            rows=sum(m.num_rows for m in metas),
            row_groups=sum(m.num_row_groups for m in metas),
            columns=etl_columns(keys)
            if kind == "etl"
            else "id int64, x float64, y float64, k int32",
            compression="snappy",
        )
        if kind == "etl":
            info["z_sum"] = sum(written)
    info["write_seconds"] = round(time.perf_counter() - start, 2)
    with open(manifest, "w") as f:
        json.dump({"spec": spec, "info": info}, f)
    log(_bench_of(kind), f"wrote {kind} data: {info['bytes'] / 1e9:.2f} GB in {files} files")
    return paths, info


def filesystem(path: str) -> str:
    """The mount type holding ``path`` (``ext4``, ``tmpfs``...), from /proc/mounts."""
    path, best, fstype = os.path.realpath(path), "", "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and (
                    path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")
                ):
                    if len(parts[1]) >= len(best):
                        best, fstype = parts[1], parts[2]
    return fstype
