"""One error family: every error the library raises on purpose is a ``dg.GPUDirectError`` and
also the built-in a user would catch, and the command line shows it as a message."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from distributed import LocalCluster

import dask_gpudirect as dg
from dask_gpudirect import compat
from dask_gpudirect.cli import main
from dask_gpudirect.config import resolve_options


def test_an_unknown_keyword_is_an_option_error_and_a_type_error():
    with pytest.raises(dg.OptionError, match="unknown GPUDirectPlugin option") as info:
        resolve_options({"thread": 4})
    assert isinstance(info.value, TypeError) and isinstance(info.value, dg.GPUDirectError)
    with pytest.raises(dg.OptionError, match="unexpected keyword argument 'colums'"):
        compat.check_kwargs({"colums": ["a"]})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"by": "nope"},
        {"by": "shard", "window": "1s"},
        {"window": 0},
        {"window": "ten"},
        {"window": True},
        {"window": "-1s"},
        {"window": [1]},
    ],  # fmt: skip
    ids=str,
)
def test_a_bad_report_option_is_an_input_error_and_a_value_error(kwargs):
    """Checked before any worker is asked: no client is needed to learn the option is bad."""
    with pytest.raises(dg.InputError) as info:
        dg.report(**kwargs)
    assert isinstance(info.value, ValueError)


def test_the_command_line_shows_a_library_error_as_a_message():
    """``probe`` of a cluster without workers: the library's ClusterError, shown as one line
    with exit status 1, not a traceback."""
    with LocalCluster(n_workers=0, dashboard_address=None) as cluster:
        result = CliRunner().invoke(
            main, ["probe", "--scheduler-address", cluster.scheduler_address, "--quick"]
        )
    assert result.exit_code == 1, result.output
    assert "Error: the cluster has no workers" in result.output
    assert "Traceback" not in result.output


def test_without_dask_cuda_local_cuda_cluster_is_not_offered():
    """A CPU install (no dask-cuda): ``hasattr`` is false and a star import works (both raised
    ImportError), and using it says what to install."""
    code = """
import sys
sys.modules["dask_cuda"] = None  # as if not installed
import dask_gpudirect as dg
from dask_gpudirect import *
assert not hasattr(dg, "LocalCUDACluster") and "LocalCUDACluster" not in dg.__all__
try:
    dg.LocalCUDACluster
except AttributeError as e:
    assert "pip install 'dask-gpudirect[cuda13]'" in str(e), e
else:
    raise AssertionError("no error")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "call",
    [
        lambda df, arr, f: dg.shuffle(df, "k", npartitions=True),
        lambda df, arr, f: dg.shuffle(df, "k", progress="no"),
        lambda df, arr, f: dg.shuffle_array(arr, seed=True),
        lambda df, arr, f: dg.shuffle_array(arr, progress="no"),
        lambda df, arr, f: dg.read_binary(f[:-4] + ".bin", dtype="f8", shape=True),
        lambda df, arr, f: dg.read_binary(f[:-4] + ".bin", dtype="f8", shape=(True, 2)),
        lambda df, arr, f: dg.read_binary(f, join_files="no"),
        lambda df, arr, f: dg.read_parquet(f, storage_options="anon"),
        lambda df, arr, f: dg.read_parquet(f, columns=5),
        lambda df, arr, f: dg.read_parquet(5),
    ],
    ids=["npartitions-bool", "progress-str", "seed-bool", "array-progress-str", "shape-bool",
         "shape-with-bool", "join_files-str", "storage_options-str", "columns-int", "paths-int"],
)  # fmt: skip
def test_arguments_of_the_wrong_type_are_input_errors(tcp, tmp_path, call):
    """Refused in the user's process by an InputError naming the argument: a bool was taken as
    1, a string "no" as true, and the others raised Python's TypeError or ValueError."""
    import dask.array as da
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    df = dd.from_pandas(pd.DataFrame({"k": range(10)}), npartitions=2)
    arr = da.arange(10, chunks=5)
    np.save(tmp_path / "a.npy", np.arange(10.0))
    (tmp_path / "a.bin").write_bytes(np.arange(16.0).tobytes())
    with pytest.raises(dg.InputError):
        call(df, arr, str(tmp_path / "a.npy"))


@pytest.mark.parametrize(
    "setting",
    [{"host-limit": -0.5}, {"device-limit": 1.5}, {"device-limit": "0.5"}, {"chunk-size": 2.5}],
    ids=str,
)
def test_a_size_that_is_no_whole_number_of_bytes_is_refused(setting):
    """Dask's parse_bytes cut -0.5 to 0 bytes and 1.5 to 1: every piece spilled, silently."""
    import dask

    from dask_gpudirect.shuffle import settings

    key, value = next(iter(setting.items()))
    with dask.config.set({f"gpudirect.shuffle.{key}": value}), pytest.raises(dg.ConfigError):
        settings.check()


def test_compat_mode_takes_booleans_and_names_only():
    with pytest.raises(dg.ConfigError):
        resolve_options({"compat_mode": 1})
    assert resolve_options({"compat_mode": True})["compat_mode"] == "ON"


def test_dasks_spellings_are_taken(tcp, tmp_path):
    """``split_row_groups`` as a NumPy integer (as Dask takes it) and ``read_binary``'s
    ``blocksize="default"`` (as ``read_parquet`` takes it) were refused."""
    import numpy as np
    import pandas as pd

    pd.DataFrame({"x": range(8)}).to_parquet(tmp_path / "a.parquet", row_group_size=2)
    df = dg.read_parquet(tmp_path / "a.parquet", split_row_groups=np.int64(2), client=tcp)
    assert df.npartitions == 2
    np.save(tmp_path / "a.npy", np.arange(8.0))
    assert dg.read_binary(tmp_path / "a.npy", blocksize="default", client=tcp).shape == (8,)
