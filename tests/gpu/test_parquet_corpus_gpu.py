"""Issue 15 on the device target over the public corpus (``scripts/parquet-corpus.sh``; carry
``.corpus`` to the GPU machine): every file ``cudf.read_parquet`` reads, ``dg.read_parquet``
reads with the same columns, types and values, one type per column in meta and partitions;
every file cuDF refuses is an ``InputError`` that names it, never another exception or a
silent difference. The host target's side is ``tests/test_parquet_corpus.py``."""

from __future__ import annotations

import os

import dask
import gpu_helpers as h
import pyarrow as pa
import pytest
from util import NO_CORPUS, assert_refused_by_name, corpus_files

import dask_gpudirect as dg

FILES = corpus_files()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not FILES, reason=NO_CORPUS)]


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_a_corpus_file_reads_as_cudf_reads_it(cuda_tcp, path):
    import cudf

    try:
        expected = cudf.read_parquet(path)
    except Exception as exc:  # cuDF refuses the file: dg must refuse it by name
        assert_refused_by_name(cuda_tcp, path, "device", exc)
        return
    df = dg.read_parquet(path, target="device", client=cuda_tcp)
    types = {c: str(t) for c, t in df.dtypes.items()}
    parts = [dask.delayed(h.described)(part) for part in df.to_delayed()]
    described = cuda_tcp.gather(cuda_tcp.compute(parts))
    for part_types, _ in described:
        assert part_types == types
    assert types == {c: str(t) for c, t in expected.dtypes.items()}
    got = pa.concat_tables([table for _, table in described])
    h.assert_same_table(got, h.cudf_to_arrow(expected))
