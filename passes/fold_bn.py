"""The `fold-bn` pass: BatchNorm after Conv / ConvTranspose / Dense becomes part of that layer.

y = (W*x + b - mean) * s + beta with s = gamma / sqrt(var + eps) is W' = W*s (per output
channel), b' = (b - mean)*s + beta, computed in float64 and rounded once to the weight dtype, so
the folded layer equals the pair to float rounding. The folded layer's output takes the
BatchNorm output's name: that tensor holds what the BatchNorm output held, and matching float
and quantized runs by name (reports, sensitivity) stays right.

Refused, with a report line each (section `fold_bn`): a weight or bias that is not a constant
(a graph input or computed), a weight or bias another node also uses, a layer output with
other consumers, non-constant BatchNorm statistics, and SIGN (binarized) weights.
"""

from __future__ import annotations

import attrs
import numpy as np
from qcc.passes.quantutil import WEIGHT_OPS

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.types import Sign
from qcc.pm.base import Pass, PassContext, PassResult

SECTION = "fold_bn"


@attrs.frozen
class FoldBatchNorm(Pass):
    """Fold BatchNorm into the preceding Conv / depthwise Conv / ConvTranspose / Dense."""

    name = "fold-bn"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        folded = 0
        for bn in [n for n in graph.nodes if n.op == "BatchNorm"]:
            reason = _refusal(graph, bn)
            if reason:
                ctx.note(SECTION, {"node": bn.name, "folded": False, "reason": reason})
                continue
            _fold(graph, bn)
            folded += 1
        if not folded:
            return PassResult.unchanged(model)
        graph.cleanup()
        return PassResult(model, True, frozenset())


def _refusal(graph: Graph, bn: Node) -> str:
    """Why this BatchNorm cannot be folded ('' when it can)."""
    layer = bn.input(0).producer()
    if layer is None or layer.op not in WEIGHT_OPS:
        return "not preceded by Conv, ConvTranspose or Dense"
    out = layer.outputs[0]
    if len(out.uses()) != 1 or any(v is out for v in graph.outputs):
        return f"output of {layer.op} {layer.name!r} has other consumers"
    if any(v is None or v.const is None for v in bn.inputs[1:]):
        return "BatchNorm statistics are not constants"
    for index, role in ((1, "weight"), (2, "bias")):
        value = layer.inputs[index] if index < len(layer.inputs) else None
        if value is None:
            continue
        if value.const is None:
            kind = "a graph input" if any(v is value for v in graph.inputs) else "not a constant"
            return f"{role} {value.name!r} of {layer.name!r} is {kind}"
        if len(value.uses()) != 1:
            return f"{role} {value.name!r} of {layer.name!r} is shared with other nodes"
        if isinstance(value.quant, Sign):
            return f"{role} {value.name!r} of {layer.name!r} is binary (SIGN)"
    if layer.op == "Dense" and bn.input(0).type.rank != 2:
        return "BatchNorm after Dense must normalize a (N, M) tensor"
    return ""


def bn_scale_shift(bn: Node) -> tuple[np.ndarray, np.ndarray]:
    """(s, t) with BatchNorm(x) = x*s + t per channel, in float64."""
    gamma, beta, mean, var = (np.asarray(v.const, dtype=np.float64) for v in bn.inputs[1:])  # type: ignore[union-attr]
    s = gamma / np.sqrt(var + float(bn.attrs["epsilon"]))
    return s, beta - mean * s


def _channel_view(layer: Node, w: np.ndarray, per_channel: np.ndarray) -> np.ndarray:
    """per_channel reshaped to broadcast over the weight's output channels."""
    if layer.op == "Conv":
        return per_channel.reshape(-1, *([1] * (w.ndim - 1)))
    if layer.op == "Dense":
        return per_channel.reshape(1, -1)
    group = int(layer.attrs["group"])  # ConvTranspose: (C, O/g, kh, kw), channel g*(O/g) + j
    c, og = w.shape[0], w.shape[1]
    full = np.broadcast_to(per_channel.reshape(group, 1, og, 1, 1), (group, c // group, og, 1, 1))
    return full.reshape(c, og, 1, 1)


def _fold(graph: Graph, bn: Node) -> None:
    layer = bn.input(0).producer()
    assert layer is not None
    weight = layer.input(1)
    w = weight.const
    assert w is not None
    s, t = bn_scale_shift(bn)
    weight.const = np.ascontiguousarray((w.astype(np.float64) * _channel_view(layer, w, s)).astype(w.dtype))
    bias = layer.inputs[2] if len(layer.inputs) > 2 else None
    old_b = np.zeros(s.shape) if bias is None or bias.const is None else bias.const.astype(np.float64)
    new_b = (old_b * s + t).astype(w.dtype)
    if bias is None:
        bias = graph.add_constant(graph.unique_name(f"{layer.name}.bias"), new_b)
        if len(layer.inputs) < 3:
            layer.inputs = (*layer.inputs, None)
        layer.set_input(2, bias)
    else:
        bias.const = new_b
    out = layer.outputs[0]
    bn_out = bn.outputs[0]
    bn_out.replace_all_uses_with(out, graph)
    graph.remove(bn)
    _take_name(graph, out, bn_out)


def _take_name(graph: Graph, value: Value, gone: Value) -> None:
    """value inherits the removed value's name (and user annotations)."""
    value.name = gone.name
    if gone.quant is not None and value.quant is None:
        value.quant = gone.quant
    for key, item in gone.meta.items():
        value.meta.setdefault(key, item)
