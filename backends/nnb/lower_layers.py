"""Issue-17 ops as functions nnabla-c-runtime implements (registered in `lower.LOWERINGS`, which
loads this module): PRelu -> PReLU; nearest Resize by whole factors -> Unpooling; and, where the
runtime has no function of its own, a sequence of functions it has, computing in float32 between
the node's input and output (their arithmetic is qcc.sim.fixed's for the op):
HardSwish -> MulScalar(1/6), AddScalar(1/2), MaximumScalar(0), MinimumScalar(1), Mul2(x, .);
LRN -> Mul2(x, x), Reshape, [Pad], SumPooling over channels, Reshape, MulScalar(alpha/size),
AddScalar(bias), PowScalar(beta), Div2(x, .); DepthToSpace/SpaceToDepth -> Reshape, Transpose,
Reshape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qcc.ir.core import Node
from qcc.ir.ops.resize import plans
from qcc.ir.ops.tensor import block_transpose

from .format import ArgValue
from .lower import Lowerer, lowering, unsupported
from .program import FLOAT, NVar


@lowering("PRelu")
def _prelu(lw: Lowerer, node: Node) -> None:
    """nnabla's PReLU takes one slope, or one per index of the axis `base_axis`."""
    x, slope = node.input(0), node.input(1)
    if slope.const is None:
        raise unsupported(node, "the slope must be a constant")
    full = (1,) * (x.type.rank - slope.type.rank) + tuple(int(d) for d in slope.type.shape)
    axes = [i for i, d in enumerate(full) if d != 1]
    if len(axes) > 1 or axes[:1] == [0]:
        raise unsupported(node, f"a slope of shape {slope.type.shape} (nnabla's PReLU: one per channel or one)")
    weight = lw.param(slope, "prelu", (int(slope.const.size),), lambda a: a.reshape(-1))
    lw.emit(node, "PReLU", [lw.var(x, node), weight], [lw.define(node.outputs[0])], base_axis=axes[0] if axes else 1)


@lowering("Resize")
def _resize(lw: Lowerer, node: Node) -> None:
    """Unpooling repeats each element k times along an axis: nearest Resize whose index plan is i // k."""
    x = node.input(0)
    kernel = []
    for plan, size_in, size_out in zip(plans(node)[-2:], x.type.shape[-2:], node.outputs[0].type.shape[-2:]):
        factor = int(size_out) // int(size_in) if plan is not None else 1
        if plan is not None and (node.attrs["mode"] != "nearest" or int(size_out) != factor * int(size_in)
                                 or not np.array_equal(plan.lo, np.arange(int(size_out)) // factor)):
            raise unsupported(node, f"{node.attrs['mode']} resize to {node.outputs[0].type.shape} (nnabla-c-runtime "
                                    "has Unpooling: nearest by whole factors, index i // k)")
        kernel.append(factor)
    if any(p is not None for p in plans(node)[:-2]) or x.type.rank != 4:
        raise unsupported(node, "only the spatial axes of an NCHW tensor may be resized")
    lw.emit(node, "Unpooling", [lw.var(x, node)], [lw.define(node.outputs[0])], kernel=tuple(kernel),
            channel_last=False)


def _chain(lw: Lowerer, node: Node, x: NVar, steps: Sequence[tuple[str, dict[str, ArgValue]]], suffix: str) -> NVar:
    """Functions one after another on float32 intermediates (in the shape of x)."""
    for i, (kind, args) in enumerate(steps):
        out = lw.temp(x, FLOAT, f"{suffix}{i}")
        lw.emit(None, kind, [x], [out], **args)
        x = out
    return x


@lowering("HardSwish")
def _hardswish(lw: Lowerer, node: Node) -> None:
    x = lw.var(node.input(0), node)
    gate = _chain(lw, node, x, [("MulScalar", {"val": 1 / 6, "inplace": False}),
                                ("AddScalar", {"val": 0.5, "inplace": False}),
                                ("MaximumScalar", {"val": 0.0}), ("MinimumScalar", {"val": 1.0})], "gate")
    lw.emit(node, "Mul2", [x, gate], [lw.define(node.outputs[0])], inplace=False)


@lowering("LRN")
def _lrn(lw: Lowerer, node: Node) -> None:
    """The channel window sum is a SumPooling of the (N, 1, C, H*W) view of x * x."""
    x = node.input(0)
    if x.type.rank != 4:
        raise unsupported(node, f"LRN of a rank-{x.type.rank} tensor (NCHW only)")
    n, c, h, w = lw.shape(x)
    size, a = int(node.attrs["size"]), node.attrs
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    xv = lw.var(x, node)
    square = lw.temp(xv, FLOAT, "square")
    lw.emit(None, "Mul2", [xv, xv], [square], inplace=False)
    planes = lw.temp(xv, FLOAT, "planes", (n, 1, c, h * w))
    lw.emit(None, "Reshape", [square], [planes], shape=(n, 1, c, h * w), inplace=False)
    pad = (lo, 0)
    if lo != hi:
        padded = lw.temp(xv, FLOAT, "padded", (n, 1, c + size - 1, h * w))
        lw.emit(None, "Pad", [planes], [padded], pad_width=(lo, hi, 0, 0), mode=0, constant_value=0.0)
        planes, pad = padded, (0, 0)
    sums = lw.temp(xv, FLOAT, "sums", (n, 1, c, h * w))
    lw.emit(None, "SumPooling", [planes], [sums], kernel=(size, 1), stride=(1, 1), ignore_border=True, pad=pad,
            channel_last=False)
    window = lw.temp(xv, FLOAT, "window")
    lw.emit(None, "Reshape", [sums], [window], shape=(n, c, h, w), inplace=False)
    power = _chain(lw, node, window, [("MulScalar", {"val": a["alpha"] / size, "inplace": False}),
                                      ("AddScalar", {"val": a["bias"], "inplace": False}),
                                      ("PowScalar", {"val": a["beta"], "inplace": False})], "denominator")
    lw.emit(node, "Div2", [xv, power], [lw.define(node.outputs[0])], inplace=False)


@lowering("DepthToSpace", "SpaceToDepth")
def _block_move(lw: Lowerer, node: Node) -> None:
    x, y = node.input(0), node.outputs[0]
    view, perm = block_transpose(node)
    view = (lw.shape(x)[0], *view[1:])
    xv = lw.var(x, node)
    six = lw.temp(xv, xv.storage, "6d", view)
    lw.emit(None, "Reshape", [xv], [six], shape=view, inplace=False)
    moved = lw.temp(xv, xv.storage, "moved", tuple(view[p] for p in perm))
    lw.emit(None, "Transpose", [six], [moved], axes=tuple(perm))
    lw.emit(node, "Reshape", [moved], [lw.define(y)], shape=lw.shape(y), inplace=False)
