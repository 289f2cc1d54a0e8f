"""Where a pass may run independent pieces of work: this process, local worker processes
(`--workers N`), or a Dask cluster (`--cluster ADDRESS`).

A pass cuts its work into shards whose results merge exactly (calibration statistics, per-layer
scores), so the result never depends on the number of workers. Local workers are forked: they
inherit the model, the data and every registered op (plugins included) without pickling; only
results come back. A cluster gets the function and its shard pickled (Dask's cloudpickle), the
large arrays (weights) scattered once (`qcc.pm.cluster`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from qcc.errors import UsageError

if TYPE_CHECKING:
    from qcc.sim.split import SplitProducts

T = TypeVar("T")
R = TypeVar("R")

_PENDING: tuple[Callable[[Any], Any], Sequence[Any]] | None = None
"""The function and items of the running fork map (children read them from their copy)."""
BALANCE = 4
"""Shards per local worker for work whose shards are cheap to set up (`Workers.shards`)."""
_WORKER_THREADS: int | None = None
"""In a worker process: the threads its compute libraries may use (None in the main process)."""


def _positive(_: Any, attribute: Any, value: int) -> None:
    if value < 1:
        raise UsageError(f"--workers {value}: at least 1")


@attrs.frozen
class Workers:
    """`count` local processes, or the workers of the Dask scheduler at `cluster`."""

    count: int = attrs.field(default=1, validator=_positive)
    cluster: str | None = None

    @property
    def parallel(self) -> bool:
        return self.count > 1 or self.cluster is not None

    def describe(self) -> str:
        return f"Dask cluster {self.cluster}" if self.cluster else f"{self.count} local process(es)"

    def connect_soon(self) -> None:
        """Start connecting to the cluster (if any) while the caller does other work."""
        if self.cluster is not None:
            from qcc.pm.cluster import connect_soon

            connect_soon(self.cluster)

    def slots(self) -> int:
        """How many shards keep every worker busy (one per worker: shards are equal)."""
        if self.cluster is None:
            return self.count
        from qcc.pm.cluster import session

        workers = session(self.cluster).client.scheduler_info()["workers"].values()
        return max(1, sum(int(w.get("nthreads", 1)) for w in workers))

    def shards(self, cheap: bool = False) -> int:
        """How many shards to cut a pass's work into. One per worker, or with `cheap` shards (a
        small setup per shard) `BALANCE` per local worker: the pool hands them out as workers
        free up, so a worker slowed by other processes takes fewer. A cluster's shards stay one
        per worker: each Dask job unpickles its own copy of the model, and splitting them further
        measured slower (docs/benchmarks.md, branch dask9)."""
        return self.slots() * (BALANCE if cheap and self.cluster is None else 1)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """[fn(item) for item in items], each call in a worker; results in item order."""
        if self.cluster is not None:
            from qcc.pm.cluster import dask_map

            return dask_map(self.cluster, _OnDask(fn), items)
        if self.count <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        return _fork_map(min(self.count, len(items)), fn, items)


@attrs.frozen
class _OnDask:
    """`fn` in a Dask task, run with the task's share of the cores: the BLAS threads its nanny
    allows (OMP_NUM_THREADS, 1 by default: one core per Dask thread), as a forked worker gets
    cores / N; the compute libraries' own default outside a nanny."""

    fn: Callable[[Any], Any]

    def __call__(self, item: Any) -> Any:
        value = os.environ.get("OMP_NUM_THREADS", "")
        with worker_budget(int(value) if value.isdigit() and int(value) > 0 else None):
            return self.fn(item)


def worker_threads() -> int | None:
    """Threads a compute library may start in this process (None: its default)."""
    return _WORKER_THREADS


@contextlib.contextmanager
def worker_budget(threads: int | None) -> Iterator[None]:
    """Run as a worker allowed `threads` (a Dask task: what its nanny allows BLAS), as before after."""
    global _WORKER_THREADS
    before, _WORKER_THREADS = _WORKER_THREADS, threads
    try:
        yield
    finally:
        _WORKER_THREADS = before


def _fork_map(count: int, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    import multiprocessing

    global _PENDING
    threads = max(1, (os.cpu_count() or 1) // count)
    _PENDING = (fn, items)
    try:
        with multiprocessing.get_context("fork").Pool(count, initializer=_start_worker, initargs=(threads,)) as pool:
            return pool.map(_call, range(len(items)), chunksize=1)
    finally:
        _PENDING = None


def _start_worker(threads: int) -> None:
    """One worker per core share: BLAS and onnxruntime threads limited to it (no oversubscription)."""
    global _WORKER_THREADS
    _WORKER_THREADS = threads
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(threads)


def _call(index: int) -> Any:
    assert _PENDING is not None, "fork map without pending work"
    fn, items = _PENDING
    return fn(items[index])


def process_split() -> SplitProducts:
    """The passes' sample-split product threads over this process's share of the cores (a
    worker's budget, else all of them)."""
    from qcc.sim.split import SplitProducts, product_threads

    return SplitProducts(product_threads(worker_threads()))
