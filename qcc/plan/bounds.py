"""Lower bounds that every plan is reported against (see docs/memory-planning.md).

LB_off (arena) is the peak live load. LB_so (shared objects) is the sum of the positional
maxima: the k-th largest live size, maximised over steps, summed over k. Both only need the
steps where some buffer starts (`IntervalArrays.starts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qcc.plan.intervals import Buffer, IntervalArrays, as_arrays, coverage

# Above this many (buffer, maximal clique) pairs the positional maxima switch from the
# vectorised clique expansion to an O(n log n) segment tree.
_PAIR_LIMIT = 2_000_000


def naive_size(buffers: Sequence[Buffer]) -> int:
    """Storage without any reuse (one buffer per tensor)."""
    return sum(int(b.size) for b in buffers)


def lb_offsets(buffers: Sequence[Buffer]) -> int:
    """LB_off: maximum over steps of the summed sizes of the live buffers."""
    return lb_offsets_arrays(as_arrays(buffers))


def lb_offsets_arrays(arr: IntervalArrays) -> int:
    if arr.n == 0:
        return 0
    return int(coverage(arr, arr.sizes).max())


def positional_maxima(buffers: Sequence[Buffer]) -> tuple[int, ...]:
    """Element k is the largest k-th biggest live size over all steps (non-increasing).

    Its length is the peak live count; it is the per-rank sizing nnabla and TFLite GPU use.
    """
    return tuple(int(x) for x in positional_maxima_arrays(as_arrays(buffers)))


def lb_shared(buffers: Sequence[Buffer]) -> int:
    """LB_so: sum of the positional maxima; no shared-object plan can cost less."""
    return int(positional_maxima_arrays(as_arrays(buffers)).sum())


def positional_maxima_arrays(arr: IntervalArrays, pair_limit: int = _PAIR_LIMIT) -> np.ndarray:
    if arr.n == 0:
        return np.zeros(0, dtype=np.int64)
    cliques = _maximal_starts(arr)
    a = np.searchsorted(cliques, arr.lo)
    b = np.searchsorted(cliques, arr.hi, side="right")
    if int((b - a).sum()) <= pair_limit:
        return _maxima_by_cliques(arr, cliques, a, b)
    return _maxima_by_segment_tree(arr)


def _maximal_starts(arr: IntervalArrays) -> np.ndarray:
    """Start indices after which some buffer dies: the live sets there are the maximal ones."""
    return np.unique(arr.hi)


def _maxima_by_cliques(
    arr: IntervalArrays, cliques: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """Expand every (buffer, maximal clique) pair, rank sizes inside each clique, max per rank."""
    count = b - a
    total = int(count.sum())
    owner = np.repeat(np.arange(arr.n), count)
    run_start = np.cumsum(count) - count
    clique = np.arange(total) - np.repeat(run_start, count) + np.repeat(a, count)
    size = arr.sizes[owner]
    order = np.lexsort((-size, clique))
    clique, size = clique[order], size[order]
    first_of_clique = np.searchsorted(clique, clique)
    rank = np.arange(total) - first_of_clique
    out = np.zeros(int(rank.max()) + 1, dtype=np.int64)
    np.maximum.at(out, rank, size)
    return out


def _maxima_by_segment_tree(arr: IntervalArrays) -> np.ndarray:
    """Insert buffers by decreasing size; rank k's maximum is the size at which the peak live
    count first reaches k+1. A max segment tree over starts gives that count in O(log n)."""
    width = 1 << max(1, (len(arr.starts) - 1).bit_length())
    own = [0] * (2 * width)  # additions stored at a node
    best = [0] * (2 * width)  # own + max over children
    out: list[int] = []
    order = np.argsort(-arr.sizes, kind="stable")
    for lo, hi, size in zip(
        arr.lo[order].tolist(), arr.hi[order].tolist(), arr.sizes[order].tolist()
    ):
        left, right = lo + width, hi + width + 1
        edges = (left, right - 1)
        while left < right:
            if left & 1:
                own[left] += 1
                best[left] += 1
                left += 1
            if right & 1:
                right -= 1
                own[right] += 1
                best[right] += 1
            left >>= 1
            right >>= 1
        for node in edges:
            node >>= 1
            while node:
                lc = best[2 * node]
                rc = best[2 * node + 1]
                best[node] = own[node] + (lc if lc > rc else rc)
                node >>= 1
        if best[1] > len(out):
            out.append(size)
    return np.asarray(out, dtype=np.int64)
