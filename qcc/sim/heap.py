"""glibc's adapted heap while qcc runs models, where the environment has fixed its thresholds.

The interpreter allocates every activation anew and frees it a node or two later. glibc's
malloc adapts to that: after the first large free it raises its mmap threshold (up to 32 MB on
64-bit) and the freed memory serves the next activation. Setting any of MALLOC_TRIM_THRESHOLD_,
MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_ or MALLOC_MMAP_MAX_ turns that off: every array of
128 kB or more is then a fresh mmap, zero-filled page by page and unmapped at once. Dask's
nanny starts its workers with MALLOC_TRIM_THRESHOLD_=65536, and the processes it runs inherit
it; a worker spent about 40% of its CPU time in page faults (sys 5 s of 12 s for half of
light_resnet50's calibration), a `qcc compile` started with that environment 2.4x its time.
`adapted_heap` sets the thresholds glibc would have adapted to while runs are active, and puts
the environment's back, with the freed memory returned, when the last one ends. Without those
variables glibc adapts by itself and nothing is changed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

_FIXING_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
"""What turns glibc's adaptive thresholds off (mallopt(3))."""
_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
_ADAPTED_MMAP_THRESHOLD = 32 << 20
"""glibc's adaptive ceiling on 64-bit: below it, a freed array's memory serves the next one."""
_GLIBC_MMAP_THRESHOLD = 128 << 10
_running = 0
_running_lock = threading.Lock()


@contextlib.contextmanager
def adapted_heap() -> Iterator[None]:
    """glibc's heap as a process that has adapted to large arrays keeps it, while this runs."""
    global _running
    libc = _glibc() if any(name in os.environ for name in _FIXING_VARIABLES) else None
    if libc is None:  # glibc adapts by itself, or another C library with its own allocator
        yield
        return
    with _running_lock:
        _running += 1
        if _running == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, _ADAPTED_MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * _ADAPTED_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _running_lock:
            _running -= 1
            if _running == 0:
                libc.mallopt(_M_TRIM_THRESHOLD, _setting("MALLOC_TRIM_THRESHOLD_", _GLIBC_MMAP_THRESHOLD))
                libc.mallopt(_M_MMAP_THRESHOLD, _setting("MALLOC_MMAP_THRESHOLD_", _GLIBC_MMAP_THRESHOLD))
                libc.malloc_trim(0)


def _setting(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def _glibc() -> Any:
    """The process's C library when it is glibc (mallopt and malloc_trim), else None."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc
