"""Shared-object planning: a buffer id per tensor, cost = sum of the buffer sizes.

The two TFLite GPU strategies of Pisarchyk & Lee 2020 ("Efficient Memory Management for Deep
Neural Net Inference"), the better plan kept, stopping once a plan meets LB_so:
- greedy by breadth: operations by decreasing breadth (sum of live sizes), their tensors by
  decreasing size, each into the smallest free object that holds it, else the largest free one
  (which grows), else a new object;
- greedy by size improved: tensors grouped by positional maximum, then the one closest in time
  to a compatible object goes first and joins that object. The dynamic priority is O(n^2); above
  `dynamic_limit` tensors a static order (position, size) is used instead.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

import attrs
import numpy as np

from qcc.errors import UsageError
from qcc.plan.bounds import positional_maxima_arrays
from qcc.plan.intervals import Buffer, IntervalArrays, as_arrays, coverage

SHARED_METHODS: tuple[str, ...] = ("greedy-breadth", "greedy-size-improved")
_INF = np.iinfo(np.int64).max


@attrs.frozen
class SharedPlan:
    """`assignment[name]` indexes `buffer_sizes`; `total` = sum(buffer_sizes)."""

    assignment: dict[str, int]
    buffer_sizes: tuple[int, ...]
    total: int
    lower_bound: int
    method: str


def plan_shared(
    buffers: Sequence[Buffer],
    *,
    methods: Sequence[str] = SHARED_METHODS,
    dynamic_limit: int = 4096,
) -> SharedPlan:
    """Run `methods` in order, keep the cheapest plan, stop early at LB_so."""
    if not methods:
        raise UsageError("plan_shared: needs at least one method")
    for name in methods:
        if name not in SHARED_METHODS:
            raise UsageError(
                f"plan_shared: unknown method {name!r}; known: {', '.join(SHARED_METHODS)}"
            )
    arr = as_arrays(buffers)
    maxima = positional_maxima_arrays(arr)
    lower = int(maxima.sum())
    best: SharedPlan | None = None
    candidates: list[str] = []
    for name in methods:
        if name == "greedy-size-improved":
            # the O(n^2) dynamic variant only where affordable; the static one is cheap, always try it
            candidates += ["greedy-size-improved"] if arr.n <= dynamic_limit else []
            candidates.append("greedy-size-improved-static")
        else:
            candidates.append(name)
    for name in candidates:
        if name == "greedy-breadth":
            ids = greedy_by_breadth(arr)
        elif name == "greedy-size-improved":
            ids = greedy_by_size_improved(arr, maxima)
        else:
            ids = greedy_by_size_static(arr, maxima)
        plan = shared_plan_from_ids(arr, ids, lower, name)
        if best is None or plan.total < best.total:
            best = plan
        if best.total == lower:
            break
    assert best is not None
    return best


def shared_plan_from_ids(
    arr: IntervalArrays, ids: Sequence[int], lower: int, method: str
) -> SharedPlan:
    """Size each object by its largest tensor."""
    count = max(ids, default=-1) + 1
    sizes = [0] * count
    for obj, size in zip(ids, arr.sizes.tolist()):
        if size > sizes[obj]:
            sizes[obj] = size
    assignment = {name: int(obj) for name, obj in zip(arr.names, ids)}
    return SharedPlan(assignment, tuple(sizes), sum(sizes), lower, method)


class _Objects:
    """Shared objects with their schedules (disjoint lifetimes sorted by first step)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.firsts: list[list[int]] = []
        self.lasts: list[list[int]] = []

    def gap(self, obj: int, first: int, last: int) -> int:
        """0 when the object is busy during [first, last], else the steps to its nearest tensor."""
        firsts = self.firsts[obj]
        k = bisect_left(firsts, first)
        after = firsts[k] - last if k < len(firsts) else _INF
        before = first - self.lasts[obj][k - 1] if k > 0 else _INF
        if after <= 0 or before <= 0:
            return 0
        return min(after, before)

    def add(self, obj: int, first: int, last: int, size: int) -> int:
        if obj == len(self.sizes):
            self.sizes.append(size)
            self.firsts.append([first])
            self.lasts.append([last])
            return obj
        insort(self.firsts[obj], first)
        insort(self.lasts[obj], last)
        self.sizes[obj] = max(self.sizes[obj], size)
        return obj


def greedy_by_breadth(arr: IntervalArrays) -> list[int]:
    """Object id per tensor (TFLite GPU GreedyByBreadthAssignment).

    A tensor is placed while visiting the first operation, in breadth order, where it is live,
    so instead of listing every operation's profile each tensor finds that operation with a
    range-minimum query over the visiting ranks of the starts.
    """
    if arr.n == 0:
        return []
    breadth = coverage(arr, arr.sizes)
    visit = np.lexsort((np.arange(len(breadth)), -breadth))
    rank = np.empty_like(visit)
    rank[visit] = np.arange(len(visit))
    first_visit = _range_min(rank, arr.lo, arr.hi)
    order = np.lexsort((np.arange(arr.n), -arr.sizes, first_visit))
    objects = _Objects()
    by_size: list[tuple[int, int]] = []  # (size, id), sorted
    ids = [0] * arr.n
    firsts, lasts, sizes = arr.firsts.tolist(), arr.lasts.tolist(), arr.sizes.tolist()
    for i in order.tolist():
        f, last, size = firsts[i], lasts[i], sizes[i]
        k = bisect_left(by_size, (size, -1))
        chosen = next((o for _, o in by_size[k:] if objects.gap(o, f, last)), -1)
        if chosen < 0:
            group = -1
            for j in range(k - 1, -1, -1):
                osize, o = by_size[j]
                if group >= 0 and osize != group:
                    break
                if objects.gap(o, f, last):
                    chosen, group = o, osize
        if chosen < 0:
            chosen = len(objects.sizes)
            insort(by_size, (size, chosen))
        elif objects.sizes[chosen] < size:
            by_size.remove((objects.sizes[chosen], chosen))
            insort(by_size, (size, chosen))
        ids[i] = objects.add(chosen, f, last, size)
    return ids


def _range_min(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(values[lo[i]:hi[i]+1]) for every i, via a sparse table."""
    table = [values]
    span = 1
    while 2 * span <= len(values):
        prev = table[-1]
        table.append(np.minimum(prev[:-span], prev[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(length)).astype(np.int64)
    out = np.empty(len(lo), dtype=values.dtype)
    for k in np.unique(level).tolist():
        sel = level == k
        row = table[k]
        out[sel] = np.minimum(row[lo[sel]], row[hi[sel] - (1 << k) + 1])
    return out


def _positions(arr: IntervalArrays, maxima: np.ndarray) -> np.ndarray:
    """Rightmost positional maximum that still holds each tensor."""
    return np.searchsorted(-maxima, -arr.sizes, side="right") - 1


def greedy_by_size_improved(arr: IntervalArrays, maxima: np.ndarray) -> list[int]:
    """Object id per tensor (TFLite GPU GreedyBySizeDistPriorityAssignment), vectorised.

    Next tensor: lowest position, then smallest distance to a compatible object, then largest
    size, then input order; it joins that object (or a new one when none is compatible).
    """
    n = arr.n
    first, last, size = arr.firsts, arr.lasts, arr.sizes
    position = _positions(arr, maxima)
    best_dist = np.full(n, _INF, dtype=np.int64)
    best_obj = np.zeros(n, dtype=np.int64)
    dist = np.full((n, 8), _INF, dtype=np.int64)
    open_ = np.ones(n, dtype=bool)
    ids = [0] * n
    objects = 0
    for _ in range(n):
        cand = np.flatnonzero(open_)
        for key in (position, best_dist, -size):
            sub = key[cand]
            cand = cand[sub == sub.min()]
        b = int(cand[0])
        open_[b] = False
        gap = np.maximum(first[b] - last, first - last[b])
        gap = np.where(gap > 0, gap, _INF)
        if best_dist[b] == _INF:
            obj = objects
            objects += 1
            if obj == dist.shape[1]:
                dist = np.concatenate([dist, np.full_like(dist, _INF)], axis=1)
            dist[:, obj] = gap
            better = open_ & (gap < best_dist)
        else:
            obj = int(best_obj[b])
            rows = open_ & (dist[:, obj] != _INF)
            clash = rows & (gap == _INF)
            dist[clash, obj] = _INF
            redo = np.flatnonzero(clash & (best_obj == obj))
            if len(redo):
                sub = dist[redo, :objects]
                best_dist[redo] = sub.min(axis=1)
                found = best_dist[redo] != _INF
                best_obj[redo[found]] = sub[found].argmin(axis=1)
            keep = rows & ~clash
            dist[keep, obj] = np.minimum(dist[keep, obj], gap[keep])
            better = keep & (gap < best_dist)
        best_dist[better] = gap[better]
        best_obj[better] = obj
        ids[b] = obj
    return ids


def greedy_by_size_static(arr: IntervalArrays, maxima: np.ndarray) -> list[int]:
    """Near-linear stand-in for large graphs: same grouping, fixed order (position, larger
    size first), each tensor joins the compatible object closest in time."""
    position = _positions(arr, maxima)
    order = np.lexsort((np.arange(arr.n), -arr.sizes, position))
    objects = _Objects()
    ids = [0] * arr.n
    firsts, lasts, sizes = arr.firsts.tolist(), arr.lasts.tolist(), arr.sizes.tolist()
    for i in order.tolist():
        f, last = firsts[i], lasts[i]
        chosen, closest = len(objects.sizes), _INF
        for o in range(len(objects.sizes)):
            d = objects.gap(o, f, last)
            if 0 < d < closest:
                chosen, closest = o, d
        ids[i] = objects.add(chosen, f, last, sizes[i])
    return ids
