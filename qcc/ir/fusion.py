"""Activations that exporters spell out as a gate times the input: x * sigmoid(x) is Silu (Swish),
x * hardsigmoid(x) (alpha 1/6, beta 1/2) and x * relu6(x + 3) / 6 are HardSwish.

Frontends call `fuse_gated_activations` after import, so every target sees one op (a C kernel, a
lookup table in affine C, nnabla's Swish) instead of two or four nodes with an int8 tensor
between them. A gate read by anything else, or a graph output, is left alone.
"""

from __future__ import annotations

import math

from qcc.ir.core import Graph, Node, Value
from qcc.ir.surgery import replace_node

FUSED_OPS = frozenset({"Silu", "HardSwish"})
"""The ops `fuse_gated_activations` creates (a frontend that calls it imports them)."""


def _sole_use(graph: Graph, value: Value | None, user: Node) -> bool:
    return value is not None and all(n is user for n in value.consumers()) and \
        not any(v is value for v in graph.outputs)


def _scalar(value: Value | None) -> float | None:
    if value is None or value.const is None or value.const.size != 1:
        return None
    return float(value.const.reshape(-1)[0])


def _gate_of(graph: Graph, mul: Node) -> tuple[str, Value, list[Node]] | None:
    """(fused op, x, gate nodes) when mul is x * gate(x)."""
    for i in (0, 1):
        x, gate = mul.inputs[1 - i], mul.inputs[i]
        node = gate.producer() if gate is not None else None
        if x is None or node is None or node.inputs[0] is not x or not _sole_use(graph, gate, mul):
            continue
        if node.op == "Sigmoid":
            return "Silu", x, [node]
        if node.op == "HardSigmoid" and math.isclose(node.attrs["alpha"], 1 / 6, rel_tol=1e-6) and \
                node.attrs["beta"] == 0.5:
            return "HardSwish", x, [node]
    return None


def _relu6_gate(graph: Graph, div: Node) -> tuple[Value, list[Node]] | None:
    """x * relu6(x + 3) / 6, as (x * clip(x + 3, 0, 6)) / 6 or x * (clip(x + 3, 0, 6) / 6)."""
    mul = div.inputs[0].producer() if div.inputs[0] is not None else None
    if div.op != "Div" or _scalar(div.inputs[1]) != 6.0 or mul is None or mul.op != "Mul" or \
            not _sole_use(graph, mul.outputs[0], div):
        return None
    for i in (0, 1):
        x, gate = mul.inputs[1 - i], mul.inputs[i]
        clip = gate.producer() if gate is not None else None
        if x is None or clip is None or clip.op != "Clip" or (clip.attrs["min"], clip.attrs["max"]) != (0.0, 6.0):
            continue
        add = clip.inputs[0].producer() if clip.inputs[0] is not None else None
        if add is None or add.op != "Add" or not _sole_use(graph, gate, mul) or \
                not _sole_use(graph, clip.inputs[0], clip):  # type: ignore[arg-type]
            continue
        if (add.inputs[0] is x and _scalar(add.inputs[1]) == 3.0) or (add.inputs[1] is x and _scalar(add.inputs[0]) == 3.0):
            return x, [add, clip, mul]
    return None


def fuse_gated_activations(graph: Graph) -> int:
    """Rewrite every gated activation in place; returns how many were fused."""
    fused = 0
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        found: tuple[str, Value, list[Node]] | None = None
        if node.op == "Mul" and node.inputs[0] is not None and node.inputs[1] is not None and \
                node.inputs[0].type.shape == node.outputs[0].type.shape == node.inputs[1].type.shape:
            found = _gate_of(graph, node)
        elif node.op == "Div":
            relu6 = _relu6_gate(graph, node)
            found = ("HardSwish", *relu6) if relu6 is not None else None
        if found is None:
            continue
        op, x, gates = found
        if x.type != node.outputs[0].type or x.type.dtype != "float32":
            continue
        replace_node(graph, node, op, [x], {})
        for gate in reversed(gates):
            graph.remove(gate)
        fused += 1
    if fused:
        outputs = {id(v) for v in graph.outputs}
        graph.constants = [c for c in graph.constants if c.uses() or id(c) in outputs]
    return fused
