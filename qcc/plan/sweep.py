"""The sweep both exact searches walk: buffers by first step, larger first, then position."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qcc.plan.intervals import IntervalArrays


def sweep_order(arr: IntervalArrays) -> list[int]:
    return np.lexsort((np.arange(arr.n), -arr.sizes, arr.firsts)).tolist()  # type: ignore[no-any-return]


def in_buffer_order(order: Sequence[int], values: Sequence[int]) -> list[int]:
    """values[q] belongs to buffer order[q]; the same values indexed by buffer."""
    out = [0] * len(order)
    for q, i in enumerate(order):
        out[i] = values[q]
    return out
