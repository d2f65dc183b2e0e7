"""How a worker's input rows are grouped by destination, and how received rows become outputs.

Both run on the worker that holds the data, on the data's own device: cuDF and CuPy objects
stay on the GPU, pandas and NumPy on the host. A worker splits its inputs a chunk at a time (as
many consecutive inputs as fit in ``gpudirect.shuffle.chunk-size``), not one input at a time:
``split`` joins the chunk and orders its rows by output partition, and within one output by
input, so the rows bound for one worker are a single slice: one message of a few large buffers
per destination and chunk, whatever the partition count. The chunk's :data:`Cells` (rows of
its ``k``-th input for output ``j``, for each pair that has any) travel with it, so the owner can
put each output's rows back in input order (:func:`assembly_segments`) and the same shuffle gives
the same partitions. With ``keep_order=False`` a target with a faster cut in no set order (the
GPU's) uses it and counts the chunk's rows as its first input's: a cell per output, not per
input and output.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import pandas as pd
from dask.dataframe.dask_expr._shuffle import AssignPartitioningIndex
from dask.dataframe.dask_expr._shuffle import _is_numeric_cast_type as cast_type
from dask.dataframe.utils import strip_unknown_categories

from .. import targets
from ..targets import TargetName


class Splitter(Protocol):
    """What the shuffle needs of a way to cut rows: every worker of a shuffle gets the same one.

    ``split`` orders a chunk's rows by output (and within one output by input) and counts them
    (:data:`Cells`: by output and input, or by output alone, as the chunk's first input's,
    where no input order is kept);
    ``rows`` slices that order; ``owned`` copies a slice into memory of its own (a slice
    holds its whole chunk); ``join`` concatenates pieces; ``outputs`` builds consecutive
    outputs out of the received pieces, given the segments of them (:class:`Segments`) that
    list their rows one output after another, output ``k`` being rows ``bounds[k]`` to
    ``bounds[k + 1]`` of that list, its categorical columns' categories set to
    ``categories``, and empties ``pieces`` (the caller's list) once it has copied them, so a
    group's pieces do not live on beside its copies; ``meta`` is an output with no rows.
    ``categories_of`` gives an input's categories (by column, as pandas Indexes; none where
    no column is categorical) and ``with_categories`` sets a frame's to their union over all
    inputs.
    """

    #: What a progress bar calls the call and its inputs.
    shown_as: ClassVar[tuple[str, str]]

    @property
    def target(self) -> TargetName: ...
    @property
    def meta(self) -> Any: ...

    def split(self, indices: list[int], parts: list) -> tuple[Any, np.ndarray]: ...
    def rows(self, part: Any, start: int, stop: int) -> Any: ...
    def owned(self, rows: Any) -> Any: ...
    def join(self, pieces: list) -> Any: ...
    def outputs(
        self,
        pieces: list,
        segments: Segments,
        bounds: np.ndarray,
        outputs: range,
        categories: dict[Any, pd.Index],
    ) -> list: ...
    def categories_of(self, part: Any) -> dict[Any, pd.Index]: ...
    def with_categories(self, part: Any, categories: dict[Any, pd.Index]) -> Any: ...


def union_categories(inputs: dict[int, dict[Any, pd.Index]]) -> dict[Any, pd.Index]:
    """Each column's categories over all ``inputs`` (input ``i``: its categories by column),
    in input order, each where it first appears, wherever the inputs were: every output holds
    the same (and an output of no rows too). Dask's task shuffle holds the union of the pieces
    of rows that reached an output (its ``_concat`` drops pieces of no rows; an output of no
    rows holds its first piece's): ours does not hang on which inputs sent it rows."""
    by_column: dict[Any, list[pd.Index]] = {}
    for i in sorted(inputs):
        for column, categories in inputs[i].items():
            by_column.setdefault(column, []).append(categories)
    return {c: first.append(rest).unique() for c, (first, *rest) in by_column.items()}


@dataclasses.dataclass(frozen=True)
class HashSplit:
    """Output partition ``j`` gets the rows Dask's own shuffle puts there (``df.shuffle(on,
    npartitions)``): ``on`` names columns, or the index (hashed in its place among them), and
    numbers are hashed as float64 (Dask's ``AssignPartitioningIndex``), so keys of different
    numeric types (int32 on one side of a join, int64 on the other) land in the same partition.
    """

    on: list
    npartitions: int
    target: TargetName
    meta: Any  # an empty partition: what an output partition with no rows looks like
    #: Whether the rows' index labels travel with them; without, every output partition is
    #: labelled 0, 1, 2... (Dask's ``ignore_index=True``) and the index costs no bytes.
    index: bool = True
    #: Whether each output's rows come in input order (the same shuffle, the same partitions);
    #: without, a target that has a faster cut in no set order (the GPU's) uses it.
    keep_order: bool = True
    #: Whether the target's unordered cut (libcudf's ``hash_partition`` of :meth:`hashed`)
    #: sends each row where :meth:`destinations` does.
    unordered_cut: ClassVar[bool] = True
    shown_as: ClassVar[tuple[str, str]] = ("dg.shuffle", "input partitions")

    def __post_init__(self) -> None:
        # an output of no rows holds no category Dask's meta stands in for as unknown (its
        # "__UNKNOWN_CATEGORIES__"): the task shuffle's empty outputs hold the data's
        object.__setattr__(self, "meta", strip_unknown_categories(self.meta))

    def split(self, indices: list[int], parts: list) -> tuple[Any, np.ndarray]:
        module = targets.module(self.target)
        joined = self.join(parts)
        hashed = self.unordered_cut and all(c in self.meta.columns for c in self.on)
        if not self.keep_order and hashed and module.hash_partition is not None:
            cut = module.hash_partition(
                joined, self.on, self.npartitions, self.meta, self.index, self.hashed(joined)
            )
            if cut is not None:  # no input order to keep: the chunk counts as one input
                ordered, sizes = cut
                return ordered, cells_of(sizes[np.newaxis, :])
        lengths = [len(p) for p in parts]
        order, cells = module.group_order(self.destinations(joined), lengths, self.npartitions)
        return module.take_rows(joined, order, self.index), cells

    def hashed(self, joined: Any) -> Any | None:
        """The values the unordered cut hashes in place of ``joined``'s ``on`` columns: numbers
        (by ``meta``'s types) as float64; None where every column is hashed as it is."""
        types = self.meta[self.on].dtypes.items()
        numbers = {c: np.float64 for c, t in types if cast_type(t) and t != np.float64}
        return joined[self.on].astype(numbers, errors="ignore") if numbers else None

    def destinations(self, joined: Any) -> Any:
        """Each row's output partition, a Series of ``joined``'s target: Dask's own function,
        given what ``df.shuffle(on)`` gives it: a column named twice selected twice, not four
        times, and the index hashed where ``on`` names it, as a column in its place (named
        more than once, once, after the columns, as Dask's ``_select_columns_or_index``)."""
        on = [c if c in self.meta.columns else INDEX_KEY for c in self.on]
        if on.count(INDEX_KEY) > 1:
            on = [c for c in on if c != INDEX_KEY] + [INDEX_KEY]
        assigned = AssignPartitioningIndex.operation(
            _keys_of(joined, on),
            on,
            "_partitions",
            self.npartitions,
            _keys_of(self.meta, on),
            False,
        )
        return assigned["_partitions"]

    def rows(self, part: Any, start: int, stop: int) -> Any:
        return part.iloc[start:stop]

    def owned(self, rows: Any) -> Any:
        """``rows`` in memory of their own: a host slice's Arrow columns share the chunk's
        buffers, a device slice its columns."""
        return targets.module(self.target).copied(rows)

    def join(self, pieces: list) -> Any:
        return targets.module(self.target).concat_frames(pieces, self.meta, self.index)

    def outputs(
        self,
        pieces: list,
        segments: Segments,
        bounds: np.ndarray,
        outputs: range,
        categories: dict[Any, pd.Index],
    ) -> list:
        """Every row in output order, its categories set once, then the target cuts that into
        outputs (a gather per output costs cuDF about 1.6 ms: its bounds check alone waits on
        the GPU; the categories set an output at a time cost a copy of them to the host and a
        recoding each). Few segments (pieces from a few large inputs) are copied out of the
        pieces in one concatenate; many (thousands of small inputs) are gathered in one pass
        from the pieces joined."""
        module = targets.module(self.target)
        if module.CUT_COPIES and sum(segments.lengths) >= LONG_SEGMENT * len(segments.lengths):
            return self._each_output(pieces, segments, bounds, categories)
        if len(segments.starts) <= FEW_SEGMENTS:
            ordered = module.concat_slices(pieces, segments.slices(pieces), self.meta, self.index)
            pieces.clear()
        else:
            positions = segments.positions(self.target)
            joined = self.join(pieces)
            pieces.clear()
            ordered = module.take_rows(joined, positions, self.index)
            del joined
        # The pieces, the frame joined of them, the rows in order and the outputs cut from it
        # are each a copy of the group's rows: at most two of them are held at once (on the
        # host, a group of one output of half the rows was four copies at once, where P2P
        # holds two, and its worker passed the nanny's limit)
        return module.cut_frame(self.with_categories(ordered, categories), bounds, self.index)

    def _each_output(
        self,
        pieces: list,
        segments: Segments,
        bounds: np.ndarray,
        categories: dict[Any, pd.Index],
    ) -> list:
        """Each output copied straight out of the pieces, one after another: one copy of the
        group's rows beside the pieces, where joining, ordering and cutting made three, up to
        1.6 of them held at once on the host (a group of one output of half the rows then
        took a worker of 700 MB past its nanny's limit). For long segments only: each costs a
        slice."""
        module = targets.module(self.target)
        built = []
        for part in segments.cut(bounds):
            slices = part.slices(pieces) or [(0, 0, 0)]
            rows = module.concat_owned(pieces, slices, self.meta, self.index)
            built.append(self.with_categories(rows, categories))
            del rows
        pieces.clear()
        return built

    def categories_of(self, part: Any) -> dict[Any, pd.Index]:
        """The categories of ``part``'s unordered categorical columns (an ordered column's
        are its order, the same in every partition)."""
        module = targets.module(self.target)
        return {c: module.categories_of(part[c]) for c in self._unordered_categoricals}

    def with_categories(self, part: Any, categories: dict[Any, pd.Index]) -> Any:
        """``part`` with ``categories`` as its columns' (the codes follow the values): a copy
        where they differ, never ``part`` changed in place."""
        module = targets.module(self.target)
        changed = [
            c for c, cs in categories.items() if not module.categories_of(part[c]).equals(cs)
        ]
        if not changed:
            return part
        part = part.copy(deep=False)  # not the meta, nor an output of no rows shared by many
        for column in changed:
            part[column] = part[column].cat.set_categories(module.as_categories(categories[column]))
        return part

    @functools.cached_property
    def _unordered_categoricals(self) -> list:
        dtypes = self.meta.dtypes.items()
        return [c for c, t in dtypes if str(t) == "category" and not t.ordered]


#: The name ``df.shuffle(on)`` gives the index where ``on`` names it (Dask's ``RearrangeByColumn``).
INDEX_KEY = "_partitions_0"


def _keys_of(frame: Any, on: list) -> Any:
    """The columns of ``frame`` that ``on`` names, each once; its index as :data:`INDEX_KEY`
    where ``on`` names that."""
    keys = frame[[c for c in dict.fromkeys(on) if c != INDEX_KEY]]
    return keys.assign(**{INDEX_KEY: frame.index}) if INDEX_KEY in on else keys


@dataclasses.dataclass(frozen=True)
class AssignedSplit(HashSplit):
    """Output partition ``j`` gets the rows whose column ``on[0]`` holds ``j``: partitions Dask
    has already assigned (the ``_partitions`` column its shuffles add: by divisions for
    ``set_index`` and ``sort_values``, by Dask's hash for the rest)."""

    unordered_cut: ClassVar[bool] = False

    def destinations(self, joined: Any) -> Any:
        return joined[self.on[0]].astype("int64")


@dataclasses.dataclass(frozen=True)
class PermutationSplit:
    """A uniform random permutation of records (axis 0) across all chunks.

    ``counts[i, j]`` records of input chunk ``i`` go to output chunk ``j``: a random
    contingency table with the chunk sizes (``sizes``) as margins (what a uniformly random
    permutation of all records induces), of which each worker draws only the rows of the
    chunks it splits (:func:`contingency_cells`: no table on the client, none shipped). Each
    input chunk is permuted before it is cut, and each output chunk after its pieces are joined
    (in input order), so every order of the records is equally likely; each chunk's order and
    each row of the table are drawn from the seed and the chunk numbers alone, so the same seed
    gives the same order wherever the chunks live. A worker permutes all the chunks it splits
    (or builds) at once, and gathers them in one pass.
    """

    shown_as: ClassVar[tuple[str, str]] = ("dg.shuffle_array", "input chunks")

    seed: int
    sizes: np.ndarray
    target: TargetName
    meta: Any

    def split(self, indices: list[int], parts: list) -> tuple[Any, np.ndarray]:
        for i, part in zip(indices, parts, strict=True):
            # the table's counts follow the chunks the array says: a chunk of other records
            # would lose its extra ones in silence, or take rows it does not have
            says = (int(self.sizes[i]), *self.meta.shape[1:])
            if tuple(part.shape) != says:
                raise ValueError(
                    f"input chunk {i} has shape {tuple(part.shape)} where the array's chunks "
                    f"say {says}: "
                    "a map_blocks that changes the records needs chunks= (or "
                    "arr.compute_chunk_sizes())"
                )
        drawn = contingency_cells(self.seed, self.sizes, indices)
        shuffled = self._permutations(np.array([len(p) for p in parts]), 0, indices)
        grouped, cells = _grouped_by_output(drawn, len(self.sizes), self.target)
        return self.join(parts)[shuffled[grouped]], cells

    def rows(self, chunk: Any, start: int, stop: int) -> Any:
        return chunk[start:stop]

    def owned(self, rows: Any) -> Any:
        return rows.copy()

    def categories_of(self, part: Any) -> dict[Any, pd.Index]:
        return {}  # an array's records have no categories

    def with_categories(self, part: Any, categories: dict[Any, pd.Index]) -> Any:
        return part

    def join(self, pieces: list) -> Any:
        """``pieces`` end to end, in their own dtype: NumPy's concatenate makes big-endian
        numbers native and packs a padded record, so a chunk joined of several pieces
        would differ from one of a single piece, and from the array's dtype."""
        if len(pieces) == 1:
            return pieces[0]
        dtype = pieces[0].dtype
        kept = {} if dtype.isnative and dtype.fields is None else {"dtype": dtype}
        return np.concatenate(pieces, **kept)

    def outputs(
        self,
        pieces: list,
        segments: Segments,
        bounds: np.ndarray,
        outputs: range,
        categories: dict[Any, pd.Index],
    ) -> list:
        """Each output's records permuted on their own, all in one gather; the outputs are
        slices of it (views, as :meth:`HashSplit.outputs`' are)."""
        order = segments.positions(self.target)
        shuffled = self._permutations(np.diff(bounds), 1, outputs)
        joined = self.join(pieces)
        pieces.clear()  # the joined copy and the gathered one, not the pieces besides
        gathered = joined[order[shuffled]]
        del joined
        return [gathered[a:b] for a, b in itertools.pairwise(bounds)]

    def _permutations(self, lengths: np.ndarray, phase: int, chunks: Sequence[int]) -> Any:
        """Positions that permute runs of ``lengths`` records end to end, run ``k`` being
        chunk ``chunks[k]``'s (an input's in phase 0, an output's in phase 1)."""
        seeds = [
            np.random.SeedSequence(self.seed, spawn_key=(phase, c)).generate_state(1, np.uint64)
            for c in chunks
        ]
        seeds_array = np.concatenate(seeds) if seeds else np.empty(0, dtype=np.uint64)
        return targets.module(self.target).permutations(lengths, seeds_array)


def _grouped_by_output(drawn: np.ndarray, n: int, target: TargetName) -> tuple[Any, Cells]:
    """Row positions (on ``target``) that take inputs laid end to end, each already cut into its
    ``n`` outputs in order, to rows grouped by output and, within one, by input; and the cells
    in that order (:data:`Cells`). ``drawn`` lists the non-empty cells ``(input k, output j,
    rows)`` input after input, each output after output: the inputs' runs in the order they
    lie, which a stable sort by output puts output after output, input after input. (Listing
    every cell of a worker's inputs x every output, 8 M at 4,000 chunks of 2 records on two
    workers, cost a transposed copy and a scan of each: 0.25 s of a 0.38 s split.)"""
    k, j, lengths = drawn
    starts = np.cumsum(lengths) - lengths  # the runs lie end to end in that order
    # NumPy's stable sort of 16-bit integers is a radix sort (see ``group_order``)
    by_output = np.argsort(j.astype(np.uint16) if n <= 1 << 16 else j, kind="stable")
    positions = targets.module(target).positions(starts[by_output], lengths[by_output])
    return positions, np.stack([j, k, lengths])[:, by_output]


#: Rows a segment holds on average from which, where the target's cut copies (the host's),
#: :meth:`HashSplit.outputs` copies each output out of the pieces on its own.
LONG_SEGMENT = 1 << 15

#: Segments up to which :meth:`HashSplit.outputs` copies slices of the pieces rather than
#: gathering from their join: each slice costs cuDF about 0.2 ms, the second copy of 1 GiB 5 ms.
FEW_SEGMENTS = 16


@dataclasses.dataclass(frozen=True)
class Segments:
    """Runs of rows of the received pieces joined end to end (run ``s``: rows ``starts[s]`` to
    ``starts[s] + lengths[s]``, none where the length is 0) that, one after another, list the
    outputs' rows in order."""

    starts: np.ndarray
    lengths: np.ndarray

    def cut(self, bounds: np.ndarray) -> list[Segments]:
        """The segments of each output, output ``k`` being rows ``bounds[k]`` to
        ``bounds[k + 1]`` of the list: a segment that runs on into the next output cut in two."""
        ends = np.cumsum(self.lengths)
        out = []
        for a, b in itertools.pairwise(bounds.tolist()):
            first = int(np.searchsorted(ends, a, side="right"))
            last = int(np.searchsorted(ends, b, side="left")) + 1 if b > a else first
            starts = self.starts[first:last].copy()
            lengths = self.lengths[first:last].copy()
            if len(starts):
                skip = a - (int(ends[first]) - int(self.lengths[first]))
                starts[0] += skip
                lengths[0] -= skip
                lengths[-1] -= int(ends[last - 1]) - b
            out.append(Segments(starts, lengths))
        return out

    def positions(self, target: TargetName) -> Any:
        """The row positions the segments list, made on ``target``."""
        return targets.module(target).positions(self.starts, self.lengths)

    def slices(self, pieces: list) -> list[tuple[int, int, int]]:
        """The segments as ``(piece, start, stop)`` rows of the pieces themselves, a segment
        that runs on into the next piece cut in two."""
        ends = np.cumsum([len(p) for p in pieces])
        out = []
        for start, length in zip(self.starts.tolist(), self.lengths.tolist(), strict=True):
            stop = start + length
            while start < stop:
                k = int(np.searchsorted(ends, start, side="right"))
                first = int(ends[k - 1]) if k else 0
                end = min(stop, int(ends[k]))
                out.append((k, start - first, end - first))
                start = end
        return out


def assembly_segments(
    pieces: list[tuple[tuple[int, ...], int, Cells]], outputs: range
) -> tuple[Segments, np.ndarray]:
    """How the received pieces, joined end to end, become the outputs: the segments of them
    that list each output's rows in input order, one output after another, and the rows of
    each of ``outputs``.

    Piece ``(inputs, first, cells)`` holds, output after output (senders cut their pieces at
    the receiver's groups, so ``first`` is ``outputs.start``), the rows its :data:`Cells`
    count, a cell's output counted from ``first`` and its input being ``inputs[k]``; every
    input is in one piece. Each cell is a segment, a run of one input's rows for one output;
    put in output and input order (one stable sort of the pieces' runs, each in that order
    already), they list the outputs. The work follows the non-empty cells, at most one a row,
    not the outputs times the inputs (8.4 M at 4,096 interleaved partitions). Where each
    piece's inputs all come after those of the piece before it (each sender's inputs
    consecutive partitions), a piece's rows for one output are one run already: one segment
    per piece and output. At most :data:`JOINED_SEGMENTS` segments are joined where they
    continue one another, which lets a receiver of few large pieces copy slices of them
    (:data:`FEW_SEGMENTS`)."""
    if any(first != outputs.start or (c[0] >= len(outputs)).any() for _, first, c in pieces):
        raise ValueError(f"pieces must each hold rows for outputs {outputs} alone")
    if all(max(a) < min(b) for (a, _, _), (b, _, _) in itertools.pairwise(pieces)):
        pieces = [((inputs[0],), first, _by_output(cells)) for inputs, first, cells in pieces]
    m = max((max(inputs) for inputs, _, _ in pieces), default=0) + 1
    keys, sizes = [], np.zeros(len(outputs), dtype=np.int64)
    for piece_inputs, _, (j, k, rows) in pieces:
        keys.append(j * m + np.asarray(piece_inputs, dtype=np.int64)[k])  # (output, input)
        sizes += np.bincount(j, weights=rows, minlength=len(outputs)).astype(np.int64)
    # the pieces' cells are runs of their rows laid end to end, as the pieces are joined
    length = np.concatenate([cells[2] for _, _, cells in pieces])
    start = np.cumsum(length) - length
    # a piece's cells are in (output, input) order already: the stable sort merges the runs
    order = np.argsort(np.concatenate(keys), kind="stable")
    start, length = start[order], length[order]
    if len(start) > JOINED_SEGMENTS or not len(start):
        return Segments(start, length), sizes
    new = np.ones(len(start), dtype=bool)
    np.not_equal(start[1:], start[:-1] + length[:-1], out=new[1:])
    firsts = np.flatnonzero(new)  # of each run of segments joined into one
    return Segments(start[firsts], np.add.reduceat(length, firsts)), sizes


#: A table of how many rows of each input of a chunk go to each output, by its non-empty
#: cells: ``cells[:, s]`` is ``(output j, input k, rows)``, the ``k``-th input of the chunk,
#: in output order and within one output in input order (the order of the split rows). It
#: grows with the rows (at most a cell a row), not with the inputs times the outputs (4,096 x
#: 8,192 int64 cells are 256 MiB).
Cells = np.ndarray


def cells_of(counts: np.ndarray) -> Cells:
    """The :data:`Cells` of a whole table, ``counts[k, j]`` rows of input ``k`` for output ``j``."""
    j, k = np.nonzero(counts.T)
    return np.stack([j, k, counts.T[j, k]]).astype(np.int64, copy=False)


def output_rows(cells: Cells, n: int) -> np.ndarray:
    """The rows of each of ``n`` outputs that ``cells`` count."""
    return np.bincount(cells[0], weights=cells[2], minlength=n).astype(np.int64)


def cells_for(cells: Cells, outputs: range) -> Cells:
    """The cells of ``outputs`` (a run of outputs), each output counted from ``outputs.start``:
    a piece's, in memory of its own."""
    a, b = np.searchsorted(cells[0], [outputs.start, outputs.stop])
    piece = cells[:, a:b].copy()
    piece[0] -= outputs.start
    return piece


def _by_output(cells: Cells) -> Cells:
    """``cells`` summed over the inputs: each output's rows, as the first input's."""
    firsts = np.flatnonzero(np.diff(cells[0], prepend=-1))
    rows = np.add.reduceat(cells[2], firsts) if len(firsts) else cells[2, :0]
    return np.stack([cells[0, firsts], np.zeros_like(firsts), rows])


#: Segments up to which :func:`assembly_segments` joins those that continue one another: where
#: there are more, the many inputs interleave, few join, and the pass costs about as much as
#: the rest (5 of 10-14 ms at 1024 partitions on the CPU).
JOINED_SEGMENTS = 1 << 12


#: NumPy's multivariate hypergeometric draw (``marginals``) takes fewer items than this.
MAX_RECORDS = 10**9

#: A node of :func:`contingency_cells`' tree of at most this many records, and at most
#: :data:`PERMUTE_BELOW` times its non-empty outputs times the levels below it, is drawn as a
#: random order of its records (about 20 ns a record) rather than split on down (about 0.7 us
#: an output a node: NumPy's hypergeometric draws); labels of this many records take 128 MiB.
PERMUTED_RECORDS = 1 << 24
PERMUTE_BELOW = 16


def contingency_cells(seed: int, sizes: Any, rows: Any) -> np.ndarray:
    """Rows ``rows`` (input chunks, in that order) of the table of how many records of each
    input chunk go to each output chunk (the same sizes both ways), drawn without the others,
    by their non-empty cells: ``(k, j, records)`` for the ``k``-th of ``rows`` and output
    ``j``, input after input and within one output after output.

    A fixed binary tree over the chunk numbers: each node holds how many of its chunks'
    records go to each output, split between its two halves by one multivariate
    hypergeometric draw. That is how a uniform permutation splits them: the table's rows
    summed over a group are the grouped table's, and given those, each group's rows are again
    a uniform permutation's table. A node's draw comes from the seed and the node alone, so
    any worker that descends to a leaf gets the same row; one that needs ``k`` rows visits
    about ``2 k + log2(chunks)`` nodes, each costing its non-empty outputs (at most its
    records), rather than the whole ``chunks x chunks`` table. Memory follows the cells drawn:
    a dense row of every output per chunk took 8 bytes x rows x chunks (64 MB a worker at
    4,000 chunks of 2 records on two workers, 10 GB at 50,000)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    wanted = np.unique(rows)
    found = [np.empty((3, 0), dtype=np.int64)]  # (index in wanted, output, records)
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    # (first chunk, past the last, the node's non-empty outputs, their counts, wanted[a:b]);
    # the left half is taken first, so the cells are found wanted chunk after wanted chunk
    stack = [(0, n, np.flatnonzero(sizes), sizes[sizes > 0], 0, len(wanted))] if n else []
    while stack:
        lo, hi, which, counts, a, b = stack.pop()
        if a == b:
            continue
        if hi - lo == 1:
            found.append(np.stack([np.full(len(which), a), which, counts]))
            continue
        total = int(prefix[hi] - prefix[lo])
        levels = (hi - lo - 1).bit_length()
        if total <= PERMUTED_RECORDS and total <= PERMUTE_BELOW * len(which) * levels:
            # the node's records, each labelled by its output, in a random order, cut into
            # its chunks: the same law, in a few vectorised passes rather than a draw a node
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3, lo, hi)))
            labels = rng.permutation(np.repeat(which, counts))
            mine = wanted[a:b]
            lengths = sizes[mine]
            places = targets.module("host").positions(prefix[mine] - prefix[lo], lengths)
            cells = np.repeat(np.arange(a, b, dtype=np.int64) * n, lengths) + labels[places]
            keys, records = np.unique(cells, return_counts=True)
            found.append(np.stack([keys // n, keys % n, records]))
            continue
        mid = (lo + hi) // 2
        left_total = int(prefix[mid] - prefix[lo])
        if left_total == 0:
            left = np.zeros_like(counts)
        elif left_total == total:
            left = counts
        else:
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, lo, hi)))
            left = rng.multivariate_hypergeometric(counts, left_total)
        right = counts - left
        m = a + int(np.searchsorted(wanted[a:b], mid))
        stack.append((mid, hi, which[right > 0], right[right > 0], m, b))
        stack.append((lo, mid, which[left > 0], left[left > 0], a, m))
    drawn = np.concatenate(found, axis=1)
    # each of ``rows`` takes its chunk's run of cells (a chunk may be asked for twice)
    per_chunk = np.bincount(drawn[0], minlength=len(wanted))
    chunk = np.searchsorted(wanted, rows)
    taken = targets.module("host").positions(
        (np.cumsum(per_chunk) - per_chunk)[chunk], per_chunk[chunk]
    )
    k = np.repeat(np.arange(len(rows), dtype=np.int64), per_chunk[chunk])
    return np.stack([k, *drawn[1:, taken]])
