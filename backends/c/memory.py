"""Where each tensor of the generated C lives: one static arena, offsets from an arena plan.

Liveness is by step (node index), inclusive: graph inputs from step 0, graph outputs to the end
(the final copy out). Storage groups: views share their input's storage; an op whose kernel can
run in place (elementwise, same element size and count) writes over an input that dies there.

A current `MemoryPlan` in `model.products` (pass `plan-memory`, kind arena or both) is used as
it is when every storage sharing it decided is one these kernels can execute (its views must be
aliases here too) and its offsets pass qcc.plan.verify_arena for these buffers; so is a bare
ArenaPlan naming our buffers. Otherwise qcc.plan.plan_arena plans our own groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
from qcc.backends.c.lower import Step, static_shape

from qcc.ir.core import Graph, Model, Node, Value
from qcc.plan import ArenaPlan, Buffer, lb_offsets, naive_size, plan_arena, verify_arena

Sizer = Callable[[Value], int]


@attrs.frozen
class Layout:
    roots: dict[int, Value]
    """id(value) -> the value owning its storage (itself, a view's source, an in-place input)."""
    buffers: tuple[Buffer, ...]
    plan: ArenaPlan
    source: str
    naive: int
    copies: frozenset[int] = frozenset()
    """ids of view outputs the plan gave storage of their own: the view becomes a copy."""

    def offset(self, value: Value) -> int | None:
        """Byte offset in the arena, None for constants (and views of them)."""
        root = self.roots[id(value)]
        return None if root.const is not None else self.plan.offsets[root.name]


@attrs.frozen
class Target:
    """Where a producer writes instead of its own output buffer: `byte` bytes into `value`'s storage."""

    value: Value
    byte: int = 0


def direct_writes(graph: Graph, steps: Sequence[Step], lay: Layout, nbytes: Sizer) -> dict[int, Target]:
    """id(a kernel's output) -> where the kernel writes it instead, saving the copy after it:
    - a fused consumer's output the plan gave a buffer of its own (`Layout.copies`): the producer's
      kernel already computes the consumer's values;
    - its slice of a float Concat's output (slices contiguous: nothing before the axis but 1s),
      when the Concat is its only reader.
    Only where nothing the producer reads, and nothing live until the consumer runs, overlaps the
    bytes written (the plan placed them for the consumer's lifetime, not the producer's)."""
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    spans = {b.name: (lay.plan.offsets[b.name], b.size, b.first, b.last) for b in lay.buffers}
    redirect: dict[int, Target] = {}

    def place(made: Value, target: Target, step: int) -> None:
        chain = [made]  # back through fused aliases (a Relu computed by a convolution) to the kernel's output
        while True:
            producer = chain[-1].producer()
            if producer is None or id(producer) not in index or lay.offset(chain[-1]) is None:
                return
            if not steps[index[id(producer)]].alias:
                break
            if not steps[index[id(producer)]].fused or id(chain[-1]) in lay.copies:
                return  # a view, or a copy: that step writes the value, not a kernel
            chain.append(producer.input(0))
        made = chain[-1]
        if lay.offset(target.value) is None:
            return
        begin = int(lay.offset(target.value) or 0) + target.byte
        stop = begin + nbytes(chain[0])
        skip = {lay.roots[id(target.value)].name} | ({made.name} if lay.roots[id(made)] is made else set())
        clash = any(name not in skip and first < step and last >= index[id(producer)]
                    and offset < stop and begin < offset + length
                    for name, (offset, length, first, last) in spans.items())
        if not clash:
            redirect.update({id(v): target for v in chain})

    for step, lowered in enumerate(steps):
        node = lowered.node
        if lowered.fused and node.outputs and id(node.outputs[0]) in lay.copies:
            place(node.input(0), Target(node.outputs[0]), step)
        elif node.op == "Concat" and not lowered.alias and _contiguous_float_concat(node, graph):
            byte = 0
            for value in node.inputs:
                assert value is not None
                if len(value.uses()) == 1:
                    place(value, Target(node.outputs[0], byte), step)
                byte += nbytes(value)
    return redirect


def _contiguous_float_concat(node: Node, graph: Graph) -> bool:
    """Float inputs and output (the Concat is then a plain copy), each input one contiguous slice."""
    y = node.outputs[0]
    shape = static_shape(y)
    axis = node.attrs["axis"] % len(shape)
    if any(d != 1 for d in shape[:axis]) or y.quant is not None or y.type.dtype != "float32":
        return False
    outputs = {id(v) for v in graph.outputs}
    return all(v is not None and v.quant is None and v.const is None and v.type.dtype == "float32"
               and id(v) not in outputs for v in node.inputs)


def layout(model: Model, steps: Sequence[Step], nbytes: Sizer, alignment: int) -> Layout:
    graph = model.graph
    last_use = _last_uses(graph)
    stored = _stored_plan(model, steps, nbytes, last_use)
    if stored is not None:
        roots, offsets, method, copies = stored
        buffers = _buffers(graph, roots, last_use, nbytes)
        plan = _adopt(buffers, offsets, method, alignment)
        if plan is not None:
            return Layout(roots, tuple(buffers), plan, "memory_plan", naive_size(buffers), copies)
    roots = _own_roots(graph, steps, nbytes, last_use)
    buffers = _buffers(graph, roots, last_use, nbytes)
    product = model.products.get(ArenaPlan)  # an arena another tool placed (offsets by buffer name)
    if product is not None and all(b.name in product.offsets for b in buffers):
        plan = _adopt(buffers, {b.name: int(product.offsets[b.name]) for b in buffers}, product.method, alignment)
        if plan is not None:
            return Layout(roots, tuple(buffers), plan, "memory_plan", naive_size(buffers))
    return Layout(roots, tuple(buffers), plan_arena(buffers, alignment=alignment), "qcc.plan.plan_arena",
                  naive_size(buffers))


def _last_uses(graph: Graph) -> dict[int, int]:
    last: dict[int, int] = {}
    for step, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value is not None:
                last[id(value)] = step
    for value in graph.outputs:
        last[id(value)] = len(graph.nodes)
    return last


def _own_roots(graph: Graph, steps: Sequence[Step], nbytes: Sizer, last_use: dict[int, int]) -> dict[int, Value]:
    roots: dict[int, Value] = {id(v): v for v in [*graph.inputs, *graph.constants]}
    members: dict[int, list[Value]] = {}
    for step, lowered in enumerate(steps):
        node = lowered.node
        share = roots[id(node.input(0))] if lowered.alias else None
        for index in () if lowered.alias else lowered.inplace:
            root = roots[id(node.input(index))]
            group = members.get(id(root), [root])
            if root.const is None and nbytes(root) == nbytes(node.outputs[0]) and \
                    all(last_use.get(id(v), -1) <= step for v in group):
                share = root
                break
        for value in node.outputs:
            root = share if share is not None else value
            roots[id(value)] = root
            members.setdefault(id(root), [root]).append(value)
    return roots


def _stored_plan(model: Model, steps: Sequence[Step], nbytes: Sizer, last_use: dict[int, int]
                 ) -> tuple[dict[int, Value], dict[str, int], str, frozenset[int]] | None:
    """The storage groups and offsets of a current plan-memory plan, if these kernels can run them
    (a view the plan did not alias is copied)."""
    from qcc.plan.memory_plan import current_plan

    plan: Any = current_plan(model)
    if plan is None or plan.arena is None:
        return None
    graph = model.graph
    acts = {v.name: v for v in [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]}
    if any(name not in plan.buffer_of or plan.buffer_of[name] not in acts for name in acts):
        return None
    roots: dict[int, Value] = {id(c): c for c in graph.constants}
    roots.update({id(v): acts[plan.buffer_of[name]] for name, v in acts.items()})
    group_last: dict[int, int] = {}  # latest last use over each storage group's members so far
    copies = set()
    for step, lowered in enumerate(steps):
        node = lowered.node
        for value in node.outputs:
            root = roots[id(value)]
            if id(root) not in group_last:
                group_last[id(root)] = last_use.get(id(root), -1) if root is not value else -1
            if lowered.alias and root is value:
                copies.add(id(value))
            elif lowered.alias:
                if root is not roots[id(node.input(0))]:
                    return None
            elif root is not value:
                sources = [i for i in lowered.inplace if roots[id(node.input(i))] is root]
                if not sources or nbytes(root) != nbytes(value) or group_last[id(root)] > step:
                    return None
            group_last[id(root)] = max(group_last[id(root)], last_use.get(id(value), -1))
    offsets = {name: plan.arena.offsets[name] for name in set(plan.buffer_of.values())}
    return roots, offsets, plan.arena.method, frozenset(copies)


def _buffers(graph: Graph, roots: dict[int, Value], last_use: dict[int, int], nbytes: Sizer) -> list[Buffer]:
    first: dict[int, int] = {id(v): 0 for v in graph.inputs}
    last: dict[int, int] = {}
    for step, node in enumerate(graph.nodes):
        for value in node.outputs:
            first.setdefault(id(roots[id(value)]), step)
    groups: dict[int, Value] = {}
    for key, root in roots.items():
        if root.const is not None:
            continue
        groups.setdefault(id(root), root)
        last[id(root)] = max(last.get(id(root), first[id(root)]), last_use.get(key, -1))
    return [Buffer(root.name, nbytes(root), first[key], last[key]) for key, root in groups.items()]


def _adopt(buffers: list[Buffer], offsets: dict[str, int], method: str, alignment: int) -> ArenaPlan | None:
    if any(b.name not in offsets for b in buffers):
        return None
    mine = {b.name: int(offsets[b.name]) for b in buffers}
    top = max((mine[b.name] + b.size for b in buffers), default=0)
    total = -(-top // alignment) * alignment
    lower = lb_offsets([Buffer(b.name, -(-b.size // alignment) * alignment, b.first, b.last) for b in buffers])
    plan = ArenaPlan(mine, total, lower, method, total == lower, alignment)
    return None if verify_arena(buffers, plan) else plan
