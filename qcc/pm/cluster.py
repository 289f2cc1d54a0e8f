"""Jobs on a Dask cluster, with every large array sent to the workers once.

A shard of calibration or bias correction holds the model, and the model holds its weights (100
MB for ResNet-50). Pickling the model into every job would send the weights once per shard and
per pass; instead each job is pickled with its large arrays left out, named by a hash of their
contents, and every array reaches a worker once by one of two routes:

- **Files**, when the workers can read the client's files (they run on its machine, or share its
  file system: a probe file with a random token tells). Each array is written once to a
  content-addressed folder (`/dev/shm` where there is one: memory, not disk) and a job names
  the files; a worker reads them, checks every array against its content key (a file that
  differs is never used: the map runs again by scatter) and keeps those that several jobs use
  for later jobs. Writing 100 MB costs the client about 0.1 s where Dask's scatter costs 2-4 s
  (it serializes, copies and sends through the scheduler once per worker), and the workers read
  in parallel; files in /dev/shm are mapped by the workers, not copied (the weights' pages are
  shared by every worker and the folder).
- **Scatter** otherwise: an array that several jobs of a map hold (the weights) is scattered to
  every worker once (`broadcast=True`), an array only one job holds (its shard of the data)
  goes to one worker.

Either way an array is reused by every later job of the process that needs the same contents:
calibration, bias correction, sensitivity ranking and the accuracy search all ship the same
weights. Contents, not object identity, name an array, so a pass that changes a weight ships
the new one, never a stale copy.

One client per scheduler address lives as long as the process (its arrays with it, within
`_KEEP_BYTES`); on a worker an array is read-only, so a job that wrote into a shared weight
would fail instead of changing the next job's input.

A job runs with glibc's adapted heap (qcc.sim.heap: Dask's nanny fixes its thresholds).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import os
import pickle
import secrets
import shutil
import sys
import tempfile
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qcc.errors import InternalError, QccError, UsageError
from qcc.sim.heap import adapted_heap

SHARED_BYTES = 1 << 16
"""Arrays at least this large travel apart from the pickled job (scatter or file)."""

_KEEP_BYTES = 2 << 30
"""Arrays kept per cluster (scattered, or filed and cached by the workers); beyond, the least
recently used are released."""


class Unreadable(Exception):
    """On a worker: a job's array file is missing or differs from its content key."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class _Files:
    """The client's arrays as .npy files named by content key, in a folder of its own."""

    def __init__(self) -> None:
        root = Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())  # memory where it can
        _remove_orphans(root)
        self.folder = Path(tempfile.mkdtemp(prefix=f"qcc-arrays-{os.getpid()}-", dir=root))
        self.paths: dict[str, str] = {}

    def put(self, key: str, array: np.ndarray) -> str:
        path = self.paths.get(key)
        if path is None:
            final = self.folder / (hashlib.blake2b(key.encode(), digest_size=16).hexdigest() + ".npy")
            partial = final.with_suffix(".part")
            with open(partial, "wb") as fh:
                np.lib.format.write_array(fh, array, allow_pickle=False)  # Fortran order kept, as pickle keeps it
            os.replace(partial, final)
            self.paths[key] = path = str(final)
        return path

    def drop(self, key: str) -> None:
        path = self.paths.pop(key, None)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def readable_by(self, client: Any) -> bool:
        """Whether every worker reads this folder as the client wrote it (same machine or file system)."""
        token = secrets.token_hex(16)
        probe = self.folder / "probe"
        probe.write_text(token)
        try:
            answers = client.run(_reads, str(probe), token)
        finally:
            probe.unlink()
        return bool(answers) and all(answers.values())

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.paths.clear()


def _remove_orphans(root: Path) -> None:
    """The folders of clients that ended without removing theirs (killed): files in /dev/shm are
    memory until the machine restarts."""
    for folder in root.glob("qcc-arrays-*-*"):
        pid = folder.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # another user's process: alive
            continue


def _reads(path: str, token: str) -> bool:
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


class _Session:
    """A client, and the arrays already sent through it by content key."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.futures: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.kept: OrderedDict[str, int] = OrderedDict()  # filed arrays the workers keep, and their sizes
        self.sent_bytes = 0  # the shared arrays' bytes sent so far (what each worker received once)
        self.files: _Files | None = None
        self.use_files: bool | None = None  # None: not probed yet

    def filing(self) -> _Files | None:
        """The session's file folder when the workers can read it (probed once), else None."""
        if self.use_files is None:
            try:
                self.files = _Files()
                self.use_files = self.files.readable_by(self.client)
            except OSError:
                self.use_files = False
            if not self.use_files and self.files is not None:
                self.files.close()
                self.files = None
        return self.files if self.use_files else None

    def stop_filing(self) -> None:
        self.use_files = False
        self.kept.clear()
        if self.files is not None:
            self.files.close()
            self.files = None

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

    def paths_for(self, files: _Files, arrays: dict[str, np.ndarray], shared: set[str]) -> dict[str, str]:
        """The files of `arrays`; the `shared` ones are kept (by the workers too) for later jobs."""
        for key in shared:
            if key in self.kept:
                self.kept.move_to_end(key)
            else:
                self.kept[key] = arrays[key].nbytes
                self.sent_bytes += arrays[key].nbytes
        held = sum(self.kept.values())
        for key in list(self.kept):
            if held <= _KEEP_BYTES or key in arrays:
                break
            held -= self.kept.pop(key)
            files.drop(key)
        return {key: files.put(key, array) for key, array in arrays.items()}


_SESSIONS: dict[str, _Session] = {}
_CONNECTING: dict[str, tuple[threading.Thread, list[QccError]]] = {}
_SESSIONS_LOCK = threading.Lock()


def connect_soon(address: str) -> None:
    """Connect to the scheduler at `address` and probe its workers' file access on a thread, while
    this process loads the model and runs the passes before the first map (0.5-0.7 s: importing
    distributed, the handshake, the probe)."""
    with _SESSIONS_LOCK:
        if address in _SESSIONS or address in _CONNECTING:
            return
        errors: list[QccError] = []

        def connect() -> None:
            try:
                session(address, waiting=False).filing()
            except QccError as exc:  # raised again by the first session() that needs it
                errors.append(exc)
            except Exception:  # the first session() connects again and reports what fails
                return

        thread = threading.Thread(target=connect, name="qcc-cluster-connect", daemon=True)
        _CONNECTING[address] = (thread, errors)
    thread.start()


def session(address: str, waiting: bool = True) -> _Session:
    """The process's client for the scheduler at `address` (connected at the first call, or by
    connect_soon's thread, whose end is awaited)."""
    pending = _CONNECTING.get(address) if waiting else None
    if pending is not None:
        pending[0].join()
        _CONNECTING.pop(address, None)
        if pending[1]:
            raise pending[1][0]
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
    with _SESSIONS_LOCK:
        if not _SESSIONS:
            atexit.register(close_sessions)
        _SESSIONS[address] = found = _Session(client)
    return found


def close_sessions() -> None:
    """Disconnect every client (its scattered arrays are released on the workers, its files removed)."""
    for thread, _ in list(_CONNECTING.values()):
        thread.join(timeout=35)  # a connection under way: its session is closed below
    _CONNECTING.clear()
    while _SESSIONS:
        _, found = _SESSIONS.popitem()
        with contextlib.suppress(Exception):  # a scheduler already gone: nothing left to release
            if found.kept:
                found.client.run(_forget, list(found.kept))
            found.client.close(timeout=5)
        if found.files is not None:
            found.files.close()


def dask_map(address: str, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """[fn(item) for item in items] on the cluster's workers, large arrays sent once."""
    found = session(address)
    keys: dict[int, tuple[np.ndarray, str]] = {}  # the jobs share their model: each array hashed once
    jobs = [pickled_job((fn, item), keys) for item in items]
    uses = Counter(key for _, arrays in jobs for key in arrays)
    try:
        files = found.filing()
        if files is not None:
            try:
                return _by_files(found, files, jobs, {k for k, n in uses.items() if n > 1})
            except Unreadable:  # a worker that cannot read the folder, or a file changed: never used
                found.stop_filing()
        return _by_scatter(found, jobs, uses)
    except QccError:
        raise
    except Exception as exc:  # a worker lost, a library missing on the cluster
        raise InternalError(f"--cluster {address}: {type(exc).__name__}: {str(exc)[:300]}") from None


def _by_files(found: _Session, files: _Files, jobs: list[tuple[bytes, dict[str, np.ndarray]]],
              several: set[str]) -> list[Any]:
    own: set[str] = set()
    futures = []
    try:
        for blob, arrays in jobs:
            shared = {k for k in arrays if k in several or k in found.kept}
            own.update(k for k in arrays if k not in shared)
            paths = found.paths_for(files, arrays, shared)
            futures.append(found.client.submit(run_job, blob, {}, paths, shared, pure=False))
        return list(found.client.gather(futures))
    except Unreadable:
        found.client.cancel(futures)
        raise
    finally:
        for key in own - found.kept.keys():  # this map's shards of data: not needed again
            files.drop(key)


def _by_scatter(found: _Session, jobs: list[tuple[bytes, dict[str, np.ndarray]]], uses: Counter[str]) -> list[Any]:
    futures = []
    for blob, arrays in jobs:
        shared = {k: a for k, a in arrays.items() if uses[k] > 1 or k in found.futures}
        own = [k for k in arrays if k not in shared]  # this shard's data: to one worker, not cached
        sent = dict(zip(own, found.client.scatter([arrays[k] for k in own], hash=False))) if own else {}
        futures.append(found.client.submit(run_job, blob, {**found.futures_for(shared), **sent}, pure=False))
    return list(found.client.gather(futures))


def content_key(array: np.ndarray) -> str:
    digest = hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=16)
    return f"{array.dtype.str}{array.shape}{digest.hexdigest()}"


def pickled_job(job: Any, keys: dict[int, tuple[np.ndarray, str]] | None = None) -> tuple[bytes, dict[str, np.ndarray]]:
    """cloudpickle bytes of `job` without its arrays of SHARED_BYTES or more, and those arrays by
    content key; `keys` remembers the keys by array identity, for jobs pickled together (the
    arrays alive and unchanged meanwhile). An IR graph links every value to its producer and users, so pickling recurses
    about as deep as the graph is long: done on a thread with a large stack and recursion limit
    (unpickling does not recurse)."""
    import cloudpickle

    arrays: dict[str, np.ndarray] = {}

    class Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        def persistent_id(self, obj: Any) -> str | None:
            if type(obj) is np.ndarray and obj.nbytes >= SHARED_BYTES and obj.dtype.kind in "biuf":
                known = keys.get(id(obj)) if keys is not None else None
                key = known[1] if known is not None else content_key(obj)
                if keys is not None and known is None:
                    keys[id(obj)] = (obj, key)  # the array held: its id names no other array meanwhile
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


def run_job(blob: bytes, arrays: dict[str, np.ndarray], paths: dict[str, str] | None = None,
            keep: set[str] | frozenset[str] = frozenset()) -> Any:
    """On a worker: the job with its arrays put back, the scattered ones given in `arrays`, the
    filed ones read from `paths` (those in `keep` kept for later jobs). Read-only: shared by later jobs."""
    found = {**arrays, **{key: _filed_array(key, path, key in keep) for key, path in (paths or {}).items()}}

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, key: Any) -> Any:
            array = found[key]
            array.flags.writeable = False
            return array

    fn, item = Unpickler(io.BytesIO(blob)).load()
    with adapted_heap():
        return fn(item)


_MEMORY = "/dev/shm/"
"""Where the client files its arrays when it can: memory (tmpfs) the workers map instead of copying."""

_KEPT: OrderedDict[str, np.ndarray] = OrderedDict()
"""On a worker: the filed arrays that several jobs use, by content key."""
_KEPT_LOCK = threading.Lock()


def _forget(keys: list[str]) -> None:
    """On a worker: the kept arrays of a client that is closing."""
    with _KEPT_LOCK:
        for key in keys:
            _KEPT.pop(key, None)


def _filed_array(key: str, path: str, keep: bool) -> np.ndarray:
    """The array of `key` from the worker's own kept ones or from its file, checked against the key."""
    with _KEPT_LOCK:
        array = _KEPT.get(key)
        if array is not None:
            _KEPT.move_to_end(key)
            return array
    try:
        # a file in memory (tmpfs) is mapped, not copied: no private copy per worker, no page
        # zeroing; the client replaces or unlinks a file, never writes into it, so the mapped
        # pages stay what was checked below
        mapped = path.startswith(_MEMORY)
        array = np.load(path, mmap_mode="r" if mapped else None, allow_pickle=False)
        if mapped:
            array = np.asarray(array)  # a plain ndarray view (the mapping its base), as np.load gives
    except (OSError, ValueError) as exc:
        raise Unreadable(path, f"cannot read it ({type(exc).__name__}: {exc})") from None
    if content_key(array) != key:
        raise Unreadable(path, f"its contents are not {key}")
    array.flags.writeable = False
    if keep:
        with _KEPT_LOCK:
            _KEPT[key] = array
            held = sum(a.nbytes for a in _KEPT.values())
            for old in list(_KEPT):
                if held <= _KEEP_BYTES:
                    break
                held -= _KEPT.pop(old).nbytes
    return array
