"""Reads of two datasets that Dask fuses into one task (``dd.concat([a, b], axis=1)``,
``a.x + b.y`` persisted or turned into an array): the task loads shards placed apart.

One cluster of two workers, made two "nodes" by ``gpudirect.allowed-roots``: worker A sees
the first dataset alone, worker B both (a shared one and a node-local one), or B the second
alone (two node-local datasets).

- where one worker found every file the task loads, it runs there and the result is whole
  (it was pinned to the first shard's worker, which could not read the other dataset, and
  failed saying, wrongly, that the worker placement chose had left the cluster);
- where no worker found them all, it fails at once naming both files and the way out
  (persisting each read), and that way works.
"""

from __future__ import annotations

import sys

import cloudpickle
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client
from util import start_cluster

import dask_gpudirect as dg
from dask_gpudirect.placement import _shards_of

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# dd.concat(axis=1) of frames of unknown divisions: these are aligned, file by file
pytestmark = pytest.mark.filterwarnings("ignore:Concatenating dataframes with unknown divisions")

FILES, ROWS = 4, 100


def set_roots(roots: list[str]) -> None:
    dask.config.set({"gpudirect.allowed-roots": roots})


def write(directory, column: str) -> str:
    directory.mkdir()
    for k in range(FILES):
        ids = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        pq.write_table(pa.table({column: ids}), directory / f"{column}-{k}.parquet")
    return str(directory)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("fused")
    first, second = write(base / "first", "x"), write(base / "second", "y")
    cluster = start_cluster("tcp", n_workers=2, threads=1)
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(2)
    with client.as_current():  # collection.persist() fuses, as client.compute() does not
        yield client, first, second
    client.close()
    cluster.close()


def roots(client, a: list[str], b: list[str]) -> None:
    worker_a, worker_b = sorted(client.nthreads())
    client.run(set_roots, a, workers=[worker_a])
    client.run(set_roots, b, workers=[worker_b])


def expected() -> pd.DataFrame:
    ids = np.arange(FILES * ROWS, dtype=np.int64)
    return pd.DataFrame({"x": ids, "y": ids})


def test_fused_reads_run_on_the_worker_that_found_every_file(two_nodes):
    client, first, second = two_nodes
    roots(client, [first], [first, second])  # B sees both, A the first alone
    a = dg.read_parquet(first, client=client)
    b = dg.read_parquet(second, client=client)
    both = dd.concat([a, b], axis=1)
    # the reads are one task (fused), whose shards were placed on both workers
    loads = [_shards_of(t) for t in dict(both.optimize().__dask_graph__()).values()]
    fused = [shards for shards in loads if len(shards) == 2]
    assert len(fused) == FILES
    assert len({shard.worker for shards in fused for shard in shards}) == 2
    got = client.compute(both.persist(), sync=True)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected())
    total = client.compute((a.x + b.y).values.sum(), sync=True)
    assert int(total) == 2 * expected().x.sum()


def test_fused_reads_no_worker_can_read_fail_at_once_naming_both(two_nodes):
    client, first, second = two_nodes
    roots(client, [first], [second])  # two node-local datasets
    a = dg.read_parquet(first, client=client)
    b = dg.read_parquet(second, client=client)
    with pytest.raises(dg.InputError, match="cannot be loaded in one task with") as info:
        client.compute(dd.concat([a, b], axis=1).persist(), sync=True)
    message = str(info.value)
    assert "left the cluster" not in message
    assert first in message and second in message and "persist each read" in message
    # the way out the error names
    a, b = a.persist(), b.persist()
    got = client.compute(dd.concat([a, b], axis=1), sync=True)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected())
