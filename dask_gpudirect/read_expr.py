"""The expression of a Parquet read: Dask's ``from_map`` one, which also answers ``len()``.

``dd.read_parquet`` answers ``len(df)`` from the files' statistics, without a task; so does
this read, from the footers its planning already read: where no filter is left to drop rows
after decoding, each partition's rows are the sum of its row groups'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dask.dataframe.dask_expr._expr import Expr, Lengths, Literal
from dask.dataframe.dask_expr._reductions import Len
from dask.dataframe.dask_expr.io.io import FromMapProjectable


class CountedRead(FromMapProjectable):
    """A projectable ``from_map`` read that knows each partition's rows (``lengths``: one per
    partition before any selection of partitions, or None where some are not known)."""

    _parameters = [*FromMapProjectable._parameters, "lengths"]
    _defaults = {**FromMapProjectable._defaults, "lengths": None}

    @classmethod
    def of(cls, read: Expr, lengths: Sequence[int | None]) -> Expr:
        """``read`` (``from_map``'s expression) with ``lengths``, if all are known."""
        if not isinstance(read, FromMapProjectable) or None in lengths:
            return read
        return cls(*read.operands, tuple(lengths))

    def _simplify_up(self, parent: Expr, dependents: Any) -> Expr | None:
        lengths = self.operand("lengths")
        if lengths is not None and isinstance(parent, Lengths | Len):
            if self._filtered:  # df.partitions[...]: those partitions only
                lengths = tuple(lengths[i] for i in self._partitions)
            return Literal(lengths if isinstance(parent, Lengths) else sum(lengths))
        return super()._simplify_up(parent, dependents)
