"""Which threads ran the convolutions, and BLAS's thread counts: the calibration threading tests'
two probes (threads must be the intended ones, and BLAS limits restored after)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import qcc.ir.ops.nn as nn_ops


def blas_threads() -> list[int]:
    import threadpoolctl

    return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]


def conv_threads(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the threads that call nn.conv2d from now on (the set fills as they run)."""
    ran_on: set[str] = set()
    conv2d = nn_ops.conv2d

    def spy(*args: Any, **kwargs: Any) -> np.ndarray:
        ran_on.add(threading.current_thread().name)
        return conv2d(*args, **kwargs)

    monkeypatch.setattr(nn_ops, "conv2d", spy)
    return ran_on
