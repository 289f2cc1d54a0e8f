"""A batch's matrix products split by samples across threads, for calibration runs.

OpenBLAS threads wait for each other by spinning on sched_yield: beside calibration's binning
thread (and other processes) on 2 cores, a third of a DenseNet-121 calibration's CPU samples in
`perf` were that spinning. Here BLAS runs one thread per call and the samples of a batch go to
`threads` Python threads (numpy releases the GIL in BLAS) that wait on locks, not by spinning.

Same bits: a product kernel computes each sample of its first input alone (convolutions run one
BLAS call per sample; 2-D products are cut to rows by calibrate's `_per_sample`), so contiguous
groups of samples give what the whole batch gives, each at one BLAS thread (OpenBLAS 0.3.23's
sgemm sums in an order that depends on its thread count: `one_blas_thread`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from qcc.ir.core import Node

Kernel = Callable[[Node, list[np.ndarray]], list[np.ndarray]]
Writer = Callable[[Node, list[np.ndarray], np.ndarray], object]
"""Computes a node's single output for the given inputs into `out` (a slice of the batch's output)."""


def product_threads(limit: int | None = None) -> int:
    """Threads for a batch's products: the cores (or `limit`, a worker's share)."""
    return max(1, limit if limit is not None else os.cpu_count() or 1)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS held at one thread meanwhile (without threadpoolctl: as it is). OpenBLAS 0.3.23's
    sgemm sums in an order that depends on its thread count (a 2-thread and a 1-thread product of
    the same float32 matrices differ in the last bits), so a measurement that must give the same
    bits in this process and in a worker (which gets one thread, or cores / N) runs at one thread
    in both."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


class SplitProducts:
    """Wraps product kernels; `threads` <= 1 (or no threadpoolctl to hold BLAS at one thread) runs
    them as they are."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._limits: Any = None
        if threads > 1:
            try:
                from threadpoolctl import threadpool_limits
            except ImportError:
                self.threads = 1
                return
            self._limits = threadpool_limits(1, user_api="blas")
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="qcc-product")

    def wrap(self, kernel: Kernel, writer: Writer | None = None) -> Kernel:
        """`kernel` with its batch split by samples; with a `writer`, each thread computes its
        samples straight into the batch's output (allocated here from the node's static output
        type) instead of the parts being concatenated: one copy of every output fewer."""
        if self._pool is None:
            return kernel
        pool, threads = self._pool, self.threads

        def run(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
            data = xs[0] if xs else None
            if (data is None or data.ndim < 2 or len(data) < 2 or node.inputs[0] is None or node.inputs[0].is_const
                    or any(v is not None and not v.is_const for v in node.inputs[1:])):
                return kernel(node, xs)
            count = len(data)
            parts = min(threads, count)
            bounds = [count * i // parts for i in range(parts + 1)]
            shape = _batch_shape(node, count) if writer is not None and data.dtype.kind == "f" else None
            if writer is not None and shape is not None:
                out = np.empty(shape, dtype=data.dtype)
                done = [pool.submit(writer, node, [data[a:b], *xs[1:]], out[a:b]) for a, b in itertools.pairwise(bounds)]
                for future in done:
                    future.result()
                return [out]
            futures = [pool.submit(kernel, node, [data[a:b], *xs[1:]]) for a, b in itertools.pairwise(bounds)]
            results = [f.result() for f in futures]
            return [np.concatenate(outs) for outs in zip(*results)]

        return run

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None


def _batch_shape(node: Node, count: int) -> tuple[int, ...] | None:
    """The node's single output shape for `count` samples, when its type knows every other dim."""
    if len(node.outputs) != 1:
        return None
    dims = node.outputs[0].type.shape[1:]
    return (count, *dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]
