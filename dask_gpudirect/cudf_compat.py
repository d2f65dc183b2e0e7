"""A fix for cuDF 26.10 under pandas 3, applied where the device target is imported.

``cudf.StructDtype.serialize`` writes each plain field's ``dtype.str``, which pandas 3's
``StringDtype`` lacks: a frame whose structs hold strings (as Spark and Impala write maps and
lists of structs) can then neither be pickled nor sent by Dask, so it could not be gathered,
spilled or shuffled. Here a struct type travels as its Arrow type, which holds every field type
exactly, and is rebuilt from it. Applied only where the bug shows, so a fixed cuDF is left as is.
"""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa


def _serialize(self: Any) -> tuple[dict, list]:
    return {"arrow": pickle.dumps(self.to_arrow()), "frame_count": 0}, []


def _deserialize(cls: Any, header: dict, frames: list) -> Any:
    return cls.from_arrow(pickle.loads(header["arrow"]))


def _broken(struct_dtype: Any) -> bool:
    try:
        struct_dtype.from_arrow(pa.struct({"s": pa.string()})).serialize()
    except AttributeError:
        return True
    return False


def patch_struct_serialization() -> None:
    """Make struct columns holding strings serializable (see the module's docstring)."""
    import cudf

    if _broken(cudf.StructDtype):
        cudf.StructDtype.serialize = _serialize
        cudf.StructDtype.deserialize = classmethod(_deserialize)
