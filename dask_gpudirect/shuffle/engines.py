"""Which exchange runs a ``dg.shuffle``: this package's own, or NVIDIA's RapidsMPF shuffler.

``distributed`` (:mod:`.worker`) sends the pieces over Distributed's comms (UCXX or TCP) and
works on both targets. ``rapidsmpf`` (:mod:`.rapidsmpf_engine`) hands them to RapidsMPF's C++
shuffler over its own UCXX communicator, and only shuffles cuDF partitions on GPU workers. Both
cut rows with the same splitter, so a key lands in the same output partition whichever engine
ran.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import dask.config

from .. import targets
from ..errors import InputError
from ..targets import TargetName

ENGINES = ("distributed", "rapidsmpf")
#: ``auto`` hands a device shuffle that need not keep order to RapidsMPF up to this many
#: partitions (inputs and outputs): there it took 11-26 % less time at 4, 16 and 32 partitions
#: of 8.6 GB and 7-12 % in ``bench etl``'s 4, and from 64 on more (``docs/benchmarks.md``,
#: 2026-12-04, two workers on one H200).
RAPIDSMPF_AUTO_PARTITIONS = 32
#: The modules the ``rapidsmpf`` engine imports, and the packages that hold them.
RAPIDSMPF_MODULES = {"rapidsmpf": "rapidsmpf-cu13", "cudf_streaming": "cudf-streaming-cu13"}


def choose(
    engine: str | None,
    target: TargetName,
    meta: Any,
    index: bool,
    partitions: int,
    keep_order: bool,
) -> tuple[str, ...]:
    """The engines that may shuffle ``partitions`` partitions like ``meta`` (at most, of inputs
    and outputs; with their ``index`` or not) on ``target``, the preferred first: the plan
    takes the first whose workers hold their shares (:func:`holds`). ``engine``, else the
    ``gpudirect.shuffle.engine`` config; ``auto`` made concrete (:func:`auto`), anything else
    an InputError raised before a byte moves."""
    asked = dask.config.get("gpudirect.shuffle.engine") if engine is None else engine
    if asked == "auto":
        return auto(target, meta, index, partitions, keep_order)
    if asked not in ENGINES:
        where = " (gpudirect.shuffle.engine)" if engine is None else ""
        choices = ", ".join(map(repr, ENGINES))
        raise InputError(None, f"unknown shuffle engine {asked!r}{where}: use 'auto', {choices}")
    if asked == "rapidsmpf":
        if target != "device":
            raise InputError(
                None,
                "shuffle engine 'rapidsmpf' shuffles cuDF partitions on GPU workers (RapidsMPF "
                "is GPU-only) and these partitions are pandas: use engine='distributed' or "
                "'auto'",
            )
        missing = rapidsmpf_missing()
        if missing:
            raise InputError(
                None,
                f"shuffle engine 'rapidsmpf' needs {' and '.join(missing)}: pip install "
                "'dask-gpudirect[rapidsmpf]'",
            )
    return (asked,)


def auto(
    target: TargetName, meta: Any, index: bool, partitions: int, keep_order: bool
) -> tuple[str, ...]:
    """``rapidsmpf`` where it was measured the faster and gives what was asked for: cuDF
    partitions, at most :data:`RAPIDSMPF_AUTO_PARTITIONS` of them, rows in no set order
    (``keep_order=False``: RapidsMPF's come in arrival order), types its tables carry (no
    categories, no structs) and RapidsMPF installed, and ``distributed`` after it where the
    shuffle would not fit on the GPUs (RapidsMPF was measured there only, not spilling);
    ``distributed`` alone everywhere else."""
    few = target == "device" and not keep_order and partitions <= RAPIDSMPF_AUTO_PARTITIONS
    if (
        few
        and all(map(_installed, RAPIDSMPF_MODULES))
        and targets.module("device").tables_keep_types(meta, index)
    ):
        return ("rapidsmpf", "distributed")
    return ("distributed",)


def holds(engine: str, share: int, room: dict[str, int], spilling: bool = True) -> bool:
    """Whether a worker with ``room`` (bytes of received pieces on the GPU, in host memory, on
    disk) holds ``share`` bytes of a shuffle on ``engine``: the package's exchange spills to
    host and disk, RapidsMPF to host memory only; without ``spilling``, on the GPU alone."""
    if not spilling:
        return share <= room["device"]
    return share <= room["device"] + room["host"] + (room["disk"] if engine == "distributed" else 0)


def rapidsmpf_missing() -> list[str]:
    """The packages the ``rapidsmpf`` engine needs that are not installed here."""
    return [pkg for mod, pkg in RAPIDSMPF_MODULES.items() if not _installed(mod)]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
