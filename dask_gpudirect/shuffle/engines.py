"""Which exchange runs a ``dg.shuffle``: this package's own, or NVIDIA's RapidsMPF shuffler.

``distributed`` (:mod:`.worker`) sends the pieces over Distributed's comms (UCXX or TCP) and
works on both targets. ``rapidsmpf`` (:mod:`.rapidsmpf_engine`) hands them to RapidsMPF's C++
shuffler over its own UCXX communicator, and only shuffles cuDF partitions on GPU workers. Both
cut rows with the same splitter, so a key lands in the same output partition whichever engine
ran.
"""

from __future__ import annotations

import importlib.util

import dask.config

from ..errors import InputError
from ..targets import TargetName

ENGINES = ("distributed", "rapidsmpf")
#: What ``auto`` picks on each target: the faster in the same run (``docs/benchmarks.md``).
AUTO: dict[str, str] = {"host": "distributed", "device": "distributed"}
#: The modules the ``rapidsmpf`` engine imports, and the packages that hold them.
RAPIDSMPF_MODULES = {"rapidsmpf": "rapidsmpf-cu13", "cudf_streaming": "cudf-streaming-cu13"}


def choose(engine: str | None, target: TargetName) -> str:
    """The engine a shuffle of ``target`` partitions runs: ``engine``, else the
    ``gpudirect.shuffle.engine`` config; ``auto`` made concrete, anything else an InputError
    raised before a byte moves."""
    asked = dask.config.get("gpudirect.shuffle.engine") if engine is None else engine
    if asked == "auto":
        return AUTO[target]
    if asked not in ENGINES:
        raise InputError(
            None, f"unknown shuffle engine {asked!r}: use 'auto', {', '.join(map(repr, ENGINES))}"
        )
    if asked == "rapidsmpf":
        if target != "device":
            raise InputError(
                None,
                "shuffle engine 'rapidsmpf' shuffles cuDF partitions on GPU workers (RapidsMPF "
                "is GPU-only) and these partitions are pandas: use engine='distributed' or "
                "'auto'",
            )
        missing = [pkg for mod, pkg in RAPIDSMPF_MODULES.items() if not _installed(mod)]
        if missing:
            raise InputError(
                None,
                f"shuffle engine 'rapidsmpf' needs {' and '.join(missing)}: pip install "
                "'dask-gpudirect[rapidsmpf]'",
            )
    return asked


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
