"""A batch's matrix products split by samples across threads, for calibration runs.

OpenBLAS threads wait for each other by spinning on sched_yield: beside calibration's binning
thread (and other processes) on 2 cores, a third of a DenseNet-121 calibration's CPU samples in
`perf` were that spinning. Here BLAS runs one thread per call and the samples of a batch go to
`threads` Python threads (numpy releases the GIL in BLAS) that wait on locks, not by spinning.

Same bits: a product kernel computes each sample of its first input alone (convolutions run one
BLAS call per sample; 2-D products are cut to rows by `per_sample`), so contiguous
groups of samples give what the whole batch gives, each at one BLAS thread (OpenBLAS 0.3.23's
sgemm sums in an order that depends on its thread count: `one_blas_thread`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from qcc.ir.core import Node

T = TypeVar("T")
Kernel = Callable[[Node, list[np.ndarray]], list[np.ndarray]]
Writer = Callable[[Node, list[np.ndarray], np.ndarray], object]
"""Computes a node's single output for the given inputs into `out` (a slice of the batch's output)."""


def product_threads(limit: int | None = None) -> int:
    """Threads for a batch's products: the cores (or `limit`, a worker's share)."""
    return max(1, limit if limit is not None else os.cpu_count() or 1)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[bool]:
    """BLAS held at one thread meanwhile (without threadpoolctl: as it is; the context's value says
    whether it is held). OpenBLAS 0.3.23's sgemm sums in an order that depends on its thread count
    (a 2-thread and a 1-thread product of the same float32 matrices differ in the last bits), so a
    measurement that must give the same bits in this process and in a worker (which gets one
    thread, or cores / N) runs at one thread in both."""
    limits = _one_blas_thread_limits()
    try:
        yield limits is not None
    finally:
        if limits is not None:
            limits.restore_original_limits()


def _one_blas_thread_limits() -> Any:
    """BLAS limited to one thread until the returned limits are restored; None without
    threadpoolctl (a declared dependency; kept optional here so the core imports only numpy)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(1, user_api="blas")


class SplitProducts:
    """Wraps product kernels; `threads` <= 1 (or no threadpoolctl to hold BLAS at one thread) runs
    them as they are. BLAS runs one thread per call while it is open, `threads` 1 included: the
    bits of a run are those of one BLAS thread whatever the number of cores."""

    def __init__(self, threads: int, inline: bool = False) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | _Inline | None = None
        if inline:  # the caller holds BLAS at one thread (one_blas_thread) for as long as this is used
            self._limits: Any = None
            self._pool = _Inline() if threads > 1 else None
            return
        self._limits = _one_blas_thread_limits()
        if self._limits is None:
            self.threads = 1
            return
        if threads > 1:
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

    def ranges(self, fn: Callable[[int, int], T], count: int) -> list[T]:
        """fn(start, stop) on contiguous ranges of `count` samples, one per thread (in this thread
        without threads); the results in sample order."""
        if self._pool is None or count < 2:
            return [fn(0, count)]
        parts = min(self.threads, count)
        bounds = [count * i // parts for i in range(parts + 1)]
        futures = [self._pool.submit(fn, a, b) for a, b in itertools.pairwise(bounds)]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None


class _Inline:
    """A pool that runs each task at once in the calling thread: `SplitProducts(threads, inline=True)`
    makes the very calls, on the very slices, that `threads` pool threads would (same bits), one
    after another. Calibration's sample-parallel runs use it: their threads each run whole batches."""

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        done: Future[T] = Future()
        done.set_result(fn(*args))
        return done

    def shutdown(self) -> None:
        pass


def float_products(split: SplitProducts, rows_alone: bool = True) -> dict[str, Kernel]:
    """The float interpreter's kernels of every product op, batches split by samples on `split`'s
    threads: calibration's runs (and equalize's, bias-correct's). A sample's values do not depend
    on the batch or on the number of threads (BLAS runs one thread per call, one sample per call),
    so every machine computes the same bits whatever its core count.

    `rows_alone=False`: a 2-D product (samples are its rows) runs on the whole batch in this
    thread (one BLAS thread while `split` holds them), as the plain interpreter computes it: the
    run gives the bits the plain interpreter gives with one BLAS thread."""
    from qcc.ir.registry import get_schema, ops_with

    def kernel(op: str) -> Kernel:
        plain: Kernel = get_schema(op).kernel  # type: ignore[assignment]
        wrapped = split.wrap(per_sample(plain) if rows_alone else plain, _WRITERS.get(op))
        if rows_alone:
            return wrapped

        def run(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
            return plain(node, xs) if xs and xs[0] is not None and xs[0].ndim == 2 else wrapped(node, xs)
        return run

    return {op: kernel(op) for op in ops_with("product") if not get_schema(op).has("elementwise")}


def _conv_into(node: Node, xs: list[np.ndarray], out: np.ndarray) -> None:
    from qcc.ir.ops import nn

    nn.conv2d(xs[0], xs[1], xs[2] if len(xs) > 2 else None, node.attrs, out=out)


_WRITERS: dict[str, Writer] = {"Conv": _conv_into}
"""Product kernels that compute into a given array (no concatenation of the threads' parts)."""


def per_sample(kernel: Kernel) -> Kernel:
    """A product kernel run one sample at a time when the samples are the rows of a matrix product:
    numpy sums a 2-D product in an order that depends on the row count (one row is a gemv), so a
    batch of N would differ in the last bits from N batches of 1. Higher ranks (convolutions,
    batched products) already run one BLAS call per sample."""
    def run(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
        data = xs[0] if xs else None
        if data is None or data.ndim != 2 or len(data) < 2 or (node.inputs[0] is not None and node.inputs[0].is_const):
            return list(kernel(node, xs))
        count = len(data)
        split = [i for i, (v, x) in enumerate(zip(node.inputs, xs))
                 if v is not None and not v.is_const and x is not None and x.ndim >= 2 and len(x) == count]
        parts = [kernel(node, [x[k:k + 1] if i in split else x for i, x in enumerate(xs)]) for k in range(count)]
        return [np.concatenate(outs) for outs in zip(*parts)]
    return run


def _batch_shape(node: Node, count: int) -> tuple[int, ...] | None:
    """The node's single output shape for `count` samples, when its type knows every other dim."""
    if len(node.outputs) != 1:
        return None
    dims = node.outputs[0].type.shape[1:]
    return (count, *dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]
