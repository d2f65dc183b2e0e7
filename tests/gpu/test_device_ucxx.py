"""The same cluster over UCXX: ``dg.LocalCUDACluster(protocol="ucxx", plugins=...)``.

One cluster for the module (``cuda_ucxx``): the plugin is kept next to dask-cuda's, and device
results (cuDF frames, CuPy arrays) come back to the client over UCXX equal to pyarrow / NumPy.
"""

from __future__ import annotations

import gpu_helpers as h
import numpy as np
import pytest

import dask_gpudirect as dg

pytestmark = pytest.mark.gpu


def compute(client, collection):
    return client.compute(collection).result()


def test_scheduler_speaks_ucxx(cuda_ucxx):
    assert cuda_ucxx.scheduler.address.startswith("ucxx://")
    assert all(w.startswith("ucxx://") for w in cuda_ucxx.nthreads())


def _ucxx_progress_mode() -> str:
    import ucxx

    return ucxx.core._get_ctx().progress_mode


def test_workers_make_ucxx_progress_in_a_thread(cuda_ucxx):
    """dg.LocalCUDACluster's workers: no event loop spinning on UCX's event descriptor."""
    assert set(cuda_ucxx.run(_ucxx_progress_mode).values()) == {"thread"}


def test_plugin_kept_with_dask_cuda_plugins(cuda_ucxx):
    h.check_cluster(cuda_ucxx, threads=h.PLUGIN_THREADS)
    assert set(cuda_ucxx.run(h.kvikio_threads).values()) == {h.PLUGIN_THREADS}


def test_parquet_round_trip(cuda_ucxx, parquet_dir):
    directory, paths = parquet_dir
    ddf = dg.read_parquet(directory, blocksize=1, client=cuda_ucxx)  # target=None: device
    assert ddf.npartitions == h.PARQUET_FILES * (h.ROWS_PER_FILE // h.ROW_GROUP)
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_ucxx, ddf)), h.expected_parquet(paths))
    # a file listed twice is read twice (one libcudf call of both, joined as small files)
    twice = dg.read_parquet([paths[0], paths[0]], client=cuda_ucxx)
    expected = h.expected_parquet([paths[0], paths[0]])
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_ucxx, twice)), expected)


def test_parquet_projection_and_filters(cuda_ucxx, parquet_dir):
    directory, paths = parquet_dir
    columns, filters = ["dec", "s", "l"], [[("i", "<", 1500)], [("cat", "==", "blue")]]
    ddf = dg.read_parquet(
        directory, columns=columns, filters=filters, target="device", client=cuda_ucxx
    )
    expected = h.expected_parquet(paths, columns=columns, filters=filters)
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_ucxx, ddf)), expected)


def test_a_selection_after_the_read_decodes_only_its_columns(cuda_ucxx, parquet_dir):
    """A selection Dask's optimizer pushes into the device read (its column chunks alone,
    filtered on columns it does not keep) gives what ``columns=`` gives; an empty one, the
    rows alone."""
    directory, paths = parquet_dir
    columns, filters = ["s", "dec"], [[("i", "<", 1500)], [("cat", "==", "blue")]]
    ddf = dg.read_parquet(directory, filters=filters, target="device", client=cuda_ucxx)
    expected = h.expected_parquet(paths, columns=columns, filters=filters)
    h.assert_same_table(h.cudf_to_arrow(compute(cuda_ucxx, ddf[columns])), expected)
    assert compute(cuda_ucxx, ddf[[]]).shape == (expected.num_rows, 0)


def test_binary_round_trip(cuda_ucxx, tmp_path):
    c_order = h.npy_array((20_000, 16), "float32", seed=3)  # 1.25 MB: several chunks
    np.save(tmp_path / "c.npy", c_order)
    arr = dg.read_binary(str(tmp_path / "c.npy"), client=cuda_ucxx, blocksize="256KiB")
    assert arr.numblocks[0] > 1
    h.assert_same_array(compute(cuda_ucxx, arr), c_order)

    fortran = np.asfortranarray(h.npy_array((500, 6), "int64", seed=4))
    np.save(tmp_path / "f.npy", fortran)
    arr = dg.read_binary(str(tmp_path / "f.npy"), target="device", client=cuda_ucxx)
    h.assert_same_array(compute(cuda_ucxx, arr), fortran)

    raw = h.npy_array((999, 2, 2), "uint16", seed=5)
    raw.tofile(tmp_path / "r.bin")
    arr = dg.read_binary(
        str(tmp_path / "r.bin"), dtype="uint16", shape=(2, 2), target="device", client=cuda_ucxx
    )
    h.assert_same_array(compute(cuda_ucxx, arr), raw)


def test_ledger_says_kvikio_compat_two_copies(cuda_ucxx):
    """Every read so far in this module took kvikio's compat path (no GDS on the lent H200)."""
    rows = h.ledger_paths(cuda_ucxx)
    assert rows, "the ledger recorded nothing"
    assert {r["path"] for r in rows} == {"kvikio-compat"}, rows
    assert {r["copies"] for r in rows} == {2}, rows
