"""The clusters a tool (``bench``, ``probe``) starts one after another, over UCXX.

The tools make UCXX progress in a thread in their own process, and that mode completes requests
through futures of one event loop. ``bench shuffle`` starts a fresh cluster for each partition
count; on an H200 the fourth start failed ("got Future attached to a different loop") where a
comm of the cluster before had not yet been collected. Run in a process of its own: the progress
mode is the process's, chosen before ucxx starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from util import HANG_GUARD, UCX_CPU_ENV, UCX_PROGRESS_ENV

SCRIPT = textwrap.dedent(
    """
    from dask_gpudirect.measure import start_cluster, stop_cluster


    def main():
        first, first_client = start_cluster("host", 1, 1, "ucxx", None)
        assert first_client.submit(lambda: 1).result(timeout=60) == 1
        # the first cluster's comms stay alive while the second starts and works
        second, second_client = start_cluster("host", 1, 1, "ucxx", None)
        print("second cluster:", second_client.submit(lambda: 2).result(timeout=60))
        stop_cluster(second, second_client, print)
        stop_cluster(first, first_client, print)


    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.timeout(HANG_GUARD + 60)
def test_a_tools_next_cluster_starts_while_the_last_ones_comms_live(tmp_path):
    pytest.importorskip("distributed_ucxx")
    script = tmp_path / "two_clusters.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCXPY_")}
    env.update(**UCX_CPU_ENV, **UCX_PROGRESS_ENV)  # as the tools' own process runs
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_GUARD, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "second cluster: 2" in proc.stdout
    assert "attached to a different loop" not in proc.stderr
