"""examples/quickstart.py and examples/etl.py on the device target: cuDF and CuPy partitions on
their own ``LocalCUDACluster`` (one worker per GPU, tcp), checked against pandas exactly as on
the host target (tests/test_examples.py), plus the paths the ledger reports."""

from __future__ import annotations

import pytest
from test_examples import ledger_has, run_etl, run_quickstart

from dask_gpudirect.cuda import gpu_count

pytestmark = pytest.mark.gpu

#: Over tcp a cuDF piece for another GPU is staged through host memory; one GPU keeps all.
SHUFFLE_PATH = "tcp-host-staged" if gpu_count() > 1 else "local"


@pytest.mark.timeout(300)
def test_quickstart_device(tmp_path):
    out = run_quickstart(tmp_path)
    assert ledger_has(out, "read", "(kvikio-compat|gds)"), out
    assert ledger_has(out, "shuffle", SHUFFLE_PATH), out


@pytest.mark.timeout(300)
def test_etl_device(tmp_path):
    printed = run_etl(tmp_path)
    assert ledger_has(printed, "read", "(kvikio-compat|gds)"), printed
    assert ledger_has(printed, "shuffle", SHUFFLE_PATH), printed
