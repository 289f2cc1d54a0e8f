"""Activations that exporters spell out as a gate times the input: x * sigmoid(x) is Silu (Swish),
x * hardsigmoid(x) (alpha 1/6, beta 1/2) is HardSwish.

Frontends call `fuse_gated_activations` after import, so every target sees one op (a C kernel, a
lookup table in affine C, nnabla's Swish) instead of two nodes with an int8 tensor between them.
A gate read by anything else, or a graph output, is left alone. Longer spellings (x * relu6(x + 3)
/ 6) are a pass's business: examples/plugin's fuse-hard-activation.
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
