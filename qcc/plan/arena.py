"""Arena (offset) planning: one block, an offset per buffer, cost = max(offset + size).

Greedy placement (TFLite Micro / TFLite GPU style) under several orders and two fits, the best
kept, stopping as soon as a plan meets LB_off; then, for small problems, an exact branch and
bound with a time budget. Each placement only looks at the already placed buffers whose
lifetimes intersect (the interval graph is built once, in O(n log n + conflicts)).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import numpy as np

from qcc.errors import UsageError
from qcc.plan.bounds import lb_offsets_arrays
from qcc.plan.intervals import Buffer, IntervalArrays, as_arrays, conflict_lists

ORDERS: tuple[str, ...] = ("size", "size-lifetime", "first-use", "conflicts")
FITS: tuple[str, ...] = ("best-fit", "first-fit")


@attrs.frozen
class ArenaPlan:
    """Offsets into one arena. `total` is rounded up to `alignment`; so is `lower_bound`
    (LB_off of the sizes padded to the alignment, a valid bound for aligned plans).
    `optimal` is True when the plan meets the bound or the exact search proved it."""

    offsets: dict[str, int]
    total: int
    lower_bound: int
    method: str
    optimal: bool
    alignment: int = 1


def plan_arena(
    buffers: Sequence[Buffer],
    *,
    alignment: int = 1,
    orders: Sequence[str] = ORDERS,
    fits: Sequence[str] = FITS,
    exact_limit: int = 40,
    time_budget: float = 1.0,
) -> ArenaPlan:
    """Best of the greedy heuristics, then branch and bound when len(buffers) <= exact_limit.

    Method names: "greedy/<order>/<fit>" or "branch-and-bound". `time_budget` (seconds) bounds
    the exact search only; the heuristics are near-linear and always run to completion.
    """
    if alignment < 1:
        raise UsageError(f"plan_arena: alignment must be >= 1, got {alignment}")
    for name in orders:
        if name not in ORDERS:
            raise UsageError(f"plan_arena: unknown order {name!r}; known: {', '.join(ORDERS)}")
    for name in fits:
        if name not in FITS:
            raise UsageError(f"plan_arena: unknown fit {name!r}; known: {', '.join(FITS)}")
    if not orders or not fits:
        raise UsageError("plan_arena: needs at least one order and one fit")
    arr = as_arrays(buffers, scale=alignment)
    lower = lb_offsets_arrays(arr)
    sizes = arr.sizes.tolist()
    adj = conflict_lists(arr)

    best: list[int] | None = None
    best_total = 0
    method = ""
    for order_name in orders:
        order = _order(arr, adj, order_name)
        for fit in fits:
            cutoff = best_total if best is not None else None
            placed = _greedy(order, sizes, adj, fit == "best-fit", cutoff)
            if placed is not None:
                best, best_total, method = placed[0], placed[1], f"greedy/{order_name}/{fit}"
            if best_total == lower:
                break
        if best_total == lower:
            break
    assert best is not None
    optimal = best_total == lower
    if not optimal and 0 < arr.n <= exact_limit:
        found, proved = _branch_and_bound(arr, adj, lower, best_total, time_budget)
        if found is not None:
            best, method = found, "branch-and-bound"
            best_total = max(o + s for o, s in zip(found, sizes))
        optimal = proved or best_total == lower
    offsets = {name: off * alignment for name, off in zip(arr.names, best)}
    return ArenaPlan(offsets, best_total * alignment, lower * alignment, method, optimal, alignment)


def _order(arr: IntervalArrays, adj: list[list[int]], name: str) -> list[int]:
    """Placement order; ties fall back to larger size, then input position (deterministic)."""
    idx = np.arange(arr.n)
    if name == "size":
        keys: tuple[np.ndarray, ...] = (idx, -arr.sizes)
    elif name == "size-lifetime":
        keys = (idx, -arr.sizes, -arr.sizes * (arr.lasts - arr.firsts + 1))
    elif name == "first-use":
        keys = (idx, -arr.sizes, arr.firsts)
    else:
        degree = np.fromiter((len(a) for a in adj), dtype=np.int64, count=arr.n)
        keys = (idx, -arr.sizes, -degree)
    return np.lexsort(keys).tolist()


def _greedy(
    order: list[int], sizes: list[int], adj: list[list[int]], best_fit: bool, cutoff: int | None
) -> tuple[list[int], int] | None:
    """Place each buffer in the lowest (first-fit) or tightest (best-fit) gap between the placed
    buffers it conflicts with, else on top of them. None once the total reaches `cutoff`."""
    span: list[tuple[int, int] | None] = [None] * len(sizes)  # (offset, end) once placed
    total = 0
    for i in order:
        size = sizes[i]
        # filter/map keep the per-neighbour work in C: this loop is the planner's hot spot
        used = sorted(filter(None, map(span.__getitem__, adj[i])))  # type: ignore[arg-type]
        top = 0
        chosen = -1
        tightest = -1
        for lo, hi in used:
            gap = lo - top
            if gap >= size and (chosen < 0 or gap < tightest):
                chosen, tightest = top, gap
                if not best_fit:
                    break
            if hi > top:
                top = hi
        at = chosen if chosen >= 0 else top
        span[i] = (at, at + size)
        if at + size > total:
            total = at + size
            if cutoff is not None and total >= cutoff:
                return None
    return [s[0] if s else 0 for s in span], total


class _OutOfTime(Exception):
    pass


def _branch_and_bound(
    arr: IntervalArrays, adj: list[list[int]], lower: int, upper: int, budget: float
) -> tuple[list[int] | None, bool]:
    """Exact search below `upper`: (offsets or None if nothing better, proved optimal).

    Some optimal plan has every buffer at 0 or on top of a conflicting one; listing its buffers
    by offset, each sits at max(previous offset, highest top among its placed neighbours). So
    the search picks the next buffer and puts it there (candidate offsets {0} U {o_j + s_j}),
    with offsets non-decreasing. Pruning: per maximal clique, max(level, highest placed top in
    it) plus its unplaced sizes is a bound (placed buffers of a clique are disjoint and start at
    or below the level, so at most one crosses it); swaps of non-conflicting neighbours that
    reach the same state and identical twins are explored once.
    """
    sizes = arr.sizes.tolist()
    live = [i for i in range(arr.n) if sizes[i] > 0]
    result = [0] * arr.n
    cliques_np = np.unique(arr.hi)
    clique_members: list[list[int]] = [[] for _ in cliques_np]
    for c, p in enumerate(cliques_np.tolist()):
        clique_members[c] = [i for i in live if arr.lo[i] <= p <= arr.hi[i]]
    in_cliques: list[list[int]] = [[] for _ in range(arr.n)]
    for c, members in enumerate(clique_members):
        for i in members:
            in_cliques[i].append(c)
    unplaced_sum = [sum(sizes[i] for i in members) for members in clique_members]
    placed_top = [0] * len(clique_members)
    twin_before = [-1] * arr.n
    seen: dict[tuple[int, int, int], int] = {}
    for i in live:
        key = (sizes[i], int(arr.firsts[i]), int(arr.lasts[i]))
        twin_before[i] = seen.get(key, -1)
        seen[key] = i
    offset = [-1] * arr.n
    nb_top = [0] * arr.n  # highest top among placed neighbours
    best = [upper]
    best_offsets: list[list[int]] = []
    deadline = time.monotonic() + budget
    nodes = [0]
    member = [set(c) for c in in_cliques]

    def bound_after(i: int, at: int) -> int:
        """Clique bound of the state after placing i at `at` (which becomes the level)."""
        top = at + sizes[i]
        out = 0
        for c in range(len(clique_members)):
            h = placed_top[c] if placed_top[c] > at else at
            u = unplaced_sum[c]
            if c in member[i]:
                h = top if top > h else h
                u -= sizes[i]
            out = h + u if h + u > out else out
        return out

    def search(depth: int, level: int, parent_level: int, last: int) -> None:
        nodes[0] += 1
        if nodes[0] & 1023 == 0 and time.monotonic() > deadline:
            raise _OutOfTime
        if depth == len(live):
            total = max(placed_top) if placed_top else 0
            if total < best[0]:
                best[0] = total
                best_offsets[:] = [offset.copy()]
            return
        children = []
        for i in live:
            if offset[i] >= 0 or (twin_before[i] >= 0 and offset[twin_before[i]] < 0):
                continue
            at = nb_top[i] if nb_top[i] > level else level
            if (
                last >= 0
                and at == level
                and i < last
                and (parent_level == level or nb_top[i] == level)
            ):
                continue  # placing i before `last` reaches the same state
            b = bound_after(i, at)
            if b < best[0]:
                children.append((b, at, -sizes[i], i))
        children.sort()
        for b, at, _, i in children:
            if b >= best[0]:
                break
            top = at + sizes[i]
            offset[i] = at
            saved_nb = [(j, nb_top[j]) for j in adj[i]]
            for j in adj[i]:
                if top > nb_top[j]:
                    nb_top[j] = top
            saved_c = [(c, placed_top[c]) for c in in_cliques[i]]
            for c in in_cliques[i]:
                unplaced_sum[c] -= sizes[i]
                if top > placed_top[c]:
                    placed_top[c] = top
            search(depth + 1, at, level, i)
            for c, value in saved_c:
                unplaced_sum[c] += sizes[i]
                placed_top[c] = value
            for j, value in saved_nb:
                nb_top[j] = value
            offset[i] = -1
            if best[0] == lower:
                return

    proved = True
    try:
        search(0, 0, 0, -1)
    except _OutOfTime:
        proved = False
    if not best_offsets:
        return None, proved
    for i in live:
        result[i] = best_offsets[0][i]
    return result, proved
