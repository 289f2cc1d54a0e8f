"""Arena hill climb on top of the greedy planner, for plans the heuristics leave above LB_off.

The greedy planner decodes a buffer order into offsets, so a plan can be improved by searching
over orders (TVM USMP's hill climb): move a buffer that ends at the arena's top to a random
earlier position, decode again with first-fit, keep the change if the total did not rise (equal
totals are accepted, so the search walks plateaus). It starts from the plan's buffers listed by
offset and stops at the lower bound, after `max_steps` moves or at the time budget, whichever
comes first; a seeded generator keeps it reproducible when the step limit ends it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from qcc.plan.arena import ArenaPlan, _greedy
from qcc.plan.intervals import Buffer, as_arrays, conflict_lists


def improve_arena(
    buffers: Sequence[Buffer],
    plan: ArenaPlan,
    *,
    time_budget: float = 0.5,
    max_steps: int = 2000,
    seed: int = 0,
) -> ArenaPlan:
    """A plan at most as large as `plan` (the same object when the search finds nothing)."""
    if plan.total <= plan.lower_bound or not buffers:
        return plan
    align = plan.alignment
    arr = as_arrays(buffers, scale=align)
    adj = conflict_lists(arr)
    sizes = arr.sizes.tolist()
    lower = plan.lower_bound // align
    order = sorted(range(arr.n), key=lambda i: (plan.offsets[arr.names[i]], -sizes[i], i))
    decoded = _greedy(order, sizes, adj, False, None)
    assert decoded is not None  # no cutoff
    placed, total = decoded
    rng = random.Random(seed)
    deadline = time.monotonic() + time_budget
    for _ in range(max_steps):
        if total <= lower or time.monotonic() > deadline:
            break
        moved = rng.choice([i for i in range(arr.n) if placed[i] + sizes[i] == total])
        pos = order.index(moved)
        if pos == 0:
            continue
        candidate = order[:pos] + order[pos + 1 :]
        candidate.insert(rng.randrange(pos), moved)
        decoded = _greedy(candidate, sizes, adj, False, total + 1)
        if decoded is not None:
            order, (placed, total) = candidate, decoded
    if total * align >= plan.total:
        return plan
    return ArenaPlan(
        {name: off * align for name, off in zip(arr.names, placed)},
        total * align,
        plan.lower_bound,
        f"{plan.method}+hill-climb",
        total == lower,
        align,
    )
