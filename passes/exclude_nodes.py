"""The `exclude-nodes` pass: nodes kept in float, by name or by op type.

onnxruntime.quantization's `nodes_to_exclude` and `op_types_to_quantize` (qcc.compile accepts
both names, qcc/ort_options.py). Node names survive BN folding (the folded Conv keeps its name,
its output the BatchNorm's), so the rules are made here, on the graph as it is when the pass
runs, not on the loaded one: each excluded node's outputs and constant inputs become FLOAT32
pins, exactly as `--override NAME=FLOAT32` would make them (listed in `float_fallbacks`).
"""

from __future__ import annotations

import attrs
from qcc.passes.apply_overrides import apply_rules, parse_rule
from qcc.passes.quantutil import is_float

from qcc.errors import UsageError
from qcc.ir.core import Model
from qcc.pm.base import Pass, PassContext, PassResult


def escape_glob(name: str) -> str:
    """A name as an fnmatch pattern matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@attrs.frozen
class ExcludeNodes(Pass):
    """Keep the named nodes, and with `only_ops` every node of another op, in float."""

    name = "exclude-nodes"

    nodes: tuple[str, ...] = attrs.field(default=(), converter=tuple, metadata={"help": "node names, '|'-separated"})
    only_ops: tuple[str, ...] = attrs.field(default=(), converter=tuple,
                                            metadata={"help": "IR ops to quantize; other nodes stay float (empty: all)"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        by_name = {n.name: n for n in model.graph.nodes}
        missing = [n for n in self.nodes if n not in by_name]
        if missing:
            raise UsageError(f"nodes_to_exclude: no node {missing[0]!r} in model {model.graph.name!r}")
        excluded = [by_name[n] for n in self.nodes]
        if self.only_ops:
            allowed = {*self.only_ops, "Quantize"}
            excluded += [n for n in model.graph.nodes if n.op not in allowed and n not in excluded]
        rules: list[str] = []
        for node in excluded:
            for value in [*node.outputs, *(v for v in node.inputs if v is not None and v.is_const)]:
                rule = f"{escape_glob(value.name)}=FLOAT32"
                if is_float(value) and rule not in rules:
                    rules.append(rule)
        if not rules:
            return PassResult.unchanged(model)
        values = [v for v in model.graph.values() if is_float(v)]
        apply_rules(values, [parse_rule(r, "nodes_to_exclude") for r in rules], ctx)
        return PassResult(model, True, frozenset({"*"}))
