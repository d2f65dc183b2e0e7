"""``scripts/shuffle-primitives.py``'s outputs steps, on the host target: each timed repeat
(``best_of.timed`` calls a step once to warm up, then three times) builds the outputs of the
same received pieces, which ``Splitter.outputs`` empties as it copies them."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pandas as pd

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"


def _primitives(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(
        "shuffle_primitives", SCRIPTS / "shuffle-primitives.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "shuffle_primitives", module)
    spec.loader.exec_module(module)
    from dask_gpudirect.shuffle.split import HashSplit

    monkeypatch.setattr(module, "splitter", lambda n, meta: HashSplit(["key"], n, "host", meta))
    return module


def test_outputs_steps_can_be_repeated(monkeypatch):
    primitives = _primitives(monkeypatch)
    rng = np.random.default_rng(0)
    joined = pd.DataFrame({"key": rng.integers(0, 2**62, 4000), "x": rng.random(4000)})
    received = primitives.received_halves(joined, 8, joined.iloc[:0])
    for few in (0, 10**9):  # the join and gather, then the slices: the same pieces
        runs = [primitives.outputs_by(few, 8, joined.iloc[:0], received) for _ in range(4)]
        assert all(sum(map(len, run)) == len(joined) for run in runs)
        for run in runs[1:]:
            for a, b in zip(runs[0], run, strict=True):
                pd.testing.assert_frame_equal(a, b)
