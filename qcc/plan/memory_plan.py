"""The memory plan stored in a model (`model.products.get(MemoryPlan)`) and its verifier check.

A plan is only meaningful for the graph it was made for, so it records a fingerprint of
everything liveness depends on (node order, operands, activation types and annotations). The
registered verifier check re-derives liveness and checks the plan whenever the fingerprint still
matches; once a later pass changes the graph the plan is stale: the check skips it and
`current_plan` returns None, so a backend asks for `plan-memory` again instead of using it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Literal

import attrs

from qcc.errors import UsageError
from qcc.ir.core import Graph, Model
from qcc.ir.verify import register_model_check
from qcc.plan.arena import ArenaPlan, plan_arena
from qcc.plan.arena_search import search_arena
from qcc.plan.bounds import lb_offsets, lb_shared, naive_size
from qcc.plan.intervals import Buffer
from qcc.plan.liveness import Storage, StorageOptions, compute_storage
from qcc.plan.nnabla_policy import nnabla_shared_plan
from qcc.plan.shared import SharedPlan, plan_shared
from qcc.plan.shared_search import search_shared
from qcc.plan.verify import verify_arena, verify_shared

PLAN_KEY = "memory_plan"
PlanKind = Literal["arena", "shared", "both"]
KINDS: tuple[str, ...] = ("arena", "shared", "both")


@attrs.frozen
class PlanOptions:
    """How to plan: which kind(s), the arena alignment, what storage sharing the target allows.

    `time_budget` (seconds) bounds each exact search (arena branch and bound, arena hill climb,
    shared-object search); the greedy heuristics always run to completion.
    """

    kind: PlanKind = "both"
    alignment: int = 16
    aliases: bool = False
    inplace: bool = False
    scheme: str = ""
    time_budget: float = 1.0

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"memory plan kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.alignment < 1:
            raise UsageError(f"memory plan alignment must be >= 1, got {self.alignment}")
        if self.time_budget < 0:
            raise UsageError(f"memory plan time budget must be >= 0, got {self.time_budget}")

    @property
    def storage(self) -> StorageOptions:
        return StorageOptions(self.aliases, self.inplace, self.scheme)


@attrs.frozen(eq=False)
class MemoryPlan:
    """Plans for one graph state. Bytes throughout; `lb_off`/`lb_so` are the unaligned bounds.

    `shared_optimal` is True when the shared-object search proved no plan is cheaper (the
    arena's own flag is `arena.optimal`).
    """

    options: PlanOptions
    buffers: tuple[Buffer, ...]
    buffer_of: dict[str, str]
    naive_bytes: int
    lb_off: int
    lb_so: int
    arena: ArenaPlan | None
    shared: SharedPlan | None
    shared_optimal: bool
    fingerprint: str
    seconds: float

    @property
    def assignment(self) -> dict[str, int]:
        """Shared-object id of every activation by value name (what the .nnb backend reads)."""
        if self.shared is None:
            return {}
        return {name: self.shared.assignment[buffer] for name, buffer in self.buffer_of.items()}

    @property
    def method(self) -> str:
        return self.shared.method if self.shared is not None else ""

    @property
    def lower_bound(self) -> int:
        """LB_so (with `assignment`, the shared-object view of this plan)."""
        return self.lb_so

    def offset_of(self, tensor: str) -> int:
        """Arena offset of an activation (views and in-place results share their buffer's)."""
        if self.arena is None:
            raise UsageError("this memory plan has no arena (plan-memory kind=shared)")
        return self.arena.offsets[self.buffer_of[tensor]]

    def object_of(self, tensor: str) -> int:
        """Shared-object id of an activation."""
        if self.shared is None:
            raise UsageError("this memory plan has no shared objects (plan-memory kind=arena)")
        return self.shared.assignment[self.buffer_of[tensor]]


def graph_fingerprint(graph: Graph) -> str:
    """Digest of what liveness and sizes depend on; any other change leaves a plan valid."""
    digest = hashlib.blake2b(digest_size=16)
    parts = ["in:" + ",".join(f"{v.name}:{v.type}:{v.quant}" for v in graph.inputs)]
    for node in graph.nodes:
        operands = ",".join(
            "-" if v is None else ("c:" if v.is_const else "") + v.name for v in node.inputs
        )
        results = ",".join(f"{v.name}:{v.type}:{v.quant}" for v in node.outputs)
        parts.append(f"{node.op}({operands})->{results}")
    parts.append("out:" + ",".join(v.name for v in graph.outputs))
    digest.update("\n".join(parts).encode())
    return digest.hexdigest()


def plan_storage(storage: Storage, options: PlanOptions, fingerprint: str = "") -> MemoryPlan:
    """Plan the buffers of `storage` (already sized and grouped) as `options.kind` asks."""
    start = time.perf_counter()
    buffers = storage.buffers
    budget = options.time_budget
    arena = shared = None
    shared_optimal = False
    if options.kind in ("arena", "both"):
        arena = plan_arena(buffers, alignment=options.alignment, time_budget=budget)
        arena = search_arena(buffers, arena, time_budget=budget)
    if options.kind in ("shared", "both"):
        shared = min((plan_shared(buffers), nnabla_shared_plan(buffers)), key=lambda p: p.total)
        shared, shared_optimal = search_shared(buffers, shared, time_budget=budget)
    return MemoryPlan(
        options=options,
        buffers=buffers,
        buffer_of=dict(storage.buffer_of),
        naive_bytes=naive_size(buffers),
        lb_off=lb_offsets(buffers),
        lb_so=lb_shared(buffers),
        arena=arena,
        shared=shared,
        shared_optimal=shared_optimal,
        fingerprint=fingerprint,
        seconds=time.perf_counter() - start,
    )


def plan_model(model: Model, options: PlanOptions = PlanOptions(), storage: Storage | None = None) -> MemoryPlan:
    """Plan `model` in its current order (does not store the plan; `plan-memory` does)."""
    if storage is None:
        storage = compute_storage(model.graph, options.storage)
    return plan_storage(storage, options, graph_fingerprint(model.graph))


def plan_status(model: Model) -> Literal["absent", "current", "stale"]:
    plan = model.products.get(MemoryPlan)
    if plan is None:
        return "absent"
    return "current" if plan.fingerprint == graph_fingerprint(model.graph) else "stale"


def current_plan(model: Model) -> MemoryPlan | None:
    """The stored plan if it was made for the graph as it is now, else None."""
    return model.products.get(MemoryPlan) if plan_status(model) == "current" else None


def plan_problems(model: Model) -> list[str]:
    """Verifier check: a current plan must fit fresh liveness (no overlap, everything placed)."""
    plan = model.products.get(MemoryPlan)
    if plan is None:
        return []
    if plan.fingerprint != graph_fingerprint(model.graph):
        return []  # stale: made for an earlier graph; current_plan() refuses it
    storage = compute_storage(model.graph, plan.options.storage)
    problems = []
    if storage.buffer_of != plan.buffer_of:
        changed = sorted(k for k in storage.buffer_of if plan.buffer_of.get(k) != storage.buffer_of[k])
        problems.append(f"storage groups differ from liveness for {changed[:5]}")
    if plan.arena is not None:
        problems += [f"arena: {p}" for p in verify_arena(storage.buffers, plan.arena)]
    if plan.shared is not None:
        problems += [f"shared objects: {p}" for p in verify_shared(storage.buffers, plan.shared)]
    bounds = (naive_size(storage.buffers), lb_offsets(storage.buffers), lb_shared(storage.buffers))
    if bounds != (plan.naive_bytes, plan.lb_off, plan.lb_so):
        problems.append(
            f"recorded naive/LB_off/LB_so {(plan.naive_bytes, plan.lb_off, plan.lb_so)} != recomputed {bounds}"
        )
    return problems


register_model_check(PLAN_KEY, plan_problems)
