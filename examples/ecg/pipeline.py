"""Heartbeat anomaly detection on continuous 12-lead ECG streams, end to end on dask-gpudirect.

    python examples/ecg/pipeline.py --size small|medium|large [--target host|device]
        [--loader direct|naive] [--workers N] [--data DIR] [--json OUT.json] [--plot OUT.png]

1. data: ``generate.py`` writes the shards (one ``.npy`` per patient-hour) unless DIR already
   holds a complete dataset of this size and seed; once the cluster is up, every worker runs
   the beat code on 10 s of made-up signal, so that CuPy compiles its kernels before the clock
   starts (reported as the warm-up, outside the stages);
2. load: ``dg.read_binary`` puts every shard on a worker's target (CuPy on the device target,
   NumPy on the host target), one chunk per file; or, with ``--loader naive``, Python's
   ``open().read()`` + ``numpy.frombuffer`` (+ ``cupy.asarray``) per shard inside tasks;
3. detect: R peaks found and beats cut into 0.7-s windows on the worker that holds the shard,
   by the same code for CuPy and NumPy (``beats.py``); each beat is one record that carries its
   shard, patient and R-peak sample;
4. fit: each patient's template beat and robust scales, from its shards' median beats;
5. shuffle: ``dg.shuffle_array`` mixes the beats of all patients across the workers, as a
   training set would be;
6. score: every shuffled chunk scores its beats against their patients' templates;
7. evaluate: on the client, scored beats are matched to the labels (within 150 ms), and
   precision and recall are counted per anomaly kind.

Printed: the tables of the stages and of the detector, the dask-gpudirect ledger (the path of
every byte the package moved), then as the last line
``precision=<p> recall=<r> beats_per_s=<b>`` (over all anomaly kinds, end to end).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager

import dask
import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph
from distributed import Client, LocalCluster, futures_of, wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import beats as bt  # noqa: E402
import cloudpickle  # noqa: E402
import generate as gen  # noqa: E402

import dask_gpudirect as dg  # noqa: E402

# Worker processes cannot import examples/ecg: ship the beat code by value.
cloudpickle.register_pickle_by_value(bt)

#: A scored beat and a labelled beat are the same beat within 150 ms (ANSI/AAMI EC57).
MATCH_TOLERANCE = int(0.15 * gen.FS)
#: Flagging thresholds, in the units of each score (see beats.score); the first that a beat
#: crosses, in this order, names its kind.
THRESHOLDS = {"premature": ("z_rr", 4.0), "wide_qrs": ("z_qrs", 8.0), "missing_p": ("p_gone", 0.5)}
OTHER = ("z_t", 12.0)  # an ST-T change of none of the labelled kinds: flagged as "other"
ABNORMAL = gen.KINDS[1:]
PREDICTED = (*gen.KINDS, "other")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(gen.SIZES), default="small")
    p.add_argument(
        "--gib", type=float, help="about this many GiB of shards of --size's length instead"
    )
    p.add_argument("--target", choices=["host", "device"], help="default: device if a GPU")
    p.add_argument("--loader", choices=["direct", "naive"], default="direct")
    p.add_argument("--workers", type=_positive, help="default: 2 (host), one per GPU (device)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    p.add_argument("--protocol", help="default: ucxx (device), tcp (host)")
    p.add_argument("--data", help="dataset directory (default: $TMPDIR/dask-gpudirect-ecg/SIZE)")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--plot", help="draw a normal and abnormal beats with their scores (PNG)")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--abnormal", type=float, default=0.09, help="data's abnormal beats' share")
    p.add_argument("--shuffle-seed", type=int, default=1)
    p.add_argument("--jobs", type=int, help="processes that generate the data (default: all)")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(msg, flush=True)


# --- the cluster and the loaders -----------------------------------------------------------------


def start_cluster(target: str, workers: int | None, threads: int, protocol: str | None):
    plugins = {dg.GPUDirectPlugin()}
    if target == "device":  # one worker per GPU
        return dg.LocalCUDACluster(
            protocol=protocol or "ucxx",
            n_workers=workers,
            threads_per_worker=threads,
            plugins=plugins,
            dashboard_address=None,
        )
    return LocalCluster(
        n_workers=workers or 2,
        threads_per_worker=threads,
        processes=True,
        protocol=protocol or "tcp",
        dashboard_address=None,
        plugins=plugins,
    )


def naive_read(path: str, offset: int, shape: tuple[int, ...], device: bool):
    """The baseline: the whole file into Python bytes, a NumPy view, then a copy to the GPU."""
    with open(path, "rb") as f:
        data = f.read()
    array = np.frombuffer(data, dtype="<f4", count=math.prod(shape), offset=offset).reshape(shape)
    if device:
        import cupy

        return cupy.asarray(array)
    return array


def npy_layout(path: str) -> tuple[int, tuple[int, ...]]:
    """Data offset and shape from a ``.npy`` header (float32, C order: what generate writes)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        if fortran or dtype != np.dtype("<f4"):
            raise ValueError(f"{path}: expected C-order float32, got {dtype} fortran={fortran}")
        return f.tell(), shape


def empty_meta(target: str, ndim_shape: tuple[int, ...]):
    """An empty chunk of the target's array type (CuPy only after the cluster is up)."""
    if target == "device":
        import cupy

        return cupy.empty(ndim_shape, dtype=np.float32)
    return np.empty(ndim_shape, dtype=np.float32)


def load(loader: str, files: list[str], target: str, client: Client) -> da.Array:
    if loader == "direct":
        # One chunk per file (blocksize >= every file's data, files not joined): R peaks and
        # beat windows never straddle a chunk boundary, so no beat is lost or cut twice.
        # detect_and_cut checks it.
        blocksize = max(os.path.getsize(f) for f in files)
        return dg.read_binary(
            files, target=target, blocksize=blocksize, join_files=False, client=client
        )
    meta = empty_meta(target, (0, len(gen.LEADS)))
    parts = []
    for path in files:
        offset, shape = npy_layout(path)
        task = dask.delayed(naive_read, pure=True)(path, offset, shape, target == "device")
        parts.append(da.from_delayed(task, shape, dtype=np.float32, meta=meta))
    return da.concatenate(parts)


def chunk_futures(arr: da.Array) -> list:
    """The futures of a persisted array's chunks along axis 0, in order."""
    by_key = {f.key: f for f in futures_of(arr)}
    return [by_key[k] for k in dask.core.flatten(arr.__dask_keys__())]


def array_of(futures: list, sizes: list[int], columns: int, meta) -> da.Array:
    """A Dask Array made of computed chunks (futures whose keys are the array's keys)."""
    name = futures[0].key[0]
    graph = HighLevelGraph.from_collections(name, {f.key: f for f in futures})
    return da.Array(graph, name, (tuple(sizes), (columns,)), meta=meta)


# --- the stages ----------------------------------------------------------------------------------


class Stages:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        log(f"[{name}] ...")
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start
        log(f"[{name}] {self.seconds[name]:.2f} s")


def run(args, meta: dict, target: str, client: Client) -> dict:
    """Every stage on the cluster; returns the scored beats and what the report needs."""
    stage = Stages()
    shards = meta["shards"]
    files = [os.path.join(args.data, "signals", s["file"]) for s in shards]
    beat_meta = empty_meta(target, (0, bt.COLUMNS))

    start = time.perf_counter()  # kernels compile on first use: not in the stages' times
    workers = list(client.nthreads())
    found = client.gather(
        [client.submit(bt.warm_up, target == "device", workers=[w], pure=False) for w in workers]
    )
    warm_up = time.perf_counter() - start
    log(f"[warm-up] {warm_up:.2f} s on {len(workers)} worker(s), {found[0]} beats each")

    with stage("load"):
        raw = client.persist(load(args.loader, files, target, client))
        wait(raw)
    if raw.numblocks[0] != len(files):
        raise SystemExit(f"{raw.numblocks[0]} chunks for {len(files)} files: need one per file")
    loaded = chunk_futures(raw)

    with stage("detect"):
        name = f"ecg-beats-{uuid.uuid4().hex}"
        beats = [
            client.submit(
                bt.detect_and_cut, chunk, i, s["patient"], s["first_record"], key=(name, i, 0)
            )
            for i, (chunk, s) in enumerate(zip(loaded, shards, strict=True))
        ]
        sizes = client.gather(client.map(bt.rows, beats, pure=False))
    del raw, loaded  # the recordings leave the workers' memory
    detected = sum(sizes)

    with stage("fit"):
        stats = client.gather(client.map(bt.chunk_stats, beats, pure=False))
        model = bt.fit(stats, meta["patients"])
        [model_future] = client.scatter([model], broadcast=True)

    with stage("shuffle"):
        shuffled = dg.shuffle_array(
            array_of(beats, sizes, bt.COLUMNS, beat_meta), seed=args.shuffle_seed, client=client
        )
        mixed = chunk_futures(shuffled)
    del beats

    with stage("score"):
        parts = client.gather(client.map(bt.score, mixed, model=model_future, pure=False))
        scored = np.concatenate(parts) if parts else np.zeros((0, len(bt.SCORES)), np.float32)
    # how mixed the chunks are: the share of each chunk's beats not from its commonest shard
    mixing = float(
        np.mean([1 - np.bincount(p[:, 0].astype(int)).max() / len(p) for p in parts if len(p)])
    )

    with stage("evaluate"):
        labels = [np.load(os.path.join(args.data, "labels", s["file"])) for s in shards]
        evaluation = evaluate(scored, labels)

    examples = pick_examples(evaluation)
    drawn = client.gather(client.map(bt.select, mixed, wanted=examples[:, :2], pure=False))
    drawn = np.concatenate(drawn) if drawn else np.zeros((0, bt.COLUMNS), np.float32)
    del mixed, shuffled

    ledger = dg.report(client)
    ledger_paths = dg.report(client, by="path")
    return {
        "stage_seconds": stage.seconds,
        "warm_up_seconds": warm_up,
        "detected": detected,
        "chunk_sizes": sizes,
        "scored_rows": int(scored.shape[0]),
        "evaluation": evaluation,
        "examples": examples,
        "drawn": drawn,
        "model": model,
        "ledger": ledger,
        "ledger_paths": ledger_paths,
        "mixing": mixing,
    }


# --- evaluation ----------------------------------------------------------------------------------


def match(r: np.ndarray, labelled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One shard: ``r`` the sorted R samples of its scored beats, ``labelled`` its labels.
    Returns per label how many scored beats are its beat (0: missed; 1: right; more: the same
    beat scored several times), and per scored beat its label's kind (-1: no label). A label
    matches the nearest distinct R sample within ``MATCH_TOLERANCE``; of two labels that want
    the same beat, the nearer gets it."""
    times = np.zeros(len(labelled), dtype=np.int64)
    truth = np.full(r.size, -1, dtype=np.int64)
    if not r.size or not len(labelled):
        return times, truth
    unique, inverse, counts = np.unique(r, return_inverse=True, return_counts=True)
    pos = np.searchsorted(unique, labelled[:, 0])
    left = np.clip(pos - 1, 0, unique.size - 1)
    right = np.clip(pos, 0, unique.size - 1)
    dl, dr = np.abs(unique[left] - labelled[:, 0]), np.abs(unique[right] - labelled[:, 0])
    near = np.where(dl <= dr, left, right)
    dist = np.minimum(dl, dr)
    ok = np.flatnonzero(dist <= MATCH_TOLERANCE)
    ok = ok[np.lexsort((dist[ok], near[ok]))]  # per beat, the nearest label first
    first = np.concatenate([[True], near[ok][1:] != near[ok][:-1]]) if ok.size else ok
    ok = ok[first.astype(bool)]
    times[ok] = counts[near[ok]]
    kind_of_unique = np.full(unique.size, -1, dtype=np.int64)
    kind_of_unique[near[ok]] = labelled[ok, 1]
    return times, kind_of_unique[inverse]


def evaluate(scored: np.ndarray, labels: list[np.ndarray]) -> dict:
    """Scored beats matched to labelled beats; precision and recall per kind and overall."""
    n = scored.shape[0]
    shard = scored[:, 0].astype(np.int64)
    r = scored[:, 1].astype(np.int64)
    order = np.lexsort((r, shard))
    shard, r = shard[order], r[order]
    duplicates = int(np.sum((np.diff(shard) == 0) & (np.diff(r) == 0)))
    bounds = np.searchsorted(shard, np.arange(len(labels) + 1))
    truth = np.full(n, -1, dtype=np.int64)  # per sorted scored beat: its label's kind, -1 none
    times_scored = []  # per label: how many scored beats are its beat
    for i, lab in enumerate(labels):
        times, truth[bounds[i] : bounds[i + 1]] = match(r[bounds[i] : bounds[i + 1]], lab)
        times_scored.append(times)
    times_scored = np.concatenate(times_scored) if times_scored else np.zeros(0, np.int64)
    label_kinds = np.concatenate([lab[:, 1] for lab in labels]) if labels else np.zeros(0)

    s = scored[order]
    predicted = np.zeros(n, dtype=np.int64)
    column = {name: i for i, name in enumerate(bt.SCORES)}
    predicted[s[:, column[OTHER[0]]] > OTHER[1]] = PREDICTED.index("other")
    for kind, (score, threshold) in reversed(THRESHOLDS.items()):
        predicted[s[:, column[score]] > threshold] = gen.KINDS.index(kind)

    per_kind = {}
    for kind in ABNORMAL:
        k = gen.KINDS.index(kind)
        labelled = int(np.sum(label_kinds == k))
        called = int(np.sum(predicted == k))
        tp = int(np.sum((predicted == k) & (truth == k)))
        flagged = int(np.sum((predicted != 0) & (truth == k)))
        per_kind[kind] = {
            "labelled": labelled,
            "predicted": called,
            "true_positives": tp,
            "precision": tp / called if called else 0.0,
            "recall": tp / labelled if labelled else 0.0,
            "flagged_any_kind": flagged,
        }
    flagged = predicted != 0
    abnormal_labels = int(np.sum(label_kinds > 0))
    tp = int(np.sum(flagged & (truth > 0)))
    confusion = {
        truth_name: {
            name: int(np.sum((truth == t) & (predicted == p))) for p, name in enumerate(PREDICTED)
        }
        for t, truth_name in [(-1, "unlabelled"), *enumerate(gen.KINDS)]
    }
    return {
        "labelled_beats": int(label_kinds.size),
        "labelled_abnormal": abnormal_labels,
        "scored_beats": n,
        "matched_once": int(np.sum(times_scored == 1)),
        "missed": int(np.sum(times_scored == 0)),
        "matched_more_than_once": int(np.sum(times_scored > 1)),
        "duplicate_rows": duplicates,
        "unlabelled_detections": int(np.sum(truth < 0)),
        "flagged": int(flagged.sum()),
        "precision": tp / int(flagged.sum()) if flagged.any() else 0.0,
        "recall": tp / abnormal_labels if abnormal_labels else 0.0,
        "per_kind": per_kind,
        "confusion": confusion,
        "_sorted": s,
        "_truth": truth,
        "_predicted": predicted,
    }


def pick_examples(evaluation: dict) -> np.ndarray:
    """(shard, r, kind) of the beats the figure draws: a typical normal beat and, per abnormal
    kind, its median-scored true positive (else its median-scored labelled beat)."""
    s, truth, predicted = evaluation["_sorted"], evaluation["_truth"], evaluation["_predicted"]
    column = {name: i for i, name in enumerate(bt.SCORES)}
    rows = []
    normal = np.flatnonzero((truth == 0) & (predicted == 0))
    if normal.size:
        z = s[normal, column["z_qrs"]]
        rows.append((*s[normal[np.argsort(z)[z.size // 2]], :2], 0))
    for kind, (score, _) in THRESHOLDS.items():
        k = gen.KINDS.index(kind)
        pick = np.flatnonzero((truth == k) & (predicted == k))
        if not pick.size:
            pick = np.flatnonzero(truth == k)
        if pick.size:
            z = s[pick, column[score]]
            rows.append((*s[pick[np.argsort(z)[z.size // 2]], :2], k))
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


# --- the report ----------------------------------------------------------------------------------


def summary(args, meta, target, result, setup_seconds) -> dict:
    ev = result["evaluation"]
    seconds = result["stage_seconds"]
    total = sum(seconds.values())
    beats = ev["scored_beats"]
    ledger = result["ledger"]
    read_bytes = int(ledger.loc[ledger["op"] == "read", "bytes"].sum()) if len(ledger) else 0
    data_bytes = sum(s["samples"] * len(gen.LEADS) * 4 for s in meta["shards"])
    return {
        "size": args.size,
        "gib": args.gib,
        "target": target,
        "loader": args.loader,
        "workers": result["workers"],
        "protocol": result["protocol"],
        "data": {
            "dir": args.data,
            "shards": len(meta["shards"]),
            "patients": meta["patients"],
            "bytes": data_bytes,
            "file_bytes": meta["nbytes"],
            "seconds_of_ecg": sum(s["samples"] for s in meta["shards"]) / gen.FS,
            "generate_seconds": meta.get("generate_seconds"),
        },
        "cluster_start_seconds": setup_seconds,
        "warm_up_seconds": result["warm_up_seconds"],
        "stages": [
            {
                "stage": name,
                "seconds": sec,
                "beats_per_s": beats / sec if sec > 0 else None,
                "GB_per_s": data_bytes / sec / 1e9 if name == "load" and sec > 0 else None,
            }
            for name, sec in seconds.items()
        ],
        "end_to_end_seconds": total,
        "beats_per_s": beats / total if total > 0 else 0.0,
        "detected_beats": result["detected"],
        "beats_after_shuffle": result["scored_rows"],
        "shuffle_mixing": result["mixing"],
        "evaluation": {k: v for k, v in ev.items() if not k.startswith("_")},
        "thresholds": {**{k: list(v) for k, v in THRESHOLDS.items()}, "other": list(OTHER)},
        "ledger": ledger.to_dict(orient="records"),
        "ledger_by_path": result["ledger_paths"].to_dict(orient="records"),
        "ledger_read_bytes": read_bytes,
        "naive_bytes_outside_ledger": data_bytes if args.loader == "naive" else 0,
    }


def _table(title: str, columns: list[str], rows: list[list]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"\n{title}")
        print("  ".join(f"{c:>14}" for c in columns))
        for row in rows:
            print("  ".join(f"{str(v):>14}" for v in row))
        return
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console(width=130, file=sys.stdout).print(table)


def print_report(out: dict) -> None:
    d = out["data"]
    log(
        f"\nECG anomaly detection: {d['shards']} patient-hour shards of {d['patients']} patients "
        f"({d['seconds_of_ecg'] / 3600:.1f} h of 12-lead ECG, {d['bytes'] / 1e9:.2f} GB), "
        f"target={out['target']}, loader={out['loader']}, {out['workers']} worker(s) over "
        f"{out['protocol']}; cluster started in {out['cluster_start_seconds']:.1f} s, warm-up "
        f"{out['warm_up_seconds']:.1f} s"
    )
    _table(
        "Stages",
        ["stage", "seconds", "beats/s", "GB/s"],
        [
            [
                s["stage"],
                f"{s['seconds']:.2f}",
                f"{s['beats_per_s']:,.0f}" if s["beats_per_s"] else "-",
                f"{s['GB_per_s']:.2f}" if s["GB_per_s"] else "",
            ]
            for s in out["stages"]
        ]
        + [["end to end", f"{out['end_to_end_seconds']:.2f}", f"{out['beats_per_s']:,.0f}", ""]],
    )
    ev = out["evaluation"]
    _table(
        "Detector (per anomaly kind; a beat is called by the first threshold it crosses)",
        ["kind", "labelled", "called", "true pos.", "precision", "recall", "flagged any"],
        [
            [
                kind,
                m["labelled"],
                m["predicted"],
                m["true_positives"],
                f"{m['precision']:.4f}",
                f"{m['recall']:.4f}",
                m["flagged_any_kind"],
            ]
            for kind, m in ev["per_kind"].items()
        ]
        + [
            [
                "all abnormal",
                ev["labelled_abnormal"],
                ev["flagged"],
                "",
                f"{ev['precision']:.4f}",
                f"{ev['recall']:.4f}",
                "",
            ]
        ],
    )
    log(
        f"beats: {ev['labelled_beats']} labelled, {out['detected_beats']} detected, "
        f"{out['beats_after_shuffle']} after the shuffle, {ev['matched_once']} labelled beats "
        f"scored exactly once, {ev['missed']} missed, {ev['matched_more_than_once']} scored "
        f"more than once, {ev['unlabelled_detections']} detections without a label; "
        f"shuffle mixing {out['shuffle_mixing']:.2f} (share of beats not from their chunk's "
        f"most common shard)"
    )
    _table(
        "dask-gpudirect ledger: the path of every byte the package moved",
        ["worker", "op", "path", "count", "bytes", "seconds", "copies", "GB/s"],
        [
            [
                r["worker"],
                r["op"],
                r["path"],
                r["count"],
                f"{r['bytes']:,}",
                f"{r['seconds']:.2f}",
                r["copies"],
                f"{r['GB/s']:.2f}",
            ]
            for r in out["ledger"]
        ],
    )
    if out["naive_bytes_outside_ledger"]:
        log(
            f"naive loader: {out['naive_bytes_outside_ledger']:,} bytes went open().read() -> "
            "Python bytes -> numpy.frombuffer"
            + (" -> cupy.asarray (pageable copy)" if out["target"] == "device" else "")
            + ", outside dask-gpudirect: not in the ledger"
        )
    else:
        log(f"ledger reads: {out['ledger_read_bytes']:,} of {d['bytes']:,} data bytes")


def plot(path: str, result: dict, out: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plot: matplotlib is not installed, no figure")
        return
    examples, drawn, model = result["examples"], result["drawn"], result["model"]
    ev = result["evaluation"]
    column = {name: i for i, name in enumerate(bt.SCORES)}
    t = (np.arange(bt.WINDOW) - bt.R_AT) * bt.DECIMATE / bt.FS
    leads = [gen.LEADS.index("II"), gen.LEADS.index("V1")]
    fig, axes = plt.subplots(1, len(examples), figsize=(4.2 * len(examples), 4), squeeze=False)
    for ax, (shard, r, kind) in zip(axes[0], examples, strict=True):
        row = drawn[(drawn[:, bt.SHARD] == shard) & (drawn[:, bt.R] == r)][0]
        patient = int(row[bt.PATIENT])
        beat = row[len(bt.META) :].reshape(bt.WINDOW, bt.LEADS)
        template = model["templates"][patient].reshape(bt.WINDOW, bt.LEADS)
        for i, lead in enumerate(leads):
            offset = -1.2 * i
            ax.plot(t, template[:, lead] + offset, "--", color="0.6", lw=1)
            ax.plot(t, beat[:, lead] + offset, color=f"C{i}", lw=1.2, label=gen.LEADS[lead])
        s = ev["_sorted"]
        hit = np.flatnonzero((s[:, 0] == shard) & (s[:, 1] == r))[0]
        called = PREDICTED[ev["_predicted"][hit]]
        scores = ", ".join(f"{n}={s[hit, column[n]]:.2f}" for n in bt.SCORES[2:])
        ax.set_title(f"{gen.KINDS[int(kind)]} (called {called})\n{scores}", fontsize=8)
        ax.set_xlabel("s from the R peak")
        ax.set_yticks([])
        ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(
        f"Beats against their patient's template (dashed); {out['target']} target, "
        f"{out['loader']} loader",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"figure: {path}")


def _plain(value):
    """NumPy scalars as JSON numbers."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return str(value)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.target is None:
        from dask_gpudirect.cuda import gpu_count

        args.target = "device" if gpu_count() else "host"
    if args.data is None:
        args.data = os.path.join(tempfile.gettempdir(), "dask-gpudirect-ecg", args.size)
    meta = gen.ensure(args.data, args.size, args.gib, args.seed, args.jobs, args.abnormal, log=log)

    start = time.perf_counter()
    cluster = start_cluster(args.target, args.workers, args.threads, args.protocol)
    with cluster, Client(cluster) as client:
        workers = len(client.nthreads())
        setup = time.perf_counter() - start
        log(f"cluster: {workers} worker(s), target={args.target}, loader={args.loader}")
        result = run(args, meta, args.target, client)
        result["workers"] = workers
        result["protocol"] = cluster.scheduler_address.split("://")[0]
    out = summary(args, meta, args.target, result, setup)
    print_report(out)
    if args.plot:
        plot(args.plot, result, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=_plain)
        log(f"json: {args.json}")
    ev = out["evaluation"]
    print(
        f"precision={ev['precision']:.4f} recall={ev['recall']:.4f} "
        f"beats_per_s={out['beats_per_s']:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
