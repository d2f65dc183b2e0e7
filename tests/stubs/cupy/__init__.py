"""A stand-in for CuPy with just what the pinned copy ceiling calls; a copy is a 2 ms sleep.

Put first on the PYTHONPATH of ``bench read``'s ceiling processes, it lets the CPU tests run
their real process plumbing (one process per GPU, ``CUDA_VISIBLE_DEVICES``, turns, JSON out).
"""

import os
import time

import numpy as np

uint8 = np.uint8


class _Runtime:
    memcpyHostToDevice = 1

    def memcpy(self, dst, src, nbytes, kind):
        time.sleep(0.002)

    def deviceSynchronize(self):
        pass

    def getDeviceProperties(self, device):
        name = f"stub GPU {os.environ['CUDA_VISIBLE_DEVICES']}"
        return {"name": name.encode(), "totalGlobalMem": 1 << 30}

    def driverGetVersion(self):
        return 13000

    def runtimeGetVersion(self):
        return 13000


class _Pinned(bytearray):
    ptr = 0


class _Pointer:
    ptr = 0


class ndarray:  # dask registers cupy.ndarray as a chunk type when cupy imports
    data = _Pointer()


class cuda:
    runtime = _Runtime()

    @staticmethod
    def alloc_pinned_memory(nbytes):
        return _Pinned(nbytes)


def empty(shape, dtype=None):
    return ndarray()
