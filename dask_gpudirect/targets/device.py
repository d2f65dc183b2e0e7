"""Device target: ``kvikio.CuFile.pread`` into an ``rmm.DeviceBuffer``; pylibcudf decodes Parquet.

kvikio uses GDS (one DMA copy) where nvidia-fs is loaded and its compat mode (POSIX read into
pinned bounce buffers, then host-to-device: two copies) elsewhere; the ledger records which.
"""

from __future__ import annotations

import cupy
import kvikio
import kvikio.defaults
import pyarrow as pa
import pylibcudf as plc
import rmm
from dask.utils import parse_bytes

from . import Target


def empty_frame(table: pa.Table):
    """The cuDF partition type for ``table``'s schema (a collection's ``meta``)."""
    import cudf

    return cudf.DataFrame.from_arrow(table)


def empty_array(dtype, ndim: int):
    return cupy.empty((0,) * ndim, dtype=dtype)


def configure_kvikio(options) -> str:
    """Set kvikio's threads, task size and compat mode; return the route reads will take."""
    kvikio.defaults.set(
        {
            "num_threads": int(options["threads"]),
            "task_size": parse_bytes(options["task_size"]),
            "compat_mode": kvikio.CompatMode[str(options["compat_mode"]).upper()],
        }
    )
    return "kvikio-compat" if kvikio.defaults.is_compat_mode_preferred() else "gds"


class DeviceTarget(Target):
    name = "device"

    def __init__(self, options, ledger):
        super().__init__(options, ledger)
        self.route = configure_kvikio(options)

    def _read(self, shard):
        buffer = rmm.DeviceBuffer(size=shard.size)
        view = cupy.asarray(buffer)
        with kvikio.CuFile(shard.path, "r") as f:
            futures = [
                f.pread(view[offset - shard.base : offset - shard.base + length], length, offset)
                for offset, length in shard.ranges
                if length
            ]
            nread = sum(fut.get() for fut in futures)
        return buffer, nread

    def decode_parquet(self, buffer, row_groups, columns):
        import cudf

        options = plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo([buffer])).build()
        options.set_column_names(columns)
        options.set_row_groups([row_groups])
        return cudf.DataFrame.from_pylibcudf(plc.io.parquet.read_parquet(options))

    def as_array(self, buffer, dtype, shape, order):
        return cupy.asarray(buffer).view(dtype).reshape(shape, order=order)


TARGET = DeviceTarget
