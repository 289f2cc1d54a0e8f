"""Float mode: no activation annotated; every kernel computes in float32.

Weights annotated by a weight-only scheme are stored as the float values they read back as.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import qcc.backends.c.modes.shared as shared
from qcc.backends.c.ctype import FLOAT, CType
from qcc.backends.c.kernels import conv as KC
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import matmul as KMm
from qcc.backends.c.kernels import normalization as KN
from qcc.backends.c.kernels import pool as KP
from qcc.backends.c.kernels.helpers import KernelSet
from qcc.backends.c.lower import (
    Arg,
    Call,
    LowerFn,
    Lowering,
    NumericMode,
    Ptr,
    Step,
    numel,
    static_shape,
)
from qcc.backends.c.params import (
    bcast_params,
    conv_params,
    conv_transpose_params,
    float_literal,
    pool_params,
)

from qcc.errors import UnsupportedError
from qcc.ir.core import Node, Value
from qcc.sim import fixed as fx


def _epilogue(lw: Lowering, node: Node, residual: bool = False) -> tuple[KC.Epilogue, list[Arg]]:
    """The float epilogue of a Conv/Dense: its bias, then a BatchNorm with constant parameters, a
    residual Add (`residual`: the tiled convolution) and a one-input activation that alone read its
    output, computed as their own kernels would (a + b is b + a, bit for bit)."""
    ep, args = KC.float_epilogue(), []
    nxt = lw.consumer(node.outputs[0])
    if nxt is not None and nxt.op == "BatchNorm" and all(v is not None and v.const is not None
                                                          for v in nxt.inputs[1:5]):
        ep = KC.with_batchnorm(ep)
        args += shared.batchnorm_arrays(lw, nxt)
        lw.fuse(nxt)
        nxt = lw.consumer(nxt.outputs[0])
    added = residual and nxt is not None and _residual_operand(lw, node, nxt) is not None
    if added:
        assert nxt is not None
        ep = KC.with_residual(ep)
        args.append(Ptr(nxt.input(1)))
        lw.fuse(nxt)
        nxt = lw.consumer(nxt.outputs[0])
    if nxt is not None and nxt.op in KE.UNARY:
        stmts, params, helpers = KE.UNARY[nxt.op]
        ep = (KC.with_stored_unary if added else KC.with_unary)(ep, nxt.op, stmts, params, helpers)
        args += shared.unary_params(lw, nxt)
        lw.fuse(nxt)
    return ep, args


def _residual_operand(lw: Lowering, node: Node, add: Node) -> Value | None:
    """The other operand of an Add the convolution `node` can compute: a stored float32 tensor of the
    output's shape (no broadcast), computed before `node` runs (a graph input or an earlier node's)."""
    if add.op != "Add" or len(add.inputs) != 2:
        return None
    skip = add.input(1)
    out = add.outputs[0]
    if skip.const is not None or skip.type.dtype != "float32" or out.type.dtype != "float32" or \
            static_shape(skip) != static_shape(out) or static_shape(out) != static_shape(node.outputs[0]):
        return None
    producer = skip.producer()
    nodes = lw.model.graph.nodes
    return skip if producer is None or nodes.index(producer) < nodes.index(node) else None


def _conv(lw: Lowering, node: Node) -> Step:
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    params = conv_params(lw, node)
    bias = lw.const(b, node) if b is not None else "NULL"
    if w.const is None:
        raise lw.unsupported(node, "weights must be constant")
    _, stored, comment = lw.mode.param(lw, w, node)
    group = node.attrs["group"]
    depthwise = KC.is_depthwise(stored.shape, group)
    ep, extra = _epilogue(lw, node, residual=not depthwise)
    if depthwise:
        fn = KC.depthwise(lw.kernels, FLOAT, FLOAT, FLOAT, ep, "float")
        weights = lw.const(w, node)
    else:
        fn = KC.conv_float(lw.kernels, ep)
        weights = lw.array(KC.pack_conv_weights(np.asarray(stored, dtype=np.float32), group, KC.FWB), FLOAT,
                           f"qcc_w_{node.name}", f"{comment}, blocks of {KC.FWB} output channels by taps "
                           "(ky, kx, input channel)")
    return Step(node, [Call(fn, (Ptr(x), weights, bias, Ptr(y), params, *extra))])


def _conv_transpose(lw: Lowering, node: Node) -> Step:
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    fn = KC.conv_transpose_f32(lw.kernels)
    bias = lw.const(b, node) if b is not None else "NULL"
    return Step(node, [Call(fn, (Ptr(x), lw.const(w, node), bias, Ptr(y), conv_transpose_params(lw, node)))])


def _dense(lw: Lowering, node: Node) -> Step:
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    n, k = static_shape(x)
    if w.const is None:
        raise lw.unsupported(node, "weights must be constant")
    _, stored, comment = lw.mode.param(lw, w, node)
    ep, extra = _epilogue(lw, node)
    fn = KC.dense(lw.kernels, FLOAT, FLOAT, FLOAT, ep, "float")
    weights = lw.array(KC.pack_dense_weights(np.asarray(stored, dtype=np.float32)), FLOAT, f"qcc_w_{node.name}",
                       f"{comment}, packed in blocks of {KC.OB} columns")
    bias = lw.const(b, node) if b is not None else "NULL"
    return Step(node, [Call(fn, (Ptr(x), weights, bias, Ptr(y), str(n), str(k), str(static_shape(y)[1]), *extra))])


def _pool(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    params, _ = pool_params(lw, node)
    average = node.op in ("AvgPool", "GlobalAvgPool")
    fn = KP.avgpool(lw.kernels, FLOAT) if average else KP.maxpool(lw.kernels, FLOAT, FLOAT)
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params))])


def binary(lw: Lowering, node: Node) -> Step:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    out = static_shape(y)
    bcast = bcast_params(lw, node)
    args: list[Arg] = [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(numel(y)), bcast]
    step = Step(node, [Call(KE.binary(lw.kernels, node.op, FLOAT), tuple(args))])
    step.inplace = tuple(i for i, v in enumerate((a, b)) if v.const is None and static_shape(v) == out)
    return step


def _lrn(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    a = node.attrs
    args = (Ptr(x), Ptr(y), str(shape[0]), str(shape[1]), str(int(np.prod(shape[2:]))), str(a["size"]),
            float_literal(a["alpha"]), float_literal(a["beta"]), float_literal(a["bias"]))
    return Step(node, [Call(KN.lrn_f32(lw.kernels), args)])


def _matmul(lw: Lowering, node: Node) -> Step:
    return Step(node, [Call(KMm.matmul_f32(lw.kernels), tuple(shared.matmul_args(lw, node)))])


LAYERS: dict[str, LowerFn] = {
    "LayerNorm": shared.layernorm, "GroupNorm": shared.groupnorm, "InstanceNorm": shared.groupnorm,
    "Resize": shared.resize, "DepthToSpace": shared.block_move, "SpaceToDepth": shared.block_move,
    "Gather": shared.gather, "ArgMax": shared.argmax, "TopK": shared.topk, "Slice": shared.slice_,
    "Split": shared.split,
    **{op: shared.reduce_float for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2")},
}
"""Lowerings every numeric mode shares (float islands with the mode's getter/setter, moves with
its element copy)."""


class FloatMode(NumericMode):
    name = "float"
    title = "float32"
    integer = False
    lowerings: ClassVar[dict[str, LowerFn]] = {
        "Conv": _conv, "ConvTranspose": _conv_transpose, "Dense": _dense, "MaxPool": _pool, "AvgPool": _pool, "GlobalAvgPool": _pool,
        "GlobalMaxPool": _pool, "Softmax": shared.softmax, "BatchNorm": shared.batchnorm, "Concat": shared.concat,
        "Transpose": shared.transpose, "LRN": _lrn, "MatMul": _matmul, "Pad": shared.pad, **LAYERS,
        **{op: shared.unary for op in KE.UNARY},
        **{op: binary for op in KE.BINARY_F32},
    }

    def claims(self, acts: Sequence[Value]) -> bool:
        return True

    def check(self, acts: Sequence[Value]) -> None:
        for value in acts:
            if value.type.dtype != "float32":
                raise UnsupportedError(f"target c: tensor {value.name!r} has dtype {value.type.dtype}; "
                                       "only float32 tensors are supported")

    def ctype(self, value: Value) -> CType:
        return FLOAT

    def param(self, lw: Lowering, value: Value, node: Node) -> tuple[CType, np.ndarray, str]:
        stored = fx.quantize_param(value)
        if fx.fixed_of(value) is not None:
            stored = fx.dequantize_stored(value, stored)
        return FLOAT, stored, f"{value.name}: {value.type} {value.quant or ''}".rstrip()

    def scales(self, x: Value, y: Value) -> list[str]:
        return []

    def copy_args(self, lw: Lowering, node: Node, x: Value, y: Value) -> list[str]:
        return []

    def transfer(self, ks: KernelSet, value: Value, inbound: bool) -> tuple[str, list[str]] | None:
        return None

    def tensor_macros(self, key: str, value: Value) -> list[str]:
        return [f'#define {key}_TYPE "float32"']

    def view(self, lw: Lowering, node: Node) -> Step:
        """Every view is the input's storage (annotations of float tensors change no value)."""
        return Step(node, alias=True)


FLOAT_MODE = FloatMode()
