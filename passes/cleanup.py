"""Housekeeping passes: dead-code elimination and constant folding."""

from __future__ import annotations

import attrs

from qcc.ir.core import Model
from qcc.ir.registry import get_schema
from qcc.pm.base import Pass, PassContext, PassResult


@attrs.frozen
class DeadCodeElimination(Pass):
    """Remove nodes and constants that no graph output depends on."""

    name = "dce"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        before = (len(model.graph.nodes), len(model.graph.constants))
        model.graph.cleanup()
        changed = before != (len(model.graph.nodes), len(model.graph.constants))
        return PassResult(model, changed, frozenset())


@attrs.frozen
class FoldConstants(Pass):
    """Evaluate nodes whose inputs are all constants with the reference kernels."""

    name = "fold-constants"
    max_elements: int = 1 << 24

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        from qcc import limits

        graph = model.graph
        folded = 0
        total = 0  # bytes folded so far: many results each under max_elements must not add up unchecked
        for node in list(graph.nodes):
            if not node.inputs or any(v is None or not v.is_const for v in node.inputs):
                continue
            if any(v.type.numel() > self.max_elements for v in node.outputs):
                continue
            total += sum(v.type.nbytes() for v in node.outputs)
            limits.check_count("bytes of folded constants", total, limits.current().max_parameter_bytes,
                               f"pass fold-constants, node {node.name!r}")
            schema = get_schema(node.op)
            if schema.has("quantize"):
                continue
            results = schema.kernel(node, [v.const for v in node.inputs if v is not None and v.const is not None])
            for value, data in zip(node.outputs, results):
                const = graph.add_constant(graph.unique_name(value.name + "_folded"), data.astype(data.dtype))
                const.quant = value.quant
                value.replace_all_uses_with(const, graph)
            graph.nodes = [n for n in graph.nodes if n is not node]
            node.detach()
            folded += 1
        if folded:
            graph.cleanup()
        return PassResult(model, folded > 0, frozenset())
