"""An observer that runs on its own thread, so a run computes the next node while it observes.

numpy's ufuncs, bincount and BLAS release the GIL: a calibration run histograms one activation
while the interpreter (or onnxruntime) computes the next. Calls reach the wrapped observer in
the order they were made, on one thread, so what it computes is exactly what calling it inline
computes. Kernels return new arrays and never write into their inputs, so an array handed over
is not changed while it waits; at most `depth` arrays wait (memory stays bounded).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from qcc.ir.core import Value
from qcc.sim.engine import Observer

_STOP = object()


class BackgroundObserver:
    """`observer` called on a worker thread; `drain()` waits until every call so far has run and
    re-raises the first exception one of them raised."""

    def __init__(self, observer: Observer, depth: int = 4) -> None:
        self.observer = observer
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="qcc-observer", daemon=True)
        self._thread.start()

    def __call__(self, value: Value, array: np.ndarray) -> None:
        if self._error is None:
            self._queue.put((self.observer, (value, array)))

    def call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the worker thread after the observations made so far."""
        if self._error is None:
            self._queue.put((fn, ()))

    def drain(self) -> None:
        self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()

    def __enter__(self) -> BackgroundObserver:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:
                    fn, args = item
                    fn(*args)
            except BaseException as exc:  # handed to the caller by drain()
                self._error = exc
            finally:
                self._queue.task_done()
