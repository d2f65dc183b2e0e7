"""Synthetic 12-lead ECG recordings with labelled abnormal beats, as binary shards.

    python examples/ecg/generate.py --size small --out DIR [--gib G] [--seed S] [--jobs N]

Writes, one file per patient-hour (``small`` uses 90-second "hours" so CI takes seconds):

- ``DIR/signals/pNNNN-hHH.npy``: ``(samples, 12)`` float32 in mV, 500 Hz, leads I, II, III, aVR,
  aVL, aVF, V1-V6. Records along axis 0 are time samples; each record holds the 12 leads.
- ``DIR/labels/pNNNN-hHH.npy``: ``(beats, 2)`` int64: the R-peak sample of every beat and its
  kind (0 normal, 1 premature, 2 wide_qrs, 3 missing_p; ``KINDS``).
- ``DIR/meta.json``, written last (a dataset without it is incomplete): sizes, the seed, and per
  shard its patient, hour, samples, beats per kind and its first record (which the pipeline uses
  to tell which chunk holds which shard).

The heart is a dipole: each wave (P, Q, R, S, T) is a Gaussian in time with a direction in 3-D,
and each lead sees the dipole's projection on its own axis, so the 12 leads have the familiar
shapes (upright R in II and V5-V6, deep S in V1, negative complexes in aVR). Every patient gets
its own heart rate, axis, amplitudes, PR and QT intervals and noise. Beats follow an RR series
with respiratory sinus arrhythmia, a low-frequency wave, slow drift and jitter; the QT interval
follows the RR interval (Bazett); amplitudes breathe. On top come baseline wander (three slow
sinusoids per lead), 50 Hz mains pickup, white noise and about a dozen bursts of muscle noise
an hour. Abnormal beats (``--abnormal``, default 9 %, the three kinds evenly), each in one of
four grades from mild to marked:

- ``premature``: an atrial premature beat at 55-85 % of the expected RR, with an ectopic P wave,
  followed by a near-compensatory pause (the mildest are hard to tell from sinus arrhythmia);
- ``wide_qrs``: a QRS 1.7-2.9x as wide, with another axis and a discordant T wave, on time;
- ``missing_p``: a normal QRS and T, on time, with 0-30 % of the P wave left.

The first two and last two beats of a shard are normal (the detector has no RR interval before
a shard's first beat), and two abnormal beats never follow each other.

Speed (the GPU run writes tens of GiB): each process builds, once per patient, a bank of beat
templates (every kind and grade at 24 RR lengths) and places each beat with one slice-add; the
white noise is copied in blocks of 8192 records from random offsets of a per-process bank of
4 Mi Gaussian values (a fresh draw for every sample costs 5x the rest of the work); wander is
added in 10-ms steps. Shards are made in parallel processes, a patient's hours in one process
(``--jobs``, default: every core; one below 256 MiB): about 0.06-0.1 s of one core per
patient-hour (86 MB), so on 16 cores the disk is the limit.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import multiprocessing
import os
import shutil
import sys
import time

import numpy as np

FS = 500
LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
KINDS = ("normal", "premature", "wide_qrs", "missing_p")
NORMAL, PREMATURE, WIDE_QRS, MISSING_P = range(4)
#: Template span around the R peak, in samples: 0.3 s before, 0.6 s after.
TEMPLATE_PRE = 150
TEMPLATE_POST = 300
BURSTS_PER_HOUR = 12
#: Abnormal beats come in grades 0 (mildest) to 3, drawn evenly: how wide a wide QRS is, how
#: much of the P wave a "missing" one keeps; a premature beat comes at 55-85 % of the RR.
GRADES = range(4)
WIDE = (1.7, 2.1, 2.5, 2.9)
P_LEFT = (0.3, 0.2, 0.1, 0.0)
COUPLING = (0.55, 0.85)
RR_BINS = np.geomspace(0.3, 2.2, 24)
BYTES_PER_SECOND = FS * len(LEADS) * 4


@dataclasses.dataclass(frozen=True)
class Size:
    patients: int
    hours: int  # shards per patient
    seconds: int  # samples per shard / FS

    @property
    def shards(self) -> int:
        return self.patients * self.hours

    @property
    def nbytes(self) -> int:
        return self.shards * self.seconds * BYTES_PER_SECOND


#: small: CI (8 shards of 90 s, 17 MB); medium: 24 patient-hours (2.1 GB, 1.9 GiB);
#: large: 500 patient-hours (43.2 GB, 40 GiB) for one H200: as much as its disk holds with room
#: to spare (52 GB free), so that the naive loader takes most of a minute there.
SIZES = {
    "small": Size(patients=4, hours=2, seconds=90),
    "medium": Size(patients=6, hours=4, seconds=3600),
    "large": Size(patients=125, hours=4, seconds=3600),
}


def size_for(name: str, gib: float | None = None) -> Size:
    """The named size, or about ``gib`` GiB of shards of its length (as many per patient)
    when given."""
    size = SIZES[name]
    if gib is None:
        return size
    per_shard = size.seconds * BYTES_PER_SECOND
    shards = max(1, round(gib * 2**30 / per_shard))
    hours = min(size.hours, shards)
    return Size(patients=-(-shards // hours), hours=hours, seconds=size.seconds)


def shard_names(size: Size) -> list[tuple[str, int, int]]:
    """``(name, patient, hour)`` of every shard, in order; the last patient may have fewer."""
    return [(f"p{p:04d}-h{h:02d}", p, h) for p in range(size.patients) for h in range(size.hours)]


# --- the heart and the leads ---------------------------------------------------------------------


def _unit(*v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def lead_axes() -> np.ndarray:
    """(3, 12): each lead's axis; x to the patient's left, y down, z to the front."""
    frontal = {"I": 0, "II": 60, "III": 120, "aVR": -150, "aVL": -30, "aVF": 90}
    precordial = {"V1": 115, "V2": 95, "V3": 75, "V4": 55, "V5": 30, "V6": 5}
    axes = []
    for lead in LEADS:
        if lead in frontal:
            a = np.radians(frontal[lead])
            axes.append((np.cos(a), np.sin(a), 0.0))
        else:
            a = np.radians(precordial[lead])
            axes.append((np.cos(a), 0.15, np.sin(a)))
    return np.array(axes).T


def _rotation(rng) -> np.ndarray:
    """A small random rotation (up to about 20 degrees about each axis): the patient's axis."""
    ax, ay, az = rng.uniform(-0.35, 0.35, 3)
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    return rx @ ry @ rz


@dataclasses.dataclass
class Patient:
    """One patient's heart, rhythm and recording conditions, drawn from ``(seed, patient)``."""

    mean_rr: float
    rsa: float
    resp_hz: float
    lf: float
    lf_hz: float
    drift: float
    drift_period: float
    jitter: float
    amp_mod: float
    bank: np.ndarray  # (kinds, grades, RR bins, TEMPLATE_PRE + TEMPLATE_POST, 12) float32
    noise: np.ndarray  # (12,) white-noise sigma per lead, mV
    wander: float
    mains: float

    @classmethod
    def draw(cls, seed: int, patient: int) -> Patient:
        rng = np.random.default_rng([seed, patient, 1])
        rot = _rotation(rng)
        leads = rot.T @ lead_axes()  # rotating the heart = rotating the leads the other way
        p = dict(
            pr=rng.uniform(0.14, 0.19),
            p_amp=rng.uniform(0.12, 0.22),
            r_amp=rng.uniform(0.9, 1.6),
            q_amp=rng.uniform(0.05, 0.15),
            s_amp=rng.uniform(0.2, 0.45),
            t_amp=rng.uniform(0.25, 0.45),
            qrs=rng.uniform(0.9, 1.15),
            qt0=rng.uniform(0.39, 0.43),
            ect_pr=rng.uniform(0.11, 0.14),
        )
        bank = np.array(
            [
                [[_template(kind, grade, rr, p) @ leads for rr in RR_BINS] for grade in GRADES]
                for kind in range(len(KINDS))
            ],
            dtype=np.float32,
        )
        return cls(
            mean_rr=60 / rng.uniform(55, 90),
            rsa=rng.uniform(0.02, 0.05),
            resp_hz=rng.uniform(0.2, 0.33),
            lf=rng.uniform(0.01, 0.03),
            lf_hz=rng.uniform(0.07, 0.12),
            drift=rng.uniform(0.02, 0.06),
            drift_period=rng.uniform(600, 1800),
            jitter=rng.uniform(0.008, 0.015),
            amp_mod=rng.uniform(0.02, 0.06),
            bank=bank,
            noise=(rng.uniform(0.008, 0.02) * rng.uniform(0.7, 1.3, len(LEADS))).astype(np.float32),
            wander=rng.uniform(0.05, 0.25),
            mains=rng.uniform(0.0, 0.01),
        )


@functools.lru_cache(maxsize=4)
def _patient(seed: int, patient: int) -> Patient:
    """A process draws each patient once for all its hours (shards go out in patient order)."""
    return Patient.draw(seed, patient)


def _wave(t, center, sigma, amp, direction, sigma_after=None):
    """(len(t), 3): a Gaussian wave along ``direction``; asymmetric with ``sigma_after``."""
    s = np.where(t > center, sigma_after or sigma, sigma)
    return (amp * np.exp(-0.5 * ((t - center) / s) ** 2))[:, None] * direction[None, :]


def _template(kind: int, grade: int, rr: float, p: dict) -> np.ndarray:
    """(TEMPLATE_PRE + TEMPLATE_POST, 3): the heart dipole of one beat of ``kind`` after an RR
    of ``rr`` s; ``grade`` (0 mildest .. 3) sets how wide a wide QRS is and how little of the
    P wave is left of a missing one."""
    t = (np.arange(-TEMPLATE_PRE, TEMPLATE_POST) + 0.0) / FS
    w = 0.011 * p["qrs"]
    qt = p["qt0"] * np.sqrt(rr)
    r_dir, s_dir = _unit(0.55, 0.75, -0.35), _unit(-0.3, -0.5, -0.8)
    dipole = np.zeros((t.size, 3))
    if kind == PREMATURE:  # ectopic atrial focus: early, inverted in the inferior leads
        dipole += _wave(t, -p["ect_pr"], 0.02, p["p_amp"], _unit(0.4, -0.8, 0.3))
    else:
        p_amp = p["p_amp"] * (P_LEFT[grade] if kind == MISSING_P else 1)
        dipole += _wave(t, -p["pr"], 0.022, p_amp, _unit(0.5, 0.8, 0.15))
    if kind == WIDE_QRS:  # bundle-branch-like: slow, leftward-posterior, discordant T
        wide = WIDE[grade]
        dipole += _wave(t, 0.01, w * wide, p["r_amp"] * 0.8, _unit(0.85, 0.2, -0.5))
        dipole += _wave(
            t, 0.01 + 2.8 * w * wide, w * wide, p["s_amp"] * 1.3, _unit(-0.2, -0.3, 0.9)
        )
        t_dir = -_unit(0.85, 0.3, -0.4)
        t_amp = p["t_amp"] * (0.5 + 0.25 * grade)
        qt += 0.06
    else:
        dipole += _wave(t, -2.5 * w, 0.8 * w, p["q_amp"], _unit(-0.7, 0.1, 0.7))
        dipole += _wave(t, 0.0, w, p["r_amp"], r_dir)
        dipole += _wave(t, 2.6 * w, w, p["s_amp"], s_dir)
        t_dir = _unit(0.6, 0.6, 0.3)
        t_amp = p["t_amp"]
    return dipole + _wave(t, qt - 0.1, 0.055, t_amp, t_dir, sigma_after=0.035)


# --- one shard ---------------------------------------------------------------------------------

_NOISE_BLOCK = len(LEADS) << 13  # values: 8192 records
_WANDER_STEP = 5  # samples
_NOISE: dict[int, np.ndarray] = {}


def _noise_bank(seed: int) -> np.ndarray:
    if seed not in _NOISE:
        rng = np.random.default_rng([seed, 0, 0])
        _NOISE[seed] = rng.standard_normal((1 << 22) + _NOISE_BLOCK, dtype=np.float32)
    return _NOISE[seed]


def beats(patient: Patient, samples: int, abnormal: float, rng):
    """R-peak samples, kinds and grades of one shard's beats."""
    rr_mean = patient.mean_rr * (1 + rng.normal(0, 0.04))
    count = int(samples / FS / (rr_mean * 0.8)) + 10
    t = np.arange(count) * rr_mean
    phases = rng.uniform(0, 2 * np.pi, 3)
    rr = rr_mean * (
        1
        + patient.rsa * np.sin(2 * np.pi * patient.resp_hz * t + phases[0])
        + patient.lf * np.sin(2 * np.pi * patient.lf_hz * t + phases[1])
        + patient.drift * np.sin(2 * np.pi * t / patient.drift_period + phases[2])
        + patient.jitter * rng.standard_normal(count)
    )
    t0 = rng.uniform(0.35, 0.35 + rr_mean)
    last = (samples - TEMPLATE_POST) / FS
    kept = int(np.searchsorted(t0 + np.concatenate([[0], np.cumsum(rr[1:])]), last, "right"))
    kinds = np.zeros(count, dtype=np.int64)
    pick = rng.random(count) < abnormal
    pick[:2] = False
    pick[max(kept - 2, 0) :] = False
    pick[1:] &= ~pick[:-1]  # never two abnormal beats in a row
    kinds[pick] = rng.integers(1, len(KINDS), int(pick.sum()))
    grades = np.where(pick, rng.integers(0, len(GRADES), count), 0)
    early = np.flatnonzero(kinds == PREMATURE)
    shorten = rng.uniform(*COUPLING, early.size)
    saved = rr[early] * (1 - shorten)
    rr[early] *= shorten
    rr[early + 1] += 0.8 * saved  # near-compensatory pause; shifts later beats only earlier
    times = t0 + np.concatenate([[0], np.cumsum(rr[1:])])
    return np.round(times[:kept] * FS).astype(np.int64), kinds[:kept], grades[:kept]


def shard(
    patient_no: int, hour: int, seconds: int, seed: int, abnormal: float
) -> tuple[np.ndarray, np.ndarray]:
    """One patient-hour: ``(samples, 12)`` float32 signal and ``(beats, 2)`` int64 labels."""
    patient = _patient(seed, patient_no)
    rng = np.random.default_rng([seed, patient_no, 2, hour])
    n = seconds * FS
    r, kinds, grades = beats(patient, n, abnormal, rng)

    # white noise: blocks of a shared Gaussian bank at random offsets, scaled per lead
    bank = _noise_bank(seed)
    x = np.empty((n, len(LEADS)), dtype=np.float32)
    rows = _NOISE_BLOCK // len(LEADS)
    starts = rng.integers(0, (bank.size - _NOISE_BLOCK) // len(LEADS), -(-n // rows))
    for i, o in enumerate((starts * len(LEADS)).tolist()):
        block = x[i * rows : (i + 1) * rows]
        np.multiply(bank[o : o + block.size].reshape(block.shape), patient.noise, out=block)
    # muscle artefacts: about a dozen bursts an hour of 0.5-2 s with 2-4x the noise
    for _ in range(rng.poisson(BURSTS_PER_HOUR * seconds / 3600)):
        start, length = rng.integers(0, n), int(rng.uniform(0.5, 2) * FS)
        x[start : start + length] *= np.float32(rng.uniform(2, 4))

    # baseline wander: three slow sinusoids mixed into each lead, added in steps of 10 ms (below
    # the noise: at most 0.01 mV a step); 50 Hz mains pickup: 10 samples repeated
    coarse = np.arange(0, n, _WANDER_STEP, dtype=np.float64) / FS
    waves = np.stack(
        [
            np.sin(2 * np.pi * rng.uniform(lo, hi) * coarse + rng.uniform(0, 2 * np.pi))
            for lo, hi in [(0.05, 0.12), (0.15, 0.35), (0.35, 0.6)]
        ],
        axis=1,
    )
    mix = rng.uniform(-1, 1, (3, len(LEADS))) * [[1], [1], [0.5]] * patient.wander
    steps = (waves @ mix).astype(np.float32)
    x.reshape(-1, _WANDER_STEP, len(LEADS))[...] += steps[:, None, :]
    period = np.arange(FS // 50) / FS
    mains = np.sin(2 * np.pi * 50 * period + rng.uniform(0, 2 * np.pi))[:, None] * (
        rng.uniform(-1, 1, len(LEADS)) * patient.mains
    )
    x.reshape(-1, FS // 50, len(LEADS))[...] += mains.astype(np.float32)

    # the beats: one slice-add of a template per beat, scaled by respiration
    rr = np.diff(r, prepend=r[0] - round(patient.mean_rr * FS)) / FS
    bins = np.clip(np.searchsorted(RR_BINS, rr), 0, RR_BINS.size - 1)
    phase = rng.uniform(0, 2 * np.pi)
    amp = (
        1
        + patient.amp_mod * np.sin(2 * np.pi * patient.resp_hz * r / FS + phase)
        + 0.02 * rng.standard_normal(r.size)
    ).astype(np.float32)
    span = TEMPLATE_PRE + TEMPLATE_POST
    for start, k, g, b, a in zip(
        (r - TEMPLATE_PRE).tolist(),
        kinds.tolist(),
        grades.tolist(),
        bins.tolist(),
        amp.tolist(),
        strict=True,
    ):
        x[start : start + span] += patient.bank[k, g, b] * np.float32(a)
    return x, np.stack([r, kinds], axis=1)


def _write(out: str, name: str, patient: int, hour: int, seconds: int, seed: int, abnormal: float):
    x, labels = shard(patient, hour, seconds, seed, abnormal)
    np.save(os.path.join(out, "signals", name + ".npy"), x)
    np.save(os.path.join(out, "labels", name + ".npy"), labels)
    counts = np.bincount(labels[:, 1], minlength=len(KINDS))
    return {
        "file": name + ".npy",
        "patient": patient,
        "hour": hour,
        "samples": int(x.shape[0]),
        "beats": {k: int(c) for k, c in zip(KINDS, counts, strict=True)},
        "first_record": [float(v) for v in x[0]],
        "nbytes": int(x.nbytes),
    }


def _write_star(args: tuple) -> dict:
    return _write(*args)


def read_meta(out: str) -> dict | None:
    try:
        with open(os.path.join(out, "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def generate(
    out: str,
    size: str = "small",
    gib: float | None = None,
    seed: int = 0,
    abnormal: float = 0.09,
    jobs: int | None = None,
    log=print,
) -> dict:
    """Write the dataset into ``out`` (replacing what is there) and return its metadata."""
    spec = size_for(size, gib)
    if os.path.exists(os.path.join(out, "meta.json")):
        os.remove(os.path.join(out, "meta.json"))
    for sub in ("signals", "labels"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
        os.makedirs(os.path.join(out, sub))
    names = shard_names(spec)
    if jobs is None:  # starting processes costs more than a small dataset
        jobs = 1 if spec.nbytes < 256 * 2**20 else os.cpu_count() or 1
    jobs = max(1, min(jobs, len(names)))
    log(
        f"generate: {len(names)} shards ({spec.patients} patients x {spec.hours} h of "
        f"{spec.seconds} s), {spec.nbytes / 1e9:.2f} GB, {jobs} process(es) -> {out}"
    )
    start = last = time.perf_counter()
    args = [(out, name, p, h, spec.seconds, seed, abnormal) for name, p, h in names]
    shards, done_bytes = {}, 0

    def note(info):
        nonlocal last, done_bytes
        shards[info["file"]] = info
        done_bytes += info["nbytes"]
        now = time.perf_counter()
        if now - last > 2 or len(shards) == len(names):
            last = now
            rate = done_bytes / (now - start)
            log(
                f"generate: {len(shards)}/{len(names)} shards, {done_bytes / 1e9:.2f} GB, "
                f"{rate / 1e9:.2f} GB/s, {now - start:.1f} s"
            )

    if jobs == 1:
        for a in args:
            note(_write(*a))
    else:
        # spawn: no fork of a process that may hold threads; children import this module
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            # a patient's hours go to one process, which draws the patient once
            for info in pool.map(_write_star, args, chunksize=spec.hours):
                note(info)
    seconds = time.perf_counter() - start
    meta = {
        "size": size,
        "gib": gib,
        "seed": seed,
        "abnormal": abnormal,
        "fs": FS,
        "leads": list(LEADS),
        "kinds": list(KINDS),
        "patients": spec.patients,
        "hours": spec.hours,
        "seconds_per_shard": spec.seconds,
        "nbytes": done_bytes,
        "generate_seconds": seconds,
        "shards": [shards[name + ".npy"] for name, _, _ in names],
    }
    with open(os.path.join(out, "meta.json.tmp"), "w") as f:
        json.dump(meta, f)
    os.replace(os.path.join(out, "meta.json.tmp"), os.path.join(out, "meta.json"))
    totals = {k: sum(s["beats"][k] for s in meta["shards"]) for k in KINDS}
    log(
        f"generate: done in {seconds:.1f} s ({done_bytes / seconds / 1e9:.2f} GB/s); beats: "
        + ", ".join(f"{k} {v}" for k, v in totals.items())
    )
    return meta


def ensure(
    out: str,
    size: str,
    gib: float | None,
    seed: int,
    jobs: int | None,
    abnormal: float = 0.09,
    log=print,
) -> dict:
    """The dataset in ``out``, generated unless a complete one of these options is there."""
    meta = read_meta(out)
    if meta and [meta.get(k) for k in ("size", "gib", "seed", "abnormal")] == [
        size,
        gib,
        seed,
        abnormal,
    ]:
        files = [os.path.join(out, "signals", s["file"]) for s in meta["shards"]]
        if all(os.path.exists(f) for f in files):
            log(f"generate: using the {len(files)} shards in {out} ({meta['nbytes'] / 1e9:.2f} GB)")
            return meta
    return generate(out, size, gib, seed, abnormal, jobs, log=log)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--gib", type=float, help="about this many GiB of shards of --size's length"
    )
    parser.add_argument("--out", required=True, help="dataset directory (replaced)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--abnormal", type=float, default=0.09, help="fraction of abnormal beats")
    parser.add_argument("--jobs", type=int, help="processes (default: every core; 1 if small)")
    parser.add_argument(
        "--reuse", action="store_true", help="keep a complete dataset of this size and seed"
    )
    args = parser.parse_args(argv)
    if args.reuse:
        ensure(args.out, args.size, args.gib, args.seed, args.jobs, abnormal=args.abnormal)
    else:
        generate(args.out, args.size, args.gib, args.seed, args.abnormal, args.jobs)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
