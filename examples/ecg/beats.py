"""R peaks, beat windows, patient templates and beat scores: one code for both targets.

Every function takes NumPy arrays (host target) or CuPy arrays (device target) and picks the
array module from its input (``xp``), so the GPU runs exactly the code CI runs on the CPU. The
functions that return small results to the client (``chunk_stats``, ``score``, ``select``)
return NumPy arrays: the client process never holds GPU memory.

A beat record is one float32 row: ``META`` columns (shard, patient, R-peak sample, RR before and
after as fractions of the local RR) and then the beat window, ``WINDOW`` samples at 250 Hz from
0.25 s before to 0.45 s after the R peak, of each of the 12 leads. Integers up to 2**24 are exact
in float32; ``cut`` checks that the R-peak samples are.
"""

from __future__ import annotations

import numpy as np

FS = 500
LEADS = 12
PRE, POST = 125, 225  # window around the R peak in samples at 500 Hz: 0.25 s before, 0.45 after
DECIMATE = 2  # windows are kept at 250 Hz (pairs of samples averaged)
WINDOW = (PRE + POST) // DECIMATE  # 175 samples
R_AT = PRE // DECIMATE  # the R peak's index in a window (62)
META = ("shard", "patient", "r", "rr_prev", "rr_next")
SHARD, PATIENT, R, RR_PREV, RR_NEXT = range(len(META))
COLUMNS = len(META) + WINDOW * LEADS

# R-peak detection (Pan-Tompkins in spirit): slope energy summed over leads, smoothed, local maxima
LAG = 4  # slope = x[t + 4] - x[t - 4] (16 ms): a band-pass that keeps QRS slopes
SMOOTH = 30  # energy summed over 60 ms
REFRACTORY = 100  # at most one beat in any 0.2 s window (+-100 samples)
THRESHOLD = 0.04  # of the median of 2-s maxima of the energy (a wide QRS holds ~0.13)
T_WAVE_WITHIN, T_WAVE_RATIO = 200, 0.5  # a peak < 0.4 s after a beat, < half its energy: T
SEARCH = 50  # the R peak lies within 100 ms of the energy peak
RR_NEIGHBOURS = 8  # the local RR is the median of 16 intervals around a beat

# Score regions of a window (indices at 250 Hz): P wave, QRS complex, ST segment and T wave
SMOOTH_SCORE = 5  # squared z-scores averaged over 20 ms
P_WAVE = (0, R_AT - 17)  # -0.25 .. -0.07 s
QRS = (R_AT - 17, R_AT + 22)  # -0.07 .. +0.09 s
T_WAVE = (R_AT + 22, WINDOW)  # +0.09 .. +0.45 s
SCORES = ("shard", "r", "z_rr", "p_gone", "z_qrs", "z_t")


def xp_of(a):
    """``cupy`` for CuPy arrays, else ``numpy``."""
    if type(a).__module__.partition(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def to_host(a) -> np.ndarray:
    return a.get() if xp_of(a) is not np else np.asarray(a)


def sliding_max(a, half: int):
    """``max(a[i - half : i + half + 1])`` for every ``i`` (log2 passes of ``maximum``)."""
    xp = xp_of(a)
    width = 2 * half + 1
    pad = xp.full(half, -np.inf, dtype=a.dtype)
    m = xp.concatenate([pad, a, pad])
    length = 1
    while 2 * length <= width:  # m[i] = max of `length` values from i
        m = xp.maximum(m[:-length], m[length:])
        length *= 2
    return xp.maximum(m[: a.size], m[width - length : width - length + a.size])


def r_peaks(x):
    """Sample indices (int64, increasing) of the R peaks in ``x``, a ``(samples, 12)`` recording."""
    xp = xp_of(x)
    n = x.shape[0]
    if n <= 2 * LAG + SMOOTH:
        return xp.zeros(0, dtype=xp.int64)
    slope = x[2 * LAG :] - x[: -2 * LAG]
    energy = (slope * slope).sum(axis=1)
    total = xp.cumsum(energy, dtype=xp.float64)
    env = (total[SMOOTH:] - total[:-SMOOTH]).astype(xp.float32)  # centred at i + CENTRE
    block = 2 * FS
    blocks = env.size // block
    if blocks:
        level = xp.median(env[: blocks * block].reshape(blocks, block).max(axis=1))
    else:
        level = env.max()
    peak = (env >= sliding_max(env, REFRACTORY)) & (env > THRESHOLD * level)
    cand = xp.flatnonzero(peak)
    if cand.size > 1:  # equal neighbouring maxima: keep the first
        cand = cand[xp.concatenate([xp.ones(1, bool), xp.diff(cand) > REFRACTORY])]
    if cand.size > 1:  # Pan-Tompkins' T-wave rule: soon after a beat and much weaker is its T
        height = env[cand]
        t_wave = (xp.diff(cand) < T_WAVE_WITHIN) & (height[1:] < T_WAVE_RATIO * height[:-1])
        cand = cand[xp.concatenate([xp.ones(1, bool), ~t_wave])]
    centre = cand + LAG + (SMOOTH + 1) // 2
    # the R peak: where the 12-lead vector is farthest from its mean near the energy peak
    idx = xp.clip(centre[:, None] + xp.arange(-SEARCH, SEARCH + 1)[None, :], 0, n - 1)
    near = x[idx]
    near = near - near.mean(axis=1, keepdims=True)
    r = centre - SEARCH + (near * near).sum(axis=2).argmax(axis=1)
    return xp.unique(xp.clip(r, 0, n - 1))


def rr_ratios(r):
    """RR interval before and after each beat, as fractions of the local (median) RR; 1 where
    there is no neighbour."""
    xp = xp_of(r)
    k = r.size
    before = xp.ones(k, dtype=xp.float32)
    after = xp.ones(k, dtype=xp.float32)
    if k < 3:
        return before, after
    rr = xp.diff(r).astype(xp.float32)  # rr[j]: from beat j to beat j + 1
    around = xp.arange(k)[:, None] + xp.arange(-RR_NEIGHBOURS, RR_NEIGHBOURS)[None, :]
    local = xp.median(rr[xp.clip(around, 0, k - 2)], axis=1)
    before[1:] = rr / local[1:]
    after[:-1] = rr / local[:-1]
    return before, after


def cut(x, r, shard: int, patient: int):
    """``(beats, COLUMNS)`` float32 beat records of the R peaks ``r`` in ``x``."""
    xp = xp_of(x)
    n, k = x.shape[0], r.size
    if n >= 2**24:
        raise ValueError(f"{n} samples: R-peak samples past 2**24 are not exact in float32")
    idx = xp.clip(r[:, None] + xp.arange(-PRE, POST)[None, :], 0, n - 1)
    windows = x[idx].reshape(k, WINDOW, DECIMATE, LEADS).mean(axis=2)
    windows -= xp.median(windows, axis=1, keepdims=True)  # each beat's baseline, per lead
    before, after = rr_ratios(r)
    out = xp.empty((k, COLUMNS), dtype=xp.float32)
    out[:, SHARD] = shard
    out[:, PATIENT] = patient
    out[:, R] = r
    out[:, RR_PREV] = before
    out[:, RR_NEXT] = after
    out[:, len(META) :] = windows.reshape(k, WINDOW * LEADS)
    return out


def detect_and_cut(x, shard: int, patient: int, first_record):
    """The beat records of one shard's chunk. ``first_record`` is the shard's first record
    (from meta.json): a chunk that does not start with it is not this shard, or not a whole one
    (``read_binary`` cut the file into several chunks), and fails loudly instead of mixing up
    patients or losing beats at a chunk boundary."""
    head = to_host(x[:1]).ravel()
    if x.shape[0] == 0 or not np.array_equal(head, np.asarray(first_record, dtype=head.dtype)):
        raise ValueError(
            f"chunk of {x.shape[0]} records does not start with shard {shard}'s first record: "
            "one chunk per file is required (blocksize >= file size, join_files=False), in "
            "file order"
        )
    return cut(x, r_peaks(x), shard, patient)


def rows(b) -> int:
    return int(b.shape[0])


def chunk_stats(b):
    """One shard's beats summarised for the patient's template: patient, beats, the median beat,
    the median absolute deviation from it, and the median and MAD of the RR-before ratio."""
    xp = xp_of(b)
    if b.shape[0] == 0:
        return None
    w = b[:, len(META) :]
    median = xp.median(w, axis=0)
    mad = xp.median(xp.abs(w - median), axis=0)
    rr = b[:, RR_PREV]
    rr_median = xp.median(rr)
    rr_mad = xp.median(xp.abs(rr - rr_median))
    return (
        int(to_host(b[0, PATIENT])),
        int(b.shape[0]),
        to_host(median),
        to_host(mad),
        float(rr_median),
        float(rr_mad),
    )


def _p_wave(template: np.ndarray) -> np.ndarray:
    """The template's P-wave region per lead with its straight-line trend removed (so baseline
    offsets and wander slopes in a beat do not project on it), flattened like a record."""
    p = template.reshape(WINDOW, LEADS)[P_WAVE[0] : P_WAVE[1]].astype(np.float64)
    t = np.linspace(-1, 1, p.shape[0])
    basis = np.linalg.qr(np.stack([np.ones_like(t), t], axis=1))[0]
    return (p - basis @ (basis.T @ p)).reshape(-1)


def fit(stats: list, patients: int) -> dict:
    """The model, per patient (NumPy): the template beat (median of its shards' median beats),
    a robust scale per sample (1.4826 x median of the shards' MADs), the template's detrended P
    wave scaled to project a beat's P amplitude as a fraction of the template's, and the median
    and robust scale of the RR-before ratio."""
    by_patient: dict[int, list] = {}
    for s in stats:
        if s is not None:
            by_patient.setdefault(s[0], []).append(s)
    width = WINDOW * LEADS
    templates = np.zeros((patients, width), dtype=np.float32)
    scales = np.ones((patients, width), dtype=np.float32)
    p_wave = np.zeros((patients, (P_WAVE[1] - P_WAVE[0]) * LEADS), dtype=np.float32)
    rr = np.tile(np.float32([1.0, 0.05]), (patients, 1))
    for p, group in by_patient.items():
        templates[p] = np.median(np.stack([g[2] for g in group]), axis=0)
        scales[p] = 1.4826 * np.median(np.stack([g[3] for g in group]), axis=0)
        wave = _p_wave(templates[p])
        p_wave[p] = wave / max(float(wave @ wave), 1e-12)
        rr[p] = (np.median([g[4] for g in group]), 1.4826 * np.median([g[5] for g in group]))
    np.maximum(scales, 1e-3, out=scales)  # 1 uV: never divide by zero
    rr[:, 1] = np.maximum(rr[:, 1], 0.01)
    return {"templates": templates, "scales": scales, "p_wave": p_wave, "rr": rr}


def score(b, model: dict):
    """``(beats, len(SCORES))`` NumPy: shard, R sample and how far the beat is from its
    patient's template:

    - ``z_rr``: how early it came: the RR-before ratio below the patient's median, in robust
      scales;
    - ``p_gone``: how much of the patient's P wave is missing: 1 minus the least-squares
      amplitude of the template's P wave in the beat (0 for a normal beat, 1 without P);
    - ``z_qrs``, ``z_t``: in the QRS and the ST-T region, the root of the largest 20-ms mean
      of the squared per-sample robust z-scores of the 12 leads.
    """
    xp = xp_of(b)
    k = b.shape[0]
    patient = b[:, PATIENT].astype(xp.int64)
    window = b[:, len(META) :]
    z = (window - xp.asarray(model["templates"])[patient]) / xp.asarray(model["scales"])[patient]
    z2 = (z * z).reshape(k, WINDOW, LEADS).mean(axis=2)
    total = xp.cumsum(z2, axis=1)
    total = xp.concatenate([xp.zeros((k, 1), dtype=total.dtype), total], axis=1)
    smooth = (total[:, SMOOTH_SCORE:] - total[:, :-SMOOTH_SCORE]) / SMOOTH_SCORE

    def peak(region):  # a smoothed value at j covers window samples j .. j + SMOOTH_SCORE - 1
        lo = max(region[0] - SMOOTH_SCORE // 2, 0)
        hi = min(region[1] - SMOOTH_SCORE // 2, smooth.shape[1])
        return xp.sqrt(smooth[:, lo:hi].max(axis=1))

    p_region = window[:, P_WAVE[0] * LEADS : P_WAVE[1] * LEADS]
    p_amp = (p_region * xp.asarray(model["p_wave"])[patient]).sum(axis=1)
    rr = xp.asarray(model["rr"])[patient]
    out = xp.empty((k, len(SCORES)), dtype=xp.float32)
    out[:, 0] = b[:, SHARD]
    out[:, 1] = b[:, R]
    out[:, 2] = (rr[:, 0] - b[:, RR_PREV]) / rr[:, 1]
    out[:, 3] = 1 - p_amp
    out[:, 4] = peak(QRS)
    out[:, 5] = peak(T_WAVE)
    return to_host(out)


def select(b, wanted):
    """The records of ``b`` whose (shard, R sample) is in ``wanted`` (a NumPy (n, 2) array), as
    NumPy: the beats the figure draws."""
    xp = xp_of(b)
    wanted = xp.asarray(np.asarray(wanted, dtype=np.float32))
    hit = ((b[:, None, SHARD] == wanted[None, :, 0]) & (b[:, None, R] == wanted[None, :, 1])).any(1)
    return to_host(b[hit])


def warm_up(device: bool) -> int:
    """Run every function once on 10 s of a made-up recording, on the worker's target, so that
    CuPy compiles its kernels before the timed stages (the first call of each kernel compiles
    it; later processes find it in CuPy's kernel cache). Returns the beats found."""
    t = np.arange(10 * FS) / FS
    beat = np.exp(-0.5 * (((t[:, None] - np.arange(0.5, 10, 0.8)[None, :]) / 0.012) ** 2)).sum(1)
    x = (beat[:, None] * np.linspace(-1, 1, LEADS)[None, :]).astype(np.float32)
    x += np.random.default_rng(0).normal(0, 0.01, x.shape).astype(np.float32)
    if device:
        import cupy

        x = cupy.asarray(x)
    b = detect_and_cut(x, 0, 0, to_host(x[0]))
    model = fit([chunk_stats(b)], 1)
    score(b, model)
    select(b, to_host(b[:1, [SHARD, R]]))
    return rows(b)
