"""The `fuse-hard-activation` pass.

Exporters that predate ONNX's HardSigmoid/HardSwish (and `torch.onnx` at opset < 14) spell them
out as arithmetic:

    hard-sigmoid:  Div(Clip(Add(x, b), 0, m), m)             = clamp(x/m + b/m, 0, 1)
    hard-swish:    Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)     = x * relu6(x + 3) / 6   (torch)
                   Mul(x, Div(Clip(Add(x, 3), 0, 6), 6))     = x * hard-sigmoid(x)

(`Div(_, m)` may also be `Mul(_, 1/m)`, and the constant of Add/Mul may be on either side.)
Three or four nodes and two intermediate tensors become one node, which matters for a
quantizer: every intermediate tensor is another place to lose precision and another buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

import qcc
from qcc.ir import Graph, Node, Value, match_chains, replace_node

REPORT_SECTION = "hard_activations"


@attrs.frozen
class FuseHardActivation(qcc.Pass):
    """Fuse Clip(x+b,0,m)/m into HardSigmoid and x*hardsigmoid(x) (x*relu6(x+3)/6) into HardSwish."""

    name = "fuse-hard-activation"

    max_value: float = attrs.field(default=6.0, metadata={"help": "Clip upper bound and divisor m"})
    hardswish: bool = attrs.field(default=True, metadata={"help": "fold x*HardSigmoid(x) into HardSwish"})
    tolerance: float = attrs.field(default=1e-6, metadata={"help": "tolerance comparing constants"})

    def __attrs_post_init__(self) -> None:
        if not self.max_value > 0:
            raise ValueError(f"max_value must be > 0, got {self.max_value}")

    def run(self, model: qcc.Model, ctx: qcc.PassContext) -> qcc.PassResult:
        graph = model.graph
        fused: list[Node] = []
        for add, clip in list(match_chains(graph, ["Add", "Clip"])):
            node = self._fuse_hard_sigmoid(graph, add, clip)
            if node is not None:
                fused.append(node)
        if self.hardswish:
            for mul in [n for n in graph.nodes if n.op == "Mul"]:
                node = self._fuse_hard_swish(graph, mul)
                if node is not None:
                    fused.append(node)
        if not fused:
            return qcc.PassResult.unchanged(model)
        alive = {id(n) for n in graph.nodes}  # a HardSigmoid folded into a HardSwish is gone
        for node in (n for n in fused if id(n) in alive):
            ctx.note(REPORT_SECTION, {"node": node.name, "op": node.op, "attrs": dict(node.attrs)})
        return qcc.PassResult(model, True, frozenset())

    # ------------------------------------------------------------------ patterns
    def _fuse_hard_sigmoid(self, graph: Graph, add: Node, clip: Node) -> Node | None:
        split = _scalar_operand(add)
        if split is None:
            return None
        x, offset = split
        m = self.max_value
        if add.outputs[0].type != x.type or not self._close(clip.attrs.get("min"), 0.0) \
                or not self._close(clip.attrs.get("max"), m):
            return None
        user = _only_user(graph, clip.outputs[0])
        if user is None:
            return None
        attributes = {"alpha": 1.0 / m, "beta": offset / m}
        if self._is_scale_by_inverse(user, clip.outputs[0]):
            # Div(Clip(Add(x, b)), m): the Div becomes HardSigmoid(x), keeping its output value.
            user_inputs = list(user.inputs)
            new = replace_node(graph, user, "HardSigmoid", inputs=[x], attributes=attributes)
            _drop(graph, [clip, add], extra_constants=user_inputs)
            return new
        if user.op == "Mul" and _other_operand(user, clip.outputs[0]) is x:
            # Div(Mul(x, Clip(Add(x, b))), m): the Clip becomes HardSigmoid(x) and the Div becomes
            # Mul(x, HardSigmoid(x)); the last node keeps its output value, so names survive.
            scale = _only_user(graph, user.outputs[0])
            if scale is None or not self._is_scale_by_inverse(scale, user.outputs[0]):
                return None
            scale_inputs = list(scale.inputs)
            new = replace_node(graph, clip, "HardSigmoid", inputs=[x], attributes=attributes)
            replace_node(graph, scale, "Mul", inputs=[x, new.outputs[0]], attributes={})
            _drop(graph, [user, add], extra_constants=scale_inputs)
            return new
        return None

    def _fuse_hard_swish(self, graph: Graph, mul: Node) -> Node | None:
        for hsig_out in mul.inputs:
            hsig = hsig_out.producer() if hsig_out is not None else None
            if hsig is None or hsig.op != "HardSigmoid" or hsig_out is None:
                continue
            x = hsig.input(0)
            if _other_operand(mul, hsig_out) is not x or _only_user(graph, hsig_out) is not mul:
                continue
            if self._close(hsig.attrs["alpha"], 1.0 / 6.0) and self._close(hsig.attrs["beta"], 0.5):
                new = replace_node(graph, mul, "HardSwish", inputs=[x], attributes={})
                _drop(graph, [hsig])
                return new
        return None

    # ------------------------------------------------------------------ helpers
    def _close(self, value: object, want: float) -> bool:
        return isinstance(value, (int, float)) and math.isclose(
            float(value), want, rel_tol=self.tolerance, abs_tol=self.tolerance
        )

    def _is_scale_by_inverse(self, node: Node, value: Value) -> bool:
        """`value / max_value` or `value * (1 / max_value)`, not broadcasting to a new shape."""
        if node.outputs[0].type != value.type or _other_operand(node, value) is None:
            return False
        split = _scalar_operand(node)
        if split is None or split[0] is not value:
            return False
        if node.op == "Div":
            return node.inputs[0] is value and self._close(split[1], self.max_value)
        return node.op == "Mul" and self._close(split[1], 1.0 / self.max_value)


def _scalar_operand(node: Node) -> tuple[Value, float] | None:
    """(the non-constant operand, the scalar) for a binary node with one one-element constant."""
    a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    for data, const in ((a, b), (b, a)):
        if data is not None and const is not None and not data.is_const and const.const is not None \
                and const.const.size == 1 and const.const.dtype.kind == "f":
            return data, float(const.const.reshape(-1)[0])
    return None


def _other_operand(node: Node, value: Value) -> Value | None:
    """The other input of a binary node that uses `value` exactly once."""
    if len(node.inputs) != 2 or sum(v is value for v in node.inputs) != 1:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _only_user(graph: Graph, value: Value) -> Node | None:
    users = value.consumers()
    if len(users) != 1 or any(v is value for v in graph.outputs):
        return None
    return users[0]


def _drop(graph: Graph, nodes: list[Node], extra_constants: Iterable[Value | None] = ()) -> None:
    """Remove now-dead nodes (users first) and the constants only they used."""
    constants = [v for n in nodes for v in n.inputs if v is not None and v.is_const]
    constants += [v for v in extra_constants if v is not None and v.is_const]
    for node in nodes:
        graph.remove(node)
    dead = {id(v) for v in constants if not v.uses() and not any(v is o for o in graph.outputs)}
    graph.constants = [c for c in graph.constants if id(c) not in dead]
