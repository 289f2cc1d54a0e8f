"""The `binarize-weights` pass: nnabla's BinaryWeight and BinaryConnect for Conv and Dense.

- binary-weight (nnabla BinaryWeightConvolution/Affine): W ~ alpha_c * sign(W), alpha_c =
  mean |W| over output channel c. The weight constant is replaced by sign(W) annotated `Sign`,
  and a per-channel Mul by alpha follows the layer (before its bias, which becomes an Add).
  With fold_alpha, when the layer's only consumer is a BatchNorm and every alpha is > 0, alpha
  is folded into that BatchNorm's scale and mean instead (exact).
- binary-connect (nnabla BinaryConnectConvolution/Affine): W -> sign(W), nothing else. It is
  meant for networks trained with BinaryConnect (their BatchNorm statistics were computed for
  sign(W)); on a float-trained network expect a large accuracy loss.

sign(0) is +1, as nnabla-c-runtime's SIGN setter (bit = value >= 0). Activations stay float
(the seeds' binary networks); an annotation pass may still run afterwards.
"""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np
from qcc.passes.quantutil import (
    canonical_op,
    check_choices,
    check_finite_params,
    node_selected,
    weight_axis,
)

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.types import Sign, TensorType
from qcc.pm.base import Pass, PassContext, PassResult

SECTION = "binarize_weights"


def _ops(value: tuple[str, ...]) -> tuple[str, ...]:
    ops = tuple(canonical_op(op) for op in value)
    bad = [op for op in ops if op not in ("Conv", "Dense")]
    if bad:
        raise ValueError(f"binarize-weights works on Conv and Dense, not {bad}")
    return ops


@attrs.frozen
class BinarizeWeights(Pass):
    """Binary weights for Conv/Dense: BinaryWeight (sign * per-channel alpha) or BinaryConnect (sign)."""

    name = "binarize-weights"

    mode: Literal["binary-weight", "binary-connect"] = attrs.field(
        default="binary-weight", metadata={"help": "nnabla BinaryWeight or BinaryConnect"})
    ops: tuple[str, ...] = attrs.field(default=("Conv", "Dense"), converter=_ops,
                                       metadata={"help": "layer types to binarize"})
    include: tuple[str, ...] = attrs.field(default=(), metadata={"help": "node-name globs to keep"})
    exclude: tuple[str, ...] = attrs.field(default=(), metadata={"help": "node-name globs to skip"})
    fold_alpha: bool = attrs.field(default=False, metadata={"help": "fold alpha into a following BatchNorm"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        check_finite_params(model)
        graph = model.graph
        done = 0
        for node in list(graph.nodes):
            if node.op not in self.ops or not node_selected(node, self.include, self.exclude):
                continue
            w = node.inputs[1]
            reason = _refusal(w)
            if reason:
                ctx.note(SECTION, {"node": node.name, "binarized": False, "reason": reason})
                continue
            assert w is not None and w.const is not None
            alpha = channel_alpha(w.const, weight_axis(node))
            w.const = np.where(w.const >= 0, 1.0, -1.0).astype(w.const.dtype)
            w.quant = Sign()
            w.meta["pinned"] = True
            w.meta["binarized"] = self.mode
            if self.mode == "binary-weight":
                self._scale(graph, node, alpha, ctx)
            done += 1
        if not done:
            return PassResult.unchanged(model)
        return PassResult(model, True, frozenset())

    def _scale(self, graph: Graph, node: Node, alpha: np.ndarray, ctx: PassContext) -> None:
        users = node.outputs[0].consumers()
        has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
        if self.fold_alpha and len(users) == 1 and users[0].op == "BatchNorm" and (alpha > 0).all() \
                and not has_bias:
            bn = users[0]
            if _fold_into_bn(graph, bn, alpha):
                ctx.note(SECTION, {"node": node.name, "alpha": f"folded into {bn.name!r}"})
                return
        insert_channel_scale(graph, node, alpha)


def _refusal(w: Value | None) -> str:
    if w is None or w.const is None:
        return "weight is not a constant"
    if len(w.uses()) != 1:
        return f"weight {w.name!r} is shared with other nodes"
    if w.meta.get("pinned"):
        return f"weight {w.name!r} is pinned ({w.meta.get('override') or w.quant})"
    return ""


def channel_alpha(w: np.ndarray, axis: int) -> np.ndarray:
    """mean |W| per output channel (float64)."""
    others = tuple(a for a in range(w.ndim) if a != axis)
    return np.abs(w.astype(np.float64)).mean(axis=others)


def insert_channel_scale(graph: Graph, node: Node, alpha: np.ndarray) -> None:
    """node(x, sign W, b) -> Add(Mul(node(x, sign W), alpha), b): y = alpha * (x conv sign W) + b."""
    from qcc.ir.surgery import insert_after

    out = node.outputs[0]
    dtype = out.type.dtype
    shape = (1, -1, 1, 1) if node.op == "Conv" else (1, -1)
    alpha_c = graph.add_constant(graph.unique_name(f"{node.name}.alpha"), alpha.astype(dtype).reshape(shape))
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None:
        node.set_input(2, None)
    public = out.name
    mul = insert_after(graph, out, "Mul", extra_inputs=[alpha_c], name=f"{node.name}_alpha")
    last = mul
    if bias is not None:
        if bias.const is not None and not bias.uses():  # reshaped to broadcast over channels
            bias.const = np.ascontiguousarray(bias.const.reshape(shape))
            bias.type = TensorType(bias.type.dtype, bias.const.shape)
        last = insert_after(graph, mul.outputs[0], "Add", extra_inputs=[bias], name=f"{node.name}_bias")
    # the layer's result keeps the public name (reports, overrides, sensitivity match by name)
    out.name = graph.unique_name(f"{public}_unscaled")
    last.outputs[0].name = public
    graph.cleanup()


def _fold_into_bn(graph: Graph, bn: Node, alpha: np.ndarray) -> bool:
    """BN(alpha*y) = BN'(y) with scale' = scale*alpha, mean' = mean/alpha (alpha > 0)."""
    scale, mean = bn.inputs[1], bn.inputs[3]
    if scale is None or mean is None or scale.const is None or mean.const is None \
            or len(scale.uses()) != 1 or len(mean.uses()) != 1:
        return False
    scale.const = (scale.const.astype(np.float64) * alpha).astype(scale.const.dtype)
    mean.const = (mean.const.astype(np.float64) / alpha).astype(mean.const.dtype)
    return True
