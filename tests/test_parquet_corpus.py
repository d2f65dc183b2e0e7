"""Issue 15 over a public corpus of unusual Parquet files (apache/parquet-testing, fetched by
``scripts/parquet-corpus.sh``; skipped where it was not): every file pyarrow reads, the host
target reads with the same columns and values, one type per column in meta and partitions;
every file pyarrow refuses is an ``InputError`` that names it. The device target is checked
against ``cudf.read_parquet`` over the same files in ``tests/gpu/test_parquet_corpus_gpu.py``."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from test_parquet_types import _assert_same
from util import NO_CORPUS, assert_refused_by_name, corpus_files, partitions

import dask_gpudirect as dg

FILES = corpus_files()
pytestmark = pytest.mark.skipif(not FILES, reason=NO_CORPUS)


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_a_corpus_file_reads_as_pyarrow_reads_it(tcp, path):
    try:
        expected = pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow refuses the file: dg must refuse it by name
        assert_refused_by_name(tcp, path, "host", exc)
        return
    df = dg.read_parquet(path, target="host", client=tcp)
    parts = partitions(tcp, df)
    for part in parts:
        assert part.dtypes.to_dict() == df.dtypes.to_dict()
    got = tcp.compute(df).result()
    _assert_same(got.reset_index(drop=True), expected.reset_index(drop=True))
