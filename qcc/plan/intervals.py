"""Buffers with inclusive step lifetimes, and the array views the planners work on.

The planners never look at the IR: liveness (aliases, in-place options, the execution order) is
decided by the caller, which hands over one `Buffer` per tensor that needs storage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs
import numpy as np

from qcc.errors import UnsupportedError, UsageError

# The conflict graph is materialised; real graphs have a few pairs per tensor.
MAX_CONFLICT_PAIRS = 5_000_000


@attrs.frozen
class Buffer:
    """A tensor needing `size` bytes (or elements) from step `first` to step `last`, inclusive."""

    name: str
    size: int
    first: int
    last: int

    def __attrs_post_init__(self) -> None:
        for field in ("size", "first", "last"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise UsageError(f"buffer {self.name!r}: {field} must be an int, got {value!r}")
        if self.size < 0:
            raise UsageError(f"buffer {self.name!r}: negative size {self.size}")
        if self.first > self.last:
            raise UsageError(
                f"buffer {self.name!r}: lifetime [{self.first}, {self.last}] ends before it starts"
            )

    @property
    def lifetime(self) -> int:
        """Number of steps the buffer is live."""
        return int(self.last) - int(self.first) + 1

    def conflicts(self, other: Buffer) -> bool:
        return conflicts(self, other)


def conflicts(a: Buffer, b: Buffer) -> bool:
    """Two buffers need disjoint storage when their inclusive lifetimes share a step."""
    return a.first <= b.last and b.first <= a.last


@attrs.frozen(eq=False)
class IntervalArrays:
    """Column view of a buffer list (index i = position in the caller's sequence).

    `starts` are the distinct first steps, sorted. Every live set is contained in the live set
    of the latest start at or before it, so all maxima over steps (peak load, k-th largest live
    size, breadth) are attained at starts: `lo`/`hi` give each buffer's range of start indices.
    """

    names: tuple[str, ...]
    sizes: np.ndarray
    firsts: np.ndarray
    lasts: np.ndarray
    starts: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def n(self) -> int:
        return len(self.names)


def as_arrays(buffers: Sequence[Buffer], scale: int = 1) -> IntervalArrays:
    """Validate names and build the column view; `scale` > 1 rounds sizes up to that unit."""
    names = tuple(b.name for b in buffers)
    if len(set(names)) != len(names):
        dups = sorted(name for name, k in Counter(names).items() if k > 1)
        raise UsageError(f"duplicate buffer names: {', '.join(map(repr, dups[:10]))}")
    n = len(names)
    sizes = np.fromiter((b.size for b in buffers), dtype=np.int64, count=n)
    if scale > 1:
        sizes = -(-sizes // scale)
    firsts = np.fromiter((b.first for b in buffers), dtype=np.int64, count=n)
    lasts = np.fromiter((b.last for b in buffers), dtype=np.int64, count=n)
    starts = np.unique(firsts)
    lo = np.searchsorted(starts, firsts)
    hi = np.searchsorted(starts, lasts, side="right") - 1
    return IntervalArrays(names, sizes, firsts, lasts, starts, lo, hi)


def coverage(arr: IntervalArrays, weights: np.ndarray) -> np.ndarray:
    """Sum of `weights` over the buffers live at each start (int64, exact)."""
    diff = np.zeros(len(arr.starts) + 1, dtype=np.int64)
    np.add.at(diff, arr.lo, weights)
    np.add.at(diff, arr.hi + 1, -weights)
    return np.cumsum(diff[:-1])


def conflict_pairs(
    arr: IntervalArrays, limit: int = MAX_CONFLICT_PAIRS
) -> tuple[np.ndarray, np.ndarray]:
    """Every conflicting pair once, as (a, b) index arrays.

    Sorted by first step, buffer b conflicts with an earlier a exactly when b starts inside a's
    lifetime, so each a pairs with a contiguous run of later buffers: O(n log n + pairs).
    """
    order = np.argsort(arr.firsts, kind="stable")
    fs = arr.firsts[order]
    stop = np.searchsorted(fs, arr.lasts[order], side="right")
    count = stop - np.arange(1, arr.n + 1)
    total = int(count.sum())
    if total > limit:
        raise UnsupportedError(
            f"{arr.n} buffers have {total} pairs of overlapping lifetimes (limit {limit}); "
            "memory planning needs the conflict graph"
        )
    src = np.repeat(np.arange(arr.n), count)
    # position of each pair's partner: src+1, src+2, ... within each run
    run_start = np.cumsum(count) - count
    dst = np.arange(total) - np.repeat(run_start, count) + src + 1
    return order[src], order[dst]


def conflict_lists(arr: IntervalArrays) -> list[list[int]]:
    """Adjacency lists of the conflict (interval) graph."""
    a, b = conflict_pairs(arr)
    rows = np.concatenate([a, b])
    cols = np.concatenate([b, a])
    perm = np.argsort(rows, kind="stable")
    cols_sorted = cols[perm].tolist()
    bounds = np.searchsorted(rows[perm], np.arange(arr.n + 1)).tolist()
    return [cols_sorted[bounds[i] : bounds[i + 1]] for i in range(arr.n)]
