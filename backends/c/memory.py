"""Where each tensor of the generated C lives: one static arena, offsets from an arena plan.

Liveness is by step (node index), inclusive: graph inputs from step 0, graph outputs to the end
(the final copy out). Views share their input's storage; an elementwise op whose input dies at
it writes in place when its kernel allows (same element size, same element count). The offsets
come from `model.products["memory_plan"]` when it holds an arena plan that is valid for these
buffers (checked with qcc.plan.verify_arena), otherwise from qcc.plan.plan_arena.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from qcc.backends.c.lower import Step
from qcc.ir.core import Model, Value
from qcc.plan import ArenaPlan, Buffer, lb_offsets, naive_size, plan_arena, verify_arena


@attrs.frozen
class Layout:
    roots: dict[int, Value]
    """id(value) -> the value owning its storage (itself, a view's source, an in-place input)."""
    buffers: tuple[Buffer, ...]
    plan: ArenaPlan
    source: str
    naive: int

    def offset(self, value: Value) -> int | None:
        """Byte offset in the arena, None for constants (and views of them)."""
        root = self.roots[id(value)]
        return None if root.const is not None else self.plan.offsets[root.name]


def layout(model: Model, steps: Sequence[Step], nbytes: Callable[[Value], int], alignment: int) -> Layout:
    graph = model.graph
    end = len(graph.nodes)
    last_use: dict[int, int] = {}
    for step, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value is not None:
                last_use[id(value)] = step
    outputs = {id(v) for v in graph.outputs}
    roots: dict[int, Value] = {id(v): v for v in [*graph.inputs, *graph.constants]}
    members: dict[int, list[Value]] = {id(v): [v] for v in graph.inputs}
    first: dict[int, int] = {id(v): 0 for v in graph.inputs}
    for step, (node, lowered) in enumerate(zip(graph.nodes, steps)):
        share = _shared_root(lowered, roots, members, last_use, outputs, step, nbytes)
        for value in node.outputs:
            if share is not None:
                roots[id(value)] = share
                members.setdefault(id(share), [share]).append(value)
            else:
                roots[id(value)] = value
                members[id(value)] = [value]
                first[id(value)] = step
    buffers = []
    for key, group in members.items():
        root = group[0]
        if root.const is not None:
            continue
        last = max([first[key], *(last_use.get(id(v), -1) for v in group)])
        if any(id(v) in outputs for v in group):
            last = end
        buffers.append(Buffer(root.name, nbytes(root), first[key], last))
    plan, source = _plan(model, buffers, alignment)
    return Layout(roots, tuple(buffers), plan, source, naive_size(buffers))


def _shared_root(lowered: Step, roots: dict[int, Value], members: dict[int, list[Value]], last_use: dict[int, int],
                 outputs: set[int], step: int, nbytes: Callable[[Value], int]) -> Value | None:
    node = lowered.node
    if lowered.alias:
        return roots[id(node.input(0))]
    if lowered.inplace is None:
        return None
    root = roots[id(node.input(lowered.inplace))]
    if root.const is not None or nbytes(root) != nbytes(node.outputs[0]):
        return None
    group = members.get(id(root), [root])
    if any(last_use.get(id(v), -1) > step or id(v) in outputs for v in group):
        return None
    return root


def _plan(model: Model, buffers: list[Buffer], alignment: int) -> tuple[ArenaPlan, str]:
    given = _arena_in(model.products.get("memory_plan"))
    if given is not None and all(b.name in given.offsets for b in buffers):
        offsets = {b.name: int(given.offsets[b.name]) for b in buffers}
        top = max((offsets[b.name] + b.size for b in buffers), default=0)
        total = -(-top // alignment) * alignment
        lower = lb_offsets([Buffer(b.name, -(-b.size // alignment) * alignment, b.first, b.last) for b in buffers])
        adopted = ArenaPlan(offsets, total, lower, given.method, total == lower, alignment)
        if not verify_arena(buffers, adopted):
            return adopted, "memory_plan"
    return plan_arena(buffers, alignment=alignment), "qcc.plan.plan_arena"


def _arena_in(product: Any) -> ArenaPlan | None:
    """An ArenaPlan inside whatever the plan-memory pass stored (the plan itself, or a field)."""
    if isinstance(product, ArenaPlan):
        return product
    for key in ("arena", "arena_plan", "c"):
        inner = product.get(key) if isinstance(product, dict) else getattr(product, key, None)
        if isinstance(inner, ArenaPlan):
            return inner
    return None

