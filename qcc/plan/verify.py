"""Independent plan checks: every problem is listed, an empty list means the plan is valid.

Backends run these before emitting a plan, and the tests run them on every plan produced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from qcc.plan.arena import ArenaPlan
from qcc.plan.bounds import lb_offsets_arrays, positional_maxima_arrays
from qcc.plan.intervals import Buffer, IntervalArrays, as_arrays, conflict_pairs
from qcc.plan.shared import SharedPlan


def _lookup(
    arr: IntervalArrays, table: Mapping[str, int], what: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Values of `table` in buffer order, which tensors have one, and missing/unknown problems."""
    problems = [f"tensor {name!r} has no {what}" for name in arr.names if name not in table]
    known = set(arr.names)
    problems += [f"{what} given for unknown tensor {name!r}" for name in table if name not in known]
    present = np.fromiter((name in table for name in arr.names), bool, arr.n)
    values = np.fromiter((int(table.get(name, 0)) for name in arr.names), np.int64, arr.n)
    return values, present, problems


def _span(b: Buffer) -> str:
    return f"{b.name!r} (steps {b.first}..{b.last}, {b.size} bytes)"


def verify_arena(buffers: Sequence[Buffer], plan: ArenaPlan) -> list[str]:
    """Offsets present, non-negative and aligned; conflicting tensors disjoint; total and bound
    recomputed."""
    arr = as_arrays(buffers)
    align = plan.alignment
    if align < 1:
        return [f"alignment {align} is not positive"]
    off, present, problems = _lookup(arr, plan.offsets, "offset")
    placed = present & (off >= 0)
    for i in np.flatnonzero(present & (off < 0)).tolist():
        problems.append(f"tensor {arr.names[i]!r} has negative offset {off[i]}")
    for i in np.flatnonzero(placed & (off % align != 0)).tolist():
        problems.append(f"tensor {arr.names[i]!r} offset {off[i]} is not a multiple of {align}")
    a, b = conflict_pairs(arr)
    end = off + arr.sizes
    both = placed[a] & placed[b] & (arr.sizes[a] > 0) & (arr.sizes[b] > 0)
    clash = both & (off[a] < end[b]) & (off[b] < end[a])
    for i, j in zip(a[clash].tolist(), b[clash].tolist()):
        problems.append(
            f"live tensors {_span(buffers[i])} at {off[i]} and {_span(buffers[j])} at {off[j]} overlap"
        )
    top = int(end[placed].max()) if placed.any() else 0
    expected = -(-top // align) * align
    if plan.total != expected:
        problems.append(f"total {plan.total} != {expected} (highest end rounded to {align})")
    lower = lb_offsets_arrays(as_arrays(buffers, scale=align)) * align
    if plan.lower_bound != lower:
        problems.append(f"lower bound {plan.lower_bound} != recomputed LB_off {lower}")
    if plan.total < lower:
        problems.append(f"total {plan.total} is below the lower bound {lower}")
    return problems


def verify_shared(buffers: Sequence[Buffer], plan: SharedPlan) -> list[str]:
    """Ids present and in range; each buffer holds its tensors; tensors sharing a buffer never
    live at the same step; total and bound recomputed."""
    arr = as_arrays(buffers)
    ids, known, problems = _lookup(arr, plan.assignment, "buffer id")
    count = len(plan.buffer_sizes)
    bad = known & ((ids < 0) | (ids >= count))
    for i in np.flatnonzero(bad).tolist():
        problems.append(f"tensor {arr.names[i]!r} uses buffer {ids[i]}, only {count} exist")
    ok = known & ~bad
    caps = np.asarray(plan.buffer_sizes, dtype=np.int64)
    small = np.zeros(arr.n, dtype=bool)
    small[ok] = arr.sizes[ok] > caps[ids[ok]]
    for i in np.flatnonzero(small).tolist():
        problems.append(
            f"tensor {_span(buffers[i])} does not fit buffer {ids[i]} of {caps[ids[i]]} bytes"
        )
    for k in np.flatnonzero(caps < 0).tolist():
        problems.append(f"buffer {k} has negative size {caps[k]}")
    a, b = conflict_pairs(arr)
    clash = ok[a] & ok[b] & (ids[a] == ids[b]) & (arr.sizes[a] > 0) & (arr.sizes[b] > 0)
    for i, j in zip(a[clash].tolist(), b[clash].tolist()):
        problems.append(
            f"live tensors {_span(buffers[i])} and {_span(buffers[j])} share buffer {ids[i]}"
        )
    if plan.total != int(caps.sum()):
        problems.append(f"total {plan.total} != sum of buffer sizes {int(caps.sum())}")
    lower = int(positional_maxima_arrays(arr).sum())
    if plan.lower_bound != lower:
        problems.append(f"lower bound {plan.lower_bound} != recomputed LB_so {lower}")
    if plan.total < lower:
        problems.append(f"total {plan.total} is below the lower bound {lower}")
    return problems
