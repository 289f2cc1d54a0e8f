"""Jobs on a Dask cluster, with every large array sent to the workers once.

A shard of calibration or bias correction holds the model, and the model holds its weights (100
MB for ResNet-50). Pickling the model into every job would send the weights once per shard and
per pass; instead each job is pickled with its large arrays left out, named by a hash of their
contents. An array that several jobs of a map hold (the weights) is scattered to every worker
once (`broadcast=True`) and reused by every later job of the process that needs the same
contents: calibration, bias correction, sensitivity ranking and the accuracy search all ship
the same weights. An array only one job holds (its shard of the data) goes to one worker. Contents, not object
identity, name an array, so a pass that changes a weight ships the new one, never a stale copy.

One client per scheduler address lives as long as the process (its scattered arrays with it,
within `_KEEP_BYTES`); unpickling on a worker reads the scattered array, made read-only, so a
job that wrote into a shared weight would fail instead of changing the next job's input.

A job runs with glibc's adapted heap (qcc.sim.heap: Dask's nanny fixes its thresholds).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import pickle
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from qcc.errors import InternalError, QccError, UsageError
from qcc.sim.heap import adapted_heap

SHARED_BYTES = 1 << 16
"""Arrays at least this large travel by scatter; smaller ones inside the pickled job."""

_KEEP_BYTES = 2 << 30
"""Scattered arrays kept per cluster; beyond, the least recently used are released."""


class _Session:
    """A client, and the arrays already scattered through it by content key."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.futures: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.sent_bytes = 0  # the arrays' bytes scattered so far (what the workers received once)

    def futures_for(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        for key, array in arrays.items():
            if key in self.futures:
                self.futures.move_to_end(key)
                continue
            future = self.client.scatter(array, broadcast=True, hash=False)
            self.futures[key] = (future, array.nbytes)
            self.sent_bytes += array.nbytes
        held = sum(size for _, size in self.futures.values())
        for key in list(self.futures):
            if held <= _KEEP_BYTES or key in arrays:
                break
            held -= self.futures.pop(key)[1]
        return {key: self.futures[key][0] for key in arrays}


_SESSIONS: dict[str, _Session] = {}


def session(address: str) -> _Session:
    """The process's client for the scheduler at `address` (connected at the first call)."""
    found = _SESSIONS.get(address)
    if found is not None:
        return found
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(f"--cluster {address}: needs Dask's distributed package (pip install 'qcc[cluster]')") from None
    try:
        client = Client(address, timeout=30, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise UsageError(f"--cluster {address}: cannot reach the Dask scheduler ({exc})") from None
    if not _SESSIONS:
        atexit.register(close_sessions)
    _SESSIONS[address] = found = _Session(client)
    return found


def close_sessions() -> None:
    """Disconnect every client (its scattered arrays are released on the workers)."""
    while _SESSIONS:
        _, found = _SESSIONS.popitem()
        with contextlib.suppress(Exception):  # a scheduler already gone: nothing left to release
            found.client.close(timeout=5)


def dask_map(address: str, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """[fn(item) for item in items] on the cluster's workers, large arrays scattered once."""
    found = session(address)
    jobs = [pickled_job((fn, item)) for item in items]
    uses = Counter(key for _, arrays in jobs for key in arrays)
    try:
        futures = []
        for blob, arrays in jobs:
            shared = {k: a for k, a in arrays.items() if uses[k] > 1 or k in found.futures}
            own = [k for k in arrays if k not in shared]  # this shard's data: to one worker, not cached
            sent = dict(zip(own, found.client.scatter([arrays[k] for k in own], hash=False))) if own else {}
            futures.append(found.client.submit(run_job, blob, {**found.futures_for(shared), **sent}, pure=False))
        return list(found.client.gather(futures))
    except QccError:
        raise
    except Exception as exc:  # a worker lost, a library missing on the cluster
        raise InternalError(f"--cluster {address}: {type(exc).__name__}: {str(exc)[:300]}") from None


def content_key(array: np.ndarray) -> str:
    digest = hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=16)
    return f"{array.dtype.str}{array.shape}{digest.hexdigest()}"


def pickled_job(job: Any) -> tuple[bytes, dict[str, np.ndarray]]:
    """cloudpickle bytes of `job` without its arrays of SHARED_BYTES or more, and those arrays by
    content key. An IR graph links every value to its producer and users, so pickling recurses
    about as deep as the graph is long: done on a thread with a large stack and recursion limit
    (unpickling does not recurse)."""
    import cloudpickle

    arrays: dict[str, np.ndarray] = {}

    class Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        def persistent_id(self, obj: Any) -> str | None:
            if type(obj) is np.ndarray and obj.nbytes >= SHARED_BYTES and obj.dtype.kind in "biuf":
                key = content_key(obj)
                arrays[key] = obj
                return key
            return None

    out: list[bytes] = []
    errors: list[BaseException] = []

    def dump() -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 200_000))
        try:
            buffer = io.BytesIO()
            Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(job)
            out.append(buffer.getvalue())
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
    return out[0], arrays


def run_job(blob: bytes, arrays: dict[str, np.ndarray]) -> Any:
    """On a worker: the job with its shared arrays put back (read-only: shared by later jobs)."""

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, key: Any) -> Any:
            array = arrays[key]
            array.flags.writeable = False
            return array

    fn, item = Unpickler(io.BytesIO(blob)).load()
    with adapted_heap():
        return fn(item)
