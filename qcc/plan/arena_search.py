"""Search for arena plans below the greedy ones, down to LB_off.

Greedy placement by size leaves holes on graphs with many equal sizes (densenet's concat chain:
1.048 x LB_off; synthetic branchy graphs: 1.13). This searches placements under a capacity: it
sweeps buffers in order of first use and puts each into a hole between the buffers live at that
step, at the hole's bottom or top, smallest hole first, backtracking on a dead end. A state (the
position plus the live buffers' offsets, ends and last steps) that failed once is not searched
again. The capacity starts at LB_off (a plan there is optimal) and is then bisected between the
lowest capacity not yet reached and the best plan, within the time budget.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from qcc.plan.arena import ArenaPlan
from qcc.plan.intervals import Buffer, IntervalArrays, as_arrays
from qcc.plan.sweep import in_buffer_order, sweep_order


class _OutOfTime(Exception):
    pass


def search_arena(buffers: Sequence[Buffer], plan: ArenaPlan, *, time_budget: float = 1.0) -> ArenaPlan:
    """A plan at most as large as `plan` (the same object when the search finds nothing)."""
    if plan.total <= plan.lower_bound or not buffers or time_budget <= 0:
        return plan
    align = plan.alignment
    arr = as_arrays(buffers, scale=align)
    lower, best_total = plan.lower_bound // align, plan.total // align
    best: list[int] | None = None
    start = time.monotonic()
    deadline = start + time_budget
    cap = lower
    share = 0.4  # of the budget for the first try, at the bound
    while cap < best_total:
        now = time.monotonic()
        if now >= deadline:
            break
        try:
            found = fit_arena(arr, cap, min(deadline, now + share * (deadline - now)))
        except _OutOfTime:
            found = None
        if found is not None:
            best = found
            best_total = max((o + s for o, s in zip(found, arr.sizes.tolist())), default=0)
        else:
            lower = cap + 1
        share = 0.5
        cap = (lower + best_total) // 2
    if best is None:
        return plan
    return ArenaPlan(
        {name: off * align for name, off in zip(arr.names, best)},
        best_total * align,
        plan.lower_bound,
        f"{plan.method}+sweep-search",
        best_total * align == plan.lower_bound,
        align,
    )


def fit_arena(arr: IntervalArrays, cap: int, deadline: float) -> list[int] | None:
    """Offsets (in `arr`'s units) keeping every buffer below `cap`, or None when the search
    space is exhausted. Raises _OutOfTime past `deadline`."""
    n = arr.n
    order = sweep_order(arr)
    firsts = arr.firsts[order].tolist()
    lasts = arr.lasts[order].tolist()
    sizes = arr.sizes[order].tolist()
    if n == 0:
        return []
    if max(sizes) > cap:
        return None
    active: list[tuple[int, int, int]] = []  # (offset, end, last step) of the buffers live now
    offsets = [0] * n
    failed: set[tuple[int, tuple[tuple[int, int, int], ...]]] = set()

    def options(p: int) -> list[int]:
        """Bottom and top of every hole that holds buffer p, smallest hole first."""
        size = sizes[p]
        holes = []
        top = 0
        for low, high, _ in sorted(active):
            if low - top >= size:
                holes.append((low - top, top))
            top = max(top, high)
        if cap - top >= size:
            holes.append((cap - top, top))
        holes.sort()
        out = []
        for room, bottom in holes:
            out.append(bottom)
            if room > size:
                out.append(bottom + room - size)
        return out

    # frame: position, untried offsets, the entry placed, entries that ended before it started
    frames: list[tuple[int, list[int], list[tuple[int, int, int]]]] = [(0, options(0), [])]
    placed: list[tuple[int, int, int] | None] = [None]
    steps = 0
    while frames:
        steps += 1
        if steps & 127 == 0 and time.monotonic() > deadline:
            raise _OutOfTime
        p, untried, ended = frames[-1]
        if placed[-1] is not None:
            active.remove(placed[-1])
            placed[-1] = None
        if not untried:
            failed.add((p, tuple(sorted(active))))
            frames.pop()
            placed.pop()
            active.extend(ended)
            continue
        at = untried.pop(0)
        entry = (at, at + sizes[p], lasts[p])
        active.append(entry)
        placed[-1] = entry
        offsets[p] = at
        if p + 1 == n:
            return in_buffer_order(order, offsets)
        nxt = firsts[p + 1]
        gone = [e for e in active if e[2] < nxt]
        if gone:
            active[:] = [e for e in active if e[2] >= nxt]
        if (p + 1, tuple(sorted(active))) in failed:
            active.extend(gone)
            continue
        frames.append((p + 1, options(p + 1), gone))
        placed.append(None)
    return None
