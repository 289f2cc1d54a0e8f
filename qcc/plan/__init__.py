"""Memory planning algorithms on buffer lifetimes, independent of the IR.

The liveness analysis turns a graph into `Buffer`s; `plan_arena` (one block of offsets, for the
C backend) and `plan_shared` / `nnabla_shared_plan` (separately allocated buffers, for .nnb)
plan them; `verify_arena` / `verify_shared` check any plan against the lifetimes.
"""

from __future__ import annotations

from qcc.plan.arena import FITS, ORDERS, ArenaPlan, plan_arena
from qcc.plan.bounds import lb_offsets, lb_shared, naive_size, positional_maxima
from qcc.plan.intervals import Buffer, conflicts
from qcc.plan.nnabla_policy import nnabla_shared_plan
from qcc.plan.shared import SHARED_METHODS, SharedPlan, plan_shared
from qcc.plan.verify import verify_arena, verify_shared

__all__ = [
    "FITS",
    "ORDERS",
    "SHARED_METHODS",
    "ArenaPlan",
    "Buffer",
    "SharedPlan",
    "conflicts",
    "lb_offsets",
    "lb_shared",
    "naive_size",
    "nnabla_shared_plan",
    "plan_arena",
    "plan_shared",
    "positional_maxima",
    "verify_arena",
    "verify_shared",
]
