"""Graph surgery (seeds 002 and 000): the small public API for local rewrites.

nnabla users rebuild a layer and `rewire_on` to splice in a new one; here a single call inserts a
node after a value and moves every consumer over, keeping names and attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from qcc.errors import UsageError
from qcc.ir.core import Graph, Node, Value
from qcc.ir.registry import get_schema


def insert_after(
    graph: Graph,
    value: Value,
    op: str,
    attributes: dict[str, Any] | None = None,
    extra_inputs: Iterable[Value | None] = (),
    name: str | None = None,
) -> Node:
    """Insert `op(value, *extra_inputs)` and rewire all of value's consumers to its output."""
    consumers = value.uses()
    node = graph.make_node(op, [value, *extra_inputs], attributes, name or f"{value.name}_{op.lower()}")
    out = node.outputs[0]
    if out.type != value.type and consumers:
        raise UsageError(f"insert_after {value.name!r}: {op} changes the type {value.type} -> {out.type}")
    for user, index in consumers:
        user.set_input(index, out)
    graph.outputs = [out if v is value else v for v in graph.outputs]
    producer = value.producer()
    if producer is None:
        graph.insert_after(None, node)
    else:
        graph.insert_after(producer, node)
    return node


def replace_node(
    graph: Graph,
    node: Node,
    op: str | None = None,
    inputs: Iterable[Value | None] | None = None,
    attributes: dict[str, Any] | None = None,
) -> Node:
    """Swap `node` for a new one (same attributes unless overridden) that keeps its output values."""
    new_op = op or node.op
    schema = get_schema(new_op)
    merged = {k: v for k, v in node.attrs.items() if k in schema.attrs}
    merged.update(attributes or {})
    new_inputs = list(inputs) if inputs is not None else list(node.inputs)
    merged = schema.complete_attrs(merged, node.name)
    types = schema.infer_types(new_inputs, merged, node.name, len(node.outputs))
    outputs = node.outputs
    for value, ttype in zip(outputs, types):
        if value.type != ttype and value.uses():
            raise UsageError(f"replace_node {node.name!r}: output {value.name!r} would change type {value.type} -> {ttype}")
    position = graph.index_of(node)
    node.detach()
    for value, ttype in zip(outputs, types):
        value.type = ttype
    new = Node.create(new_op, new_inputs, outputs, merged, node.name)
    graph.nodes[position] = new
    return new


def remove_node(graph: Graph, node: Node, keep_input: int = 0) -> None:
    """Remove a one-output node, rewiring its consumers to its input `keep_input`."""
    if len(node.outputs) != 1:
        raise UsageError(f"remove_node {node.name!r}: only single-output nodes can be bypassed")
    source = node.input(keep_input)
    out = node.outputs[0]
    if source.type != out.type:
        raise UsageError(f"remove_node {node.name!r}: input type {source.type} != output type {out.type}")
    out.replace_all_uses_with(source, graph)
    graph.remove(node)


def topological_sort(graph: Graph) -> Graph:
    return graph.sort()


def match_chains(graph: Graph, ops: list[str]) -> Iterator[list[Node]]:
    """Yield node chains with the given op sequence where each link's output feeds only the next."""
    for node in list(graph.nodes):
        if node.op != ops[0]:
            continue
        chain = [node]
        for op in ops[1:]:
            last = chain[-1]
            out = last.outputs[0]
            users = out.consumers()
            if len(users) != 1 or users[0].op != op or any(v is out for v in graph.outputs):
                break
            chain.append(users[0])
        if len(chain) == len(ops):
            yield chain
