"""Issue 16 on the device target: ``s3://`` (moto's S3 server, on the GPU machine itself) and
``http://`` (a server of byte ranges) read by ``kvikio.RemoteFile`` straight into GPU memory,
equal to ``cudf.read_parquet`` of the same URLs (and of local copies); the ledger's route is
``kvikio-remote``; an object changed since planning and a connection cut mid-read are
InputErrors naming the URL. The servers are the CPU tests' (``tests/object_servers.py``)."""

from __future__ import annotations

import os

import gpu_helpers as h
import numpy as np
import pytest
from object_servers import BUCKET, FILES, parquet_files
from util import clear_ledgers

import dask_gpudirect as dg
from dask_gpudirect.bench.s3_server import aws_environment

pytestmark = pytest.mark.gpu


def compute(client, collection):
    return client.compute(collection).result()


def routes(client) -> set[str]:
    return set(dg.report(client, by="path")["path"])


def test_s3_parquet_and_npy_into_gpu_memory(cuda_tcp, s3, local_data):
    import cudf

    clear_ledgers(cuda_tcp)
    df = dg.read_parquet(f"s3://{BUCKET}/pq/", target="device", client=cuda_tcp,
                         storage_options=s3.options, split_row_groups=True)  # fmt: skip
    assert df.npartitions == 4 * FILES
    got = compute(cuda_tcp, df)
    assert isinstance(got, cudf.DataFrame)
    expected = cudf.read_parquet(parquet_files(local_data))
    h.assert_same_table(h.cudf_to_arrow(got.reset_index(drop=True)), h.cudf_to_arrow(expected))
    arr = dg.read_binary(f"s3://{BUCKET}/npy/", target="device", client=cuda_tcp,
                         storage_options=s3.options, blocksize=96)  # fmt: skip
    npy = [np.load(local_data / "npy" / f"shard-{k}.npy") for k in range(2)]
    h.assert_same_array(compute(cuda_tcp, arr), np.concatenate(npy))
    assert routes(cuda_tcp) == {"kvikio-remote"}


def test_http_parquet_equals_cudf_of_the_same_url(cuda_tcp, http_url, local_data):
    import cudf

    base, _, _ = http_url
    urls = [f"{base}/pq/part-{k}.parquet" for k in range(FILES)]
    df = dg.read_parquet(urls, columns=["id", "name"], filters=[("id", "<", 150)],
                         target="device", client=cuda_tcp)  # fmt: skip
    got = compute(cuda_tcp, df).reset_index(drop=True)
    with cudf.option_context("kvikio_remote_io", True):
        expected = cudf.read_parquet(urls, columns=["id", "name"], filters=[("id", "<", 150)])
    h.assert_same_table(h.cudf_to_arrow(got), h.cudf_to_arrow(expected.reset_index(drop=True)))


def test_s3_parquet_equals_cudf_of_the_same_url(cuda_tcp, s3, monkeypatch):
    """The same ``s3://`` URLs through cuDF: s3fs lists them, then libcudf reads them with its
    own KvikIO S3 source, which takes the keys and endpoint only from the environment."""
    import cudf

    pytest.importorskip("s3fs")
    urls = [f"s3://{BUCKET}/pq/part-{k}.parquet" for k in range(FILES)]
    options = {"columns": ["id", "name"], "filters": [("id", ">=", 120)]}
    df = dg.read_parquet(urls, target="device", client=cuda_tcp, storage_options=s3.options,
                         **options)  # fmt: skip
    got = compute(cuda_tcp, df).reset_index(drop=True)
    s3fs_options = {"key": s3.key, "secret": s3.secret, "endpoint_url": s3.endpoint}
    for name, value in aws_environment(s3fs_options).items():
        monkeypatch.setenv(name, value)
    with cudf.option_context("kvikio_remote_io", True):
        expected = cudf.read_parquet(urls, storage_options=s3fs_options, **options)
    h.assert_same_table(h.cudf_to_arrow(got), h.cudf_to_arrow(expected.reset_index(drop=True)))


def test_s3_object_changed_since_planning(cuda_tcp, s3, local_data):
    url = f"s3://{BUCKET}/changing-gpu.parquet"
    s3.put("changing-gpu.parquet", (local_data / "pq" / "part-0.parquet").read_bytes())
    df = dg.read_parquet(url, target="device", client=cuda_tcp, storage_options=s3.options)
    s3.put("changing-gpu.parquet", (local_data / "pq" / "part-1.parquet").read_bytes())
    with pytest.raises(dg.InputError, match="changed since it was planned") as info:
        compute(cuda_tcp, df)
    assert info.value.path == url


def test_http_connection_cut_mid_read(cuda_tcp, http_url):
    base, _, server = http_url
    url = f"{base}/raw.bin"
    arr = dg.read_binary(url, dtype="<i4", target="device", client=cuda_tcp)
    server.cut_next = 10  # more than kvikio's attempts
    try:
        with pytest.raises(dg.InputError) as info:
            compute(cuda_tcp, arr)
    finally:
        server.cut_next = 0
    assert info.value.path == url
    h.assert_same_array(compute(cuda_tcp, arr), np.arange(1000, dtype="<i4"))  # cluster fine


def test_http_parquet_of_nested_types_reads_as_its_local_copy(cuda_tcp, http_url):
    """A remote shard is decoded from its ranges alone (libcudf's hybrid-scan reader over
    one device buffer of them): nested columns, maps and float16, whole files and a row
    group a partition, read as the same files on a local disk (one libcudf read of paths)."""
    from util import write_nested_parquet

    base, root, _ = http_url
    (root / "nested").mkdir()
    paths = write_nested_parquet(root / "nested")
    urls = [f"{base}/nested/{os.path.basename(p)}" for p in paths]
    for split in (False, True):
        local = dg.read_parquet(paths, split_row_groups=split, target="device", client=cuda_tcp)
        served = dg.read_parquet(urls, split_row_groups=split, target="device", client=cuda_tcp)
        assert served.npartitions == local.npartitions
        expected = cuda_tcp.compute(local).result().reset_index(drop=True)
        got = cuda_tcp.compute(served).result().reset_index(drop=True)
        h.assert_same_table(h.cudf_to_arrow(got), h.cudf_to_arrow(expected))


def test_http_parquet_shard_takes_device_memory_of_its_ranges_alone(cuda_tcp, http_url):
    """One column of one row group of a remote file of 16 columns and 8 row groups: the read
    allocates about its bytes on the GPU, not the file's (a buffer of the whole file for
    every shard made a file cut into k shards cost k times its size in flight)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_gpudirect.formats import parquet
    from dask_gpudirect.plugin import current_plugin

    base, root, _ = http_url
    table = pa.table({f"c{i}": np.arange(1 << 20, dtype="float64") + i for i in range(16)})
    pq.write_table(table, root / "wide.parquet", row_group_size=1 << 17, compression="none")
    url = f"{base}/wide.parquet"
    shard = parquet.projected(parquet.plan([url], None, None, 1, "device").shards[3], ["c5"])

    def read(shard):
        import rmm.statistics

        with current_plugin().target("device").used() as target:
            with rmm.statistics.statistics():
                frame = target.decode_run([shard])
                peak = rmm.statistics.get_statistics().peak_bytes
        return peak, frame["c5"].to_numpy()

    peak, values = cuda_tcp.submit(read, shard, pure=False).result()
    size = (root / "wide.parquet").stat().st_size
    assert peak < size / 16, (peak, size)
    np.testing.assert_array_equal(values, np.arange(3 << 17, 4 << 17, dtype="float64") + 5)


def test_a_run_of_remote_shards_lets_each_raw_buffer_go_once_decoded(cuda_tcp, http_url):
    """Four remote files decoded in one run: each shard's raw device buffer goes once it is
    decoded, as the host target's do. They were held through the concat of the decoded frames,
    a peak of the raw bytes and twice the decoded (about 3x the raw here, uncompressed); it is
    now about twice."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_gpudirect.formats import parquet
    from dask_gpudirect.plugin import current_plugin

    base, root, _ = http_url
    urls = []
    for k in range(4):
        table = pa.table({"x": np.arange(1 << 20, dtype="float64") + k})
        pq.write_table(table, root / f"run-{k}.parquet", compression="none")
        urls.append(f"{base}/run-{k}.parquet")
    shards = parquet.plan(urls, None, None, 1 << 40, "device").shards
    raw = sum(shard.nbytes for shard in shards)

    def read(shards):
        import rmm.statistics

        with current_plugin().target("device").used() as target:
            with rmm.statistics.statistics():
                frame = target.decode_run(shards)
                peak = rmm.statistics.get_statistics().peak_bytes
        return peak, frame["x"].to_numpy()

    peak, values = cuda_tcp.submit(read, shards, pure=False).result()
    want = np.concatenate([np.arange(1 << 20, dtype="float64") + k for k in range(4)])
    np.testing.assert_array_equal(values, want)
    assert peak < 2.5 * raw, (peak, raw)
