"""Issue 16 on the device target: ``s3://`` (moto's S3 server, on the GPU machine itself) and
``http://`` (a server of byte ranges) read by ``kvikio.RemoteFile`` straight into GPU memory,
equal to ``cudf.read_parquet`` of the same URLs (and of local copies); the ledger's route is
``kvikio-remote``; an object changed since planning and a connection cut mid-read are
InputErrors naming the URL. The servers are the CPU tests' (``tests/object_servers.py``)."""

from __future__ import annotations

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
