"""The `insert-quantize` pass: explicit Quantize nodes on chosen tensors (seed 000).

nnabla users splice `PF.min_max_quantize` after every ReLU, AveragePooling and Affine by
rebuilding layers and `rewire_on`; here the same choice is one option. A Quantize node is an
identity until an annotation pass (`quantize-affine{activations=marked}` or
`assign-fixed-point{activations=marked}`) gives its output a type. A graph output keeps its
name: the Quantize output takes it and the value before it gets a `_float` suffix.
"""

from __future__ import annotations

import attrs
from qcc.passes.quantutil import canonical_op, is_float, node_selected

from qcc.ir.core import Graph, Model, Value
from qcc.ir.surgery import insert_after
from qcc.pm.base import Pass, PassContext, PassResult


def _ops(value: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(canonical_op(op) for op in value)


@attrs.frozen
class InsertQuantize(Pass):
    """Insert Quantize nodes after op types, on all activations or on weights (name globs filter)."""

    name = "insert-quantize"

    after: tuple[str, ...] = attrs.field(default=("Relu", "AvgPool", "Dense"), converter=_ops,
                                         metadata={"help": "op types whose outputs get a Quantize"})
    all_activations: bool = attrs.field(default=False, metadata={"help": "every float activation"})
    weights: bool = attrs.field(default=False, metadata={"help": "Conv/Dense weights too"})
    inputs: bool = attrs.field(default=False, metadata={"help": "the graph inputs too"})
    include: tuple[str, ...] = attrs.field(default=(), metadata={"help": "node-name globs to keep"})
    exclude: tuple[str, ...] = attrs.field(default=(), metadata={"help": "node-name globs to skip"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        chosen: list[Value] = []
        if self.inputs:
            chosen += [v for v in graph.inputs if is_float(v)]
        for node in list(graph.nodes):
            if node.op == "Quantize" or not node_selected(node, self.include, self.exclude):
                continue
            if self.all_activations or node.op in self.after:
                chosen += [v for v in node.outputs if is_float(v)]
            if self.weights and node.op in ("Conv", "ConvTranspose", "Dense"):
                w = node.inputs[1]
                if w is not None and w.is_const and is_float(w):
                    chosen.append(w)
        done = 0
        seen: set[int] = set()
        for value in chosen:
            if id(value) in seen or _already_quantized(value):
                continue
            seen.add(id(value))
            _insert(graph, value)
            done += 1
        if not done:
            return PassResult.unchanged(model)
        ctx.note("insert_quantize", f"{done} Quantize node(s) inserted")
        return PassResult(model, True, frozenset())


def _already_quantized(value: Value) -> bool:
    users = value.consumers()
    return bool(users) and all(n.op == "Quantize" for n in users)


def _insert(graph: Graph, value: Value) -> None:
    is_output = any(v is value for v in graph.outputs)
    node = insert_after(graph, value, "Quantize", name=f"{value.name}_quantize")
    if is_output:
        public = value.name
        value.name = graph.unique_name(f"{public}_float")
        node.outputs[0].name = public
