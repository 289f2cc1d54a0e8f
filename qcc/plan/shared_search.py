"""Exact search for shared-object plans: LB_so when it is reachable, else the optimum.

A plan costs LB_so exactly when the tensors fit into K objects whose sizes are the positional
maxima m_0 >= ... >= m_{K-1} (K = peak live count): every plan's k-th largest object is at least
m_k. Deciding that is interval scheduling on K machines with nested eligibility (a tensor fits
the objects at least its size), which the greedy sweep nnabla uses (smallest free object that
fits) does not always solve. This is that sweep made exact: tensors in order of first use, each
into a free object that fits, trying one object per distinct size (free objects of equal size
are interchangeable), and backtracking on a dead end. A state is the position in the sweep plus,
per object size, the sorted steps at which its objects become free (objects already free are
all alike), so a state that failed once is never searched again: on real networks the search is
near-linear, and when it runs out of choices it has proved LB_so unreachable. Then object size
lists above the maxima are checked cheapest first, which finds the optimum or proves the
heuristic plan optimal (MobileNetV2: LB_so is 1% below what any plan can reach), within a time
budget.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Sequence

from qcc.plan.bounds import positional_maxima_arrays
from qcc.plan.intervals import Buffer, IntervalArrays, as_arrays
from qcc.plan.shared import SharedPlan, shared_plan_from_ids
from qcc.plan.sweep import in_buffer_order, sweep_order


class _OutOfTime(Exception):
    pass


def search_shared(
    buffers: Sequence[Buffer],
    plan: SharedPlan,
    *,
    time_budget: float = 0.5,
    limit: int = 20_000,
) -> tuple[SharedPlan, bool]:
    """A plan at most as costly as `plan`, and whether it is proved optimal.

    Object size lists are visited cheapest first from the positional maxima (raise one size to
    the next tensor size, or add an object of the smallest tensor size); the first list the
    tensors fit is optimal, and when every list cheaper than `plan` fails, `plan` is. Buffers
    beyond `limit` are left to the heuristics (each check is O(K) per buffer).
    """
    arr = as_arrays(buffers)
    if plan.total <= plan.lower_bound:
        return plan, True
    if arr.n > limit:
        return plan, False
    deadline = time.monotonic() + time_budget
    maxima = tuple(positional_maxima_arrays(arr).tolist())
    distinct = sorted(set(s for s in arr.sizes.tolist() if s > 0))
    heap = [(plan.lower_bound, maxima)]
    seen = {maxima}
    try:
        while heap:
            cost, caps = heapq.heappop(heap)
            if cost >= plan.total:
                break
            if time.monotonic() > deadline:
                raise _OutOfTime
            ids = fit_objects(arr, caps, deadline)
            if ids is not None:
                method = "sweep-search" if cost == plan.lower_bound else "sweep-search+sizes"
                return shared_plan_from_ids(arr, ids, plan.lower_bound, method), True
            for more, bigger in _successors(caps, distinct):
                if cost + more < plan.total and bigger not in seen:
                    seen.add(bigger)
                    heapq.heappush(heap, (cost + more, bigger))
    except _OutOfTime:
        return plan, False
    return plan, True


def _successors(caps: tuple[int, ...], distinct: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(added cost, sizes) one step up: one object raised to the next tensor size, or a new
    object of the smallest size. Every sorted size list above `caps` is reached this way
    through lists of lower cost, so a cheapest-first walk meets them in cost order."""
    out = []
    for k, cap in enumerate(caps):
        if k and caps[k - 1] == cap:
            continue  # raising either of two equal objects gives the same list
        i = bisect.bisect_right(distinct, cap)
        if i < len(distinct):
            raised = tuple(sorted((*caps[:k], distinct[i], *caps[k + 1 :]), reverse=True))
            out.append((distinct[i] - cap, raised))
    if distinct:
        out.append((distinct[0], tuple(sorted((*caps, distinct[0]), reverse=True))))
    return out


def fit_objects(arr: IntervalArrays, caps: Sequence[int], deadline: float) -> list[int] | None:
    """Object id per buffer with objects of sizes `caps`, or None when none exists.

    Raises _OutOfTime past `deadline`.
    """
    sizes = sorted(caps, reverse=True)
    groups: list[list[int]] = []  # object ids of equal size, largest size first
    for obj, size in enumerate(sizes):
        if groups and sizes[groups[-1][0]] == size:
            groups[-1].append(obj)
        else:
            groups.append([obj])
    group_sizes = [-sizes[g[0]] for g in groups]
    order = sweep_order(arr)
    firsts = arr.firsts[order].tolist()
    lasts = arr.lasts[order].tolist()
    # groups[:fits[p]] hold tensor p
    fits = [bisect.bisect_right(group_sizes, -s) for s in arr.sizes[order].tolist()]
    n = len(order)
    busy = [-1] * len(sizes)  # last step of each object's current tensor
    chosen = [-1] * n
    failed: set[tuple[int, tuple[tuple[int, ...], ...]]] = set()

    def state(p: int) -> tuple[int, tuple[tuple[int, ...], ...]]:
        f = firsts[p]
        return p, tuple(tuple(sorted(busy[o] if busy[o] >= f else -1 for o in g)) for g in groups)

    def options(p: int) -> list[int]:
        """One free object per fitting size, the smallest size first (nnabla's choice)."""
        f = firsts[p]
        out = []
        for g in range(fits[p] - 1, -1, -1):
            for obj in groups[g]:
                if busy[obj] < f:
                    out.append(obj)
                    break
        return out

    if n == 0:
        return []
    # frame: position, its state key, untried objects, previous busy of the object in use
    stack: list[list] = [[0, state(0), options(0), -1]]
    steps = 0
    while stack:
        steps += 1
        if steps & 127 == 0 and time.monotonic() > deadline:
            raise _OutOfTime
        frame = stack[-1]
        p = frame[0]
        if chosen[p] >= 0:  # undo the previous try
            busy[chosen[p]] = frame[3]
            chosen[p] = -1
        if not frame[2]:
            failed.add(frame[1])
            stack.pop()
            continue
        obj = frame[2].pop(0)
        frame[3] = busy[obj]
        busy[obj] = lasts[p]
        chosen[p] = obj
        if p + 1 == n:
            return in_buffer_order(order, chosen)
        key = state(p + 1)
        if key not in failed:
            stack.append([p + 1, key, options(p + 1), -1])
    return None
