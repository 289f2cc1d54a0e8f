"""Where a pass may run independent pieces of work: this process, local worker processes
(`--workers N`), or a Dask cluster (`--cluster ADDRESS`).

A pass cuts its work into shards whose results merge exactly (calibration statistics, per-layer
scores), so the result never depends on the number of workers. Local workers are forked: they
inherit the model, the data and every registered op (plugins included) without pickling; only
results come back. A cluster gets the function and its shard pickled (Dask's cloudpickle).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from qcc.errors import UsageError

T = TypeVar("T")
R = TypeVar("R")

_PENDING: tuple[Callable[[Any], Any], Sequence[Any]] | None = None
"""The function and items of the running fork map (children read them from their copy)."""
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

    def slots(self) -> int:
        """How many shards keep every worker busy (one per worker: shards are equal)."""
        if self.cluster is None:
            return self.count
        with _client(self.cluster) as client:
            return max(1, sum(int(w.get("nthreads", 1)) for w in client.scheduler_info()["workers"].values()))

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """[fn(item) for item in items], each call in a worker; results in item order."""
        if self.cluster is not None:
            return _dask_map(self.cluster, fn, items)
        if self.count <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        return _fork_map(min(self.count, len(items)), fn, items)


def worker_threads() -> int | None:
    """Threads a compute library may start in this process (None: its default)."""
    return _WORKER_THREADS


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


def _client(address: str) -> Any:
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(f"--cluster {address}: needs Dask's distributed package (pip install 'qcc[cluster]')") from None
    try:
        return Client(address, timeout=30, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise UsageError(f"--cluster {address}: cannot reach the Dask scheduler ({exc})") from None


def _dask_map(address: str, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    from qcc.errors import InternalError, QccError

    blobs = [_pickled((fn, item)) for item in items]
    with _client(address) as client:
        try:
            return list(client.gather(client.map(_run_pickled, blobs, pure=False)))
        except QccError:
            raise
        except Exception as exc:  # a worker lost, a library missing on the cluster
            raise InternalError(f"--cluster {address}: {type(exc).__name__}: {str(exc)[:300]}") from None


def _pickled(obj: Any) -> bytes:
    """cloudpickle bytes of a job (closures included). An IR graph links every value to its
    producer and users, so pickling recurses about as deep as the graph is long: done on a
    thread with a large stack and recursion limit (unpickling does not recurse)."""
    import sys
    import threading

    import cloudpickle

    out: list[bytes] = []
    errors: list[BaseException] = []

    def dump() -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 200_000))
        try:
            out.append(cloudpickle.dumps(obj))
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)
        finally:
            sys.setrecursionlimit(limit)

    size = threading.stack_size(512 << 20)
    try:
        thread = threading.Thread(target=dump)
        thread.start()
    finally:
        threading.stack_size(size)
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def _run_pickled(blob: bytes) -> Any:
    import pickle

    fn, item = pickle.loads(blob)
    return fn(item)
