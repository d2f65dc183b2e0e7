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
        compat.check_kwargs("read_parquet", {"colums": ["a"]})


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
