"""Detect usable GPUs without creating a CUDA context and without touching cuFile.

kvikio's ``cufile_driver.driver_open()`` hangs where there is no driver, and CuPy or cuDF objects
fail there, so everything that might touch CUDA asks :func:`gpu_count` first. It calls the driver
API directly through ctypes: ``cuInit`` initialises the driver but creates no context.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def gpu_count() -> int:
    """Number of GPUs this process can use: 0 without a driver or with none visible."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if libcuda.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value
