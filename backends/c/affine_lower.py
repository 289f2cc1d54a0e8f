"""IR -> kernel calls for target c's affine int8/uint8 mode.

Every constant the kernels use (centered weights, accumulator biases, multipliers and shifts,
lookup tables) is computed by `qcc.sim.affine_int`, the simulator the generated code must equal
bit for bit; this module only places them in C arrays and chooses kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from qcc.backends.c.ctype import CType
from qcc.backends.c.kernels import conv as KC
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.kernels import pool as KP
from qcc.backends.c.lower import (
    VIEW_OPS,
    Arg,
    Call,
    Lowering,
    Ptr,
    Step,
    _bcast,
    conv_params,
    lower_batchnorm,
    lower_softmax,
    numel,
    perm_params,
    pool_params,
    static_shape,
)

from qcc.ir.core import Node, Value
from qcc.ir.types import Affine
from qcc.sim import affine_int as ai

INT_TYPES = {dtype: CType(affine=Affine((1.0,), (0,), dtype)) for dtype in ("int8", "int16", "int32")}


def int_array(lw: Lowering, data: np.ndarray, base: str, comment: str, dtype: str | None = None) -> tuple[str, CType]:
    """Integers in the narrowest of int8/int16/int32 that holds them (or `dtype`)."""
    data = np.asarray(data, dtype=np.int64)
    if dtype is None:
        peak = int(np.abs(data).max(initial=0)) + 1
        dtype = "int8" if peak <= 128 else "int16" if peak <= 32768 else "int32"
    ctype = INT_TYPES[dtype]
    return lw.array(data, ctype, base, comment), ctype


def i32(lw: Lowering, data: np.ndarray, base: str, comment: str) -> str:
    return int_array(lw, data, base, comment, "int32")[0]


def zp(value: Value) -> str:
    return str(ai.act(value)[1])


def _req(x: Value, y: Value) -> list[str]:
    m, s = ai.pass_params(x, y)
    return [zp(x), str(m), str(s), zp(y)]


# ---------------------------------------------------------------- per-op lowerings


def _layer_arrays(lw: Lowering, node: Node, transpose: bool = False) -> tuple[CType, str, str, str, str]:
    """A Conv/Dense's weight element type and its arrays: weights (Dense's transposed to (out, in)),
    bias, multipliers, shifts."""
    li = ai.layer_ints(node)
    weights = li.weights.T if transpose else li.weights
    w, wt = int_array(lw, weights, f"qcc_w_{node.name}",
                      f"{node.input(1).name} minus its zero point" + (", transposed (out, in)" if transpose else ""))
    return (wt, w, i32(lw, li.bias, f"qcc_b_{node.name}", f"bias of {node.name} on the accumulator scale"),
            i32(lw, li.mult, f"qcc_m_{node.name}", f"requantization multipliers of {node.name}"),
            i32(lw, li.shift, f"qcc_s_{node.name}", f"requantization shifts of {node.name}"))


def _conv(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    wt, w, bias, mult, shift = _layer_arrays(lw, node)
    fn = KC.conv_affine(lw.kernels, lw.ctype(x), wt, lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), w, bias, Ptr(y), conv_params(lw, node), zp(x), mult, shift, zp(y)))])


def _dense(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    n, k = static_shape(x)
    wt, w, bias, mult, shift = _layer_arrays(lw, node, transpose=True)
    fn = KC.dense_affine(lw.kernels, lw.ctype(x), wt, lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), w, bias, Ptr(y), str(n), str(k), str(static_shape(y)[1]), zp(x), mult,
                                 shift, zp(y)))])


def _pool(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    params, window = pool_params(lw, node)
    if node.op in ("MaxPool", "GlobalMaxPool"):
        fn = KP.maxpool(lw.kernels, lw.ctype(x), lw.ctype(y))
        return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, *_req(x, y)))])
    m, s = ai.count_params(node, window)
    mult = i32(lw, m, f"qcc_m_{node.name}", f"requantization multiplier of {node.name} per element count")
    shift = i32(lw, s, f"qcc_s_{node.name}", f"requantization shift of {node.name} per element count")
    fn = KP.avgpool_affine(lw.kernels, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, zp(x), mult, shift, zp(y)))])


def _table(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    table = lw.array(ai.unary_table(node), lw.ctype(y), f"qcc_t_{node.name}", f"{node.op} table of {node.name}")
    step = Step(node, [Call(KE.table(lw.kernels, lw.ctype(x), lw.ctype(y)), (Ptr(x), Ptr(y), str(numel(y)), table))])
    step.inplace = (0,)
    return step


def _view(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    if x.quant == y.quant:
        return Step(node, alias=True)
    fn = KM.requant(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (lw.operand(x, node), Ptr(y), str(numel(y)), *_req(x, y)))])
    step.inplace = (0,) if x.const is None else ()
    return step


def _transpose(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    fn = KM.transpose(lw.kernels, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (lw.operand(x, node), Ptr(y), perm_params(lw, node), *_req(x, y)))])


def _concat(lw: Lowering, node: Node) -> Step:
    y = node.outputs[0]
    shape = static_shape(y)
    axis = node.attrs["axis"] % len(shape)
    outer, total = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    calls, offset = [], 0
    for value in node.inputs:
        assert value is not None
        inner = int(np.prod(static_shape(value)[axis:]))
        fn = KM.concat_part(lw.kernels, lw.ctype(value), lw.ctype(y))
        calls.append(Call(fn, (lw.operand(value, node), Ptr(y), str(outer), str(inner), str(total), str(offset),
                               *_req(value, y))))
        offset += inner
    return Step(node, calls)


def _binary(lw: Lowering, node: Node) -> Step:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    out = static_shape(y)
    sa, sy = ai.act(a)[0], ai.act(y)[0]
    sb = ai.act(b)[0]
    if node.op in ("Add", "Sub"):
        (ma, mb), s = ai.common_params([sa / sy, sb / sy])
        extra = [zp(a), zp(b), str(ma), str(mb), str(s), zp(y)]
    elif node.op == "Mul":
        m, s = ai.requant_params(sa * sb / sy)
        extra = [zp(a), zp(b), str(m), str(s), zp(y)]
    else:
        (ma, s_a), (mb, s_b) = ai.pass_params(a, y), ai.pass_params(b, y)
        extra = [zp(a), str(ma), str(s_a), zp(b), str(mb), str(s_b), zp(y)]
    args: list[Arg] = [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(numel(y)),
                       _bcast(lw, node, static_shape(a), static_shape(b), out), *extra]
    step = Step(node, [Call(KE.binary_affine(lw.kernels, node.op, lw.ctype(a), lw.ctype(b), lw.ctype(y)), tuple(args))])
    step.inplace = tuple(i for i, v in enumerate((a, b)) if v.const is None and static_shape(v) == out)
    return step


AFFINE_LOWERINGS: dict[str, Callable[[Lowering, Node], Step]] = {
    "Conv": _conv, "Dense": _dense, "MaxPool": _pool, "AvgPool": _pool, "GlobalAvgPool": _pool,
    "GlobalMaxPool": _pool, "Concat": _concat, "Transpose": _transpose, "Softmax": lower_softmax,
    "BatchNorm": lower_batchnorm, **{op: _binary for op in KE.AFFINE_BINARY}, **{op: _view for op in VIEW_OPS},
}


def lowering_for(op: str) -> Callable[[Lowering, Node], Step] | None:
    """The affine lowering of `op`: one-input elementwise ops (any schema) become lookup tables."""
    if op in AFFINE_LOWERINGS:
        return AFFINE_LOWERINGS[op]
    return _table if ai.is_table_op(op) else None
