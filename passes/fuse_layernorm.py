"""The `fuse-layernorm` pass: LayerNorm spelled out in elementwise ops becomes one LayerNorm.

paddle2onnx (and torch.onnx below opset 17) write layer normalization as

    d = x - ReduceMean(x, axes)          (keepdims, the trailing axes)
    y = d / Sqrt(ReduceMean(Pow(d, 2), axes) + eps) [* gamma] [+ beta]

Target c's affine mode has no integer kernel for a Div by a tensor, but runs LayerNorm as a
float island (dequantize, float32, requantize: one report line per island, like Softmax). The
pass is that target's legalization, so it runs after quantization: x keeps its annotation, the
fused node's output is the chain's last value (name and annotation kept), gamma and beta stay
float32 as LayerNorm's parameters do, and the intermediate int8 tensors disappear. Not at import:
.nnb has no LayerNorm and runs the spelled-out chain.

Only an exact match is fused (every intermediate read by the chain alone and not a graph
output, the reductions over the same trailing axes, eps and the exponent constant scalars,
gamma and beta constants over the normalized axes); anything else is left as it is.
"""

from __future__ import annotations

import attrs
import numpy as np

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.ops._common import norm_axis
from qcc.ir.surgery import replace_node
from qcc.ir.types import Affine, Float32
from qcc.pm.base import Pass, PassContext, PassResult

SECTION = "legalization"


@attrs.frozen(eq=False)
class LayerNormChain:
    """One spelled-out LayerNorm: its nodes in graph order, x, the axis, eps and the parameters."""

    nodes: list[Node]
    x: Value
    axis: int
    epsilon: float
    gamma: np.ndarray | None
    beta: np.ndarray | None

    @property
    def last(self) -> Node:
        return self.nodes[-1]


@attrs.frozen
class FuseLayerNorm(Pass):
    """Fuse x - mean, / sqrt(var + eps), * gamma, + beta into LayerNorm (target c's legalization)."""

    name = "fuse-layernorm"

    only_affine: bool = attrs.field(default=True, metadata={
        "help": "fuse only chains whose output is affine-quantized (where target c has no Div kernel); "
                "false: every chain"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        fused = 0
        for node in list(graph.nodes):
            if node.op != "Div" or node not in graph.nodes:
                continue
            chain = match_layernorm(graph, node)
            if chain is None or (self.only_affine and not isinstance(chain.last.outputs[0].quant, Affine)):
                continue
            ops = "/".join(n.op for n in chain.nodes)
            ln = fuse(graph, chain)
            fused += 1
            ctx.note(SECTION, f"{ln.outputs[0].name}: {ops} around the Div {node.name!r} -> LayerNorm(axis "
                              f"{chain.axis}, eps {chain.epsilon:g})")
        if fused:
            graph.cleanup()
        return PassResult(model, True) if fused else PassResult.unchanged(model)


def fuse(graph: Graph, chain: LayerNormChain) -> Node:
    """Replace the chain by one LayerNorm writing the chain's last value."""
    inputs: list[Value | None] = [chain.x]
    for what, array in (("scale", chain.gamma), ("bias", chain.beta)):
        if array is None and what == "scale" and chain.beta is not None:
            array = np.ones(chain.beta.shape, np.float32)  # LayerNorm's bias comes after its scale
        if array is not None:
            const = graph.add_constant(graph.unique_name(f"{chain.last.name}/{what}"), array.astype(np.float32))
            const.quant = Float32()
            inputs.append(const)
    ln = replace_node(graph, chain.last, "LayerNorm", inputs, {"axis": chain.axis, "epsilon": chain.epsilon})
    for node in reversed(chain.nodes[:-1]):
        graph.remove(node)
    return ln


def match_layernorm(graph: Graph, div: Node) -> LayerNormChain | None:
    """The chain around `div` when it is a spelled-out LayerNorm, else None."""
    d, root = div.inputs[0], div.inputs[1]
    sub, sqrt = _producer(d, "Sub"), _producer(root, "Sqrt")
    if sub is None or sqrt is None or not _only_read_by(graph, root, [div]):
        return None
    x, mean = sub.inputs[0], sub.inputs[1]
    reduce_x = _producer(mean, "ReduceMean")
    if x is None or reduce_x is None or reduce_x.inputs[0] is not x or not _only_read_by(graph, mean, [sub]):
        return None
    axis = _trailing_axis(reduce_x, x.type.rank)
    add_eps = _producer(sqrt.inputs[0], "Add")
    if axis is None or add_eps is None or not _only_read_by(graph, sqrt.inputs[0], [sqrt]):
        return None
    var, eps = _split_scalar(add_eps)
    reduce_sq = _producer(var, "ReduceMean")
    if eps is None or reduce_sq is None or _trailing_axis(reduce_sq, x.type.rank) != axis or \
            not _only_read_by(graph, var, [add_eps]):
        return None
    square = _producer(reduce_sq.inputs[0], "Pow", "Mul")
    if square is None or not _squares(square, d) or not _only_read_by(graph, reduce_sq.inputs[0], [reduce_sq]) or \
            not _only_read_by(graph, d, [square, div]):
        return None
    nodes = [reduce_x, sub, square, reduce_sq, add_eps, sqrt, div]
    tail = tuple(x.type.shape[axis:])
    gamma = beta = None
    for op in ("Mul", "Add"):
        out = nodes[-1].outputs[0]
        users = out.consumers()
        nxt = users[0] if len(users) == 1 else None
        if nxt is None or nxt.op != op or not _only_read_by(graph, out, [nxt]):
            break
        other = nxt.inputs[1] if nxt.inputs[0] is out else nxt.inputs[0]
        param = _over_axes(other, tail)
        if param is None or nxt.outputs[0].type != out.type:
            break
        nodes.append(nxt)
        gamma, beta = (param, beta) if op == "Mul" else (gamma, param)
    if nodes[-1].outputs[0].type != x.type:
        return None
    return LayerNormChain(nodes, x, axis, eps, gamma, beta)


def _producer(value: Value | None, *ops: str) -> Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op in ops else None


def _only_read_by(graph: Graph, value: Value | None, users: list[Node]) -> bool:
    """`value` feeds these nodes and no other, and is not a graph output."""
    if value is None or any(v is value for v in graph.outputs):
        return False
    return {id(n) for n, _ in value.uses()} == {id(u) for u in users}


def _trailing_axis(node: Node, rank: int) -> int | None:
    """The first axis when a keepdims reduction covers exactly the trailing axes from it."""
    axes = node.attrs.get("axes")
    if not node.attrs.get("keepdims", True) or not axes:
        return None
    normed = sorted(norm_axis(a, rank) for a in axes)
    return normed[0] if normed == list(range(normed[0], rank)) else None


def _scalar(value: Value | None) -> float | None:
    if value is None or value.const is None or value.const.size != 1:
        return None
    return float(value.const.reshape(-1)[0])


def _split_scalar(add: Node) -> tuple[Value | None, float | None]:
    """(tensor operand, scalar constant) of a two-input node, (None, None) when it is not that."""
    for i in (0, 1):
        eps, tensor = _scalar(add.inputs[1 - i]), add.inputs[i]
        if eps is not None and tensor is not None and not tensor.is_const:
            return tensor, eps
    return None, None


def _squares(node: Node, d: Value | None) -> bool:
    """Pow(d, 2) or Mul(d, d)."""
    if node.op == "Pow":
        return node.inputs[0] is d and _scalar(node.inputs[1]) == 2.0
    return node.inputs[0] is d and node.inputs[1] is d


def _over_axes(value: Value | None, tail: tuple[int | str, ...]) -> np.ndarray | None:
    """A constant that varies only along the normalized axes, as an array of their shape."""
    if value is None or value.const is None or not all(isinstance(n, int) for n in tail):
        return None
    array = value.const
    while array.ndim > len(tail) and array.shape[0] == 1:
        array = array.reshape(array.shape[1:])
    if array.ndim > len(tail):
        return None
    try:
        return np.broadcast_to(array, tail).astype(np.float32)  # type: ignore[arg-type]
    except ValueError:
        return None
