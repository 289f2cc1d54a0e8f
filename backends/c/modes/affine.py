"""Affine int8/uint8 mode: every activation per-tensor affine; exactly the arithmetic of
`qcc.sim.affine_int`, so outputs are bit-identical to `run_affine_int`.

Every constant the kernels use (centered weights, accumulator biases, multipliers and shifts,
lookup tables) is computed by `qcc.sim.affine_int`; this module only places them in C arrays and
chooses kernels. Any one-input elementwise op of the registry is a lookup table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import qcc.backends.c.modes.shared as shared
from qcc.backends.c.ctype import FLOAT, CType, hexfloat
from qcc.backends.c.kernels import add32 as K32
from qcc.backends.c.kernels import conv as KC
from qcc.backends.c.kernels import conv_dot8 as KD
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import matmul as KMm
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.kernels import pool as KP
from qcc.backends.c.kernels import reduce as KRd
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
    where,
)
from qcc.backends.c.modes.float32 import LAYERS
from qcc.backends.c.params import bcast_params, conv_params, conv_transpose_params, pool_params

from qcc.errors import UnsupportedError
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


def requant_args(x: Value, y: Value) -> list[str]:
    """zx, m, s, zy: moving a stored value from x's scale and zero point to y's."""
    m, s = ai.pass_params(x, y)
    return [zp(x), str(m), str(s), zp(y)]


def _layer_arrays(lw: Lowering, node: Node, weights: np.ndarray) -> tuple[CType, str, str, str, str]:
    """A Conv/Dense's weight element type and its arrays: the (centered, laid out) weights, the bias on
    the accumulator scale, multipliers, shifts."""
    li = ai.layer_ints(node)
    w, wt = int_array(lw, weights, f"qcc_w_{node.name}", f"{node.input(1).name} minus its zero point, laid out "
                      "for the kernel")
    return (wt, w, i32(lw, li.bias, f"qcc_b_{node.name}", f"bias of {node.name} on the accumulator scale"),
            i32(lw, li.mult, f"qcc_m_{node.name}", f"requantization multipliers of {node.name}"),
            i32(lw, li.shift, f"qcc_s_{node.name}", f"requantization shifts of {node.name}"))


def _epilogue(lw: Lowering, node: Node) -> tuple[KC.Epilogue, list[Arg], CType]:
    """Requantization to the output, then the lookup table of a one-input op that alone reads it;
    also the element type the kernel stores."""
    y = node.outputs[0]
    cy = lw.ctype(y)
    ep, args = KC.affine_epilogue(cy), [zp(y)]
    nxt = lw.consumer(y)
    if nxt is not None and ai.is_table_op(nxt.op):
        out = lw.ctype(nxt.outputs[0])
        table = ai.unary_table(nxt)
        bounds = KE.table_clamp(table, cy, out)
        if bounds is not None:
            ep = KC.with_clamp(ep)
            args += [str(b) for b in bounds]
        else:
            ep = KC.with_table(ep, cy, out)
            args.append(lw.array(table, out, f"qcc_t_{nxt.name}", f"{nxt.op} table of {nxt.name}"))
        lw.fuse(nxt)
        return ep, args, out
    return ep, args, cy


TILED_TAPS = 96
"""Layers with fewer taps per output (input channels x kernel size) run on the tiled kernel
(exact float lanes, no horizontal sums); longer sums on the dot products."""


def _conv(lw: Lowering, node: Node) -> Step:
    """Depthwise along rows; few taps: the tiled kernel (sums exact in float32, always with 8-bit
    operands and fewer than TILED_TAPS taps); else dot products."""
    x, y = node.input(0), node.outputs[0]
    li = ai.layer_ints(node)
    group = node.attrs["group"]
    ep, extra, out = _epilogue(lw, node)
    cx, params = lw.ctype(x), conv_params(lw, node)
    if KC.is_depthwise(li.weights.shape, group):
        wt, w, bias, mult, shift = _layer_arrays(lw, node, li.weights)
        fn = KC.depthwise(lw.kernels, cx, wt, out, KD.narrow_requant(ep), "affine")
    elif lw.dot8 and KD.uses_dot8_tiles(li.weights.shape, int(np.prod(static_shape(y)[2:]))) \
            and KC.u8_dot_fits(li.weights, cx.lo, cx.hi):
        fn, w, bias, mult, shift = _dot8_layer(lw, node, li.weights, group, ep, out)
    elif int(np.prod(li.weights.shape[1:])) < TILED_TAPS and KC.float_sums_exact(li.weights, cx):
        w = lw.array(KC.pack_conv_weights(li.weights, group), FLOAT, f"qcc_w_{node.name}",
                     f"{node.input(1).name} minus its zero point, blocks of {KC.WB} output channels by tap")
        bias = i32(lw, li.bias, f"qcc_b_{node.name}", f"bias of {node.name} on the accumulator scale")
        mult = i32(lw, li.mult, f"qcc_m_{node.name}", f"requantization multipliers of {node.name}")
        shift = i32(lw, li.shift, f"qcc_s_{node.name}", f"requantization shifts of {node.name}")
        fn = KC.conv_affine_exact_float(lw.kernels, cx, out, ep)
    else:
        fn, w, bias, mult, shift = _dot_layer(lw, node, li.weights, group, ep, out)
    return Step(node, [Call(fn, (Ptr(x), w, Ptr(y), params, zp(x), bias, mult, shift, *extra))])


def _dot8_layer(lw: Lowering, node: Node, weights: np.ndarray, group: int, ep: KC.Epilogue,
                out: CType) -> tuple[str, str, str, str, str]:
    """isa=dot8's convolution (kernels/conv_dot8.py): uint8 x int8 products, four taps a 32-bit lane,
    16 output channels x 16 positions a tile, any number of taps (no exact-float tile needed)."""
    x = node.input(0)
    cx = lw.ctype(x)
    li = ai.layer_ints(node)
    w = lw.array(KD.pack_dot8_weights(weights, group), INT_TYPES["int8"], f"qcc_w_{node.name}",
                 f"{node.input(1).name} minus its zero point, blocks of 16 output channels by 4 taps")
    bias = i32(lw, KC.offset_bias(weights, li.bias, ai.act(x)[1], cx.lo), f"qcc_b_{node.name}",
               f"bias of {node.name} on the accumulator scale, less the input offset (zx - {cx.lo}) x weight sums")
    return (KD.conv_affine_dot8(lw.kernels, cx, out, ep), w, bias,
            i32(lw, li.mult, f"qcc_m_{node.name}", f"requantization multipliers of {node.name}"),
            i32(lw, li.shift, f"qcc_s_{node.name}", f"requantization shifts of {node.name}"))


def _dot_layer(lw: Lowering, node: Node, weights: np.ndarray, group: int, ep: KC.Epilogue,
               out: CType) -> tuple[str, str, str, str, str]:
    """The dot-product kernel and its arrays: with isa=dot8, uint8 x int8 products (offset inputs, the
    offset folded into the bias) when the centered weights are int8; else int16 products of centered
    inputs (what pmaddwd / SMLAD take without widening the weights' partner again per product)."""
    x = node.input(0)
    cx = lw.ctype(x)
    if not (lw.dot8 and KC.u8_dot_fits(weights, cx.lo, cx.hi)):
        wt, w, bias, mult, shift = _layer_arrays(lw, node, KC.pack_affine_weights(weights, group))
        return KC.conv_affine(lw.kernels, cx, wt, out, ep), w, bias, mult, shift
    li = ai.layer_ints(node)
    w = lw.array(KC.pack_affine_weights(weights, group, columns=True), INT_TYPES["int8"], f"qcc_w_{node.name}",
                 f"{node.input(1).name} minus its zero point, laid out for the kernel")
    bias = i32(lw, KC.offset_bias(weights, li.bias, ai.act(x)[1], cx.lo), f"qcc_b_{node.name}",
               f"bias of {node.name} on the accumulator scale, less the input offset (zx - {cx.lo}) x weight sums")
    return (KC.conv_affine(lw.kernels, cx, INT_TYPES["int8"], out, ep, "uint8_t"), w, bias,
            i32(lw, li.mult, f"qcc_m_{node.name}", f"requantization multipliers of {node.name}"),
            i32(lw, li.shift, f"qcc_s_{node.name}", f"requantization shifts of {node.name}"))


def _conv_transpose(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    wt, w, bias, mult, shift = _layer_arrays(lw, node, ai.layer_ints(node).weights)
    fn = KC.conv_transpose_affine(lw.kernels, lw.ctype(x), wt, lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), w, bias, Ptr(y), conv_transpose_params(lw, node), zp(x), mult, shift,
                                 zp(y)))])


def _dense(lw: Lowering, node: Node) -> Step:
    """A 1x1 convolution of an (n, k, 1, 1) input: the convolution's dot-product kernel."""
    x, y = node.input(0), node.outputs[0]
    n, k = static_shape(x)
    m = static_shape(y)[1]
    weights = ai.layer_ints(node).weights.T.reshape(m, k, 1, 1)
    ep, extra, out = _epilogue(lw, node)
    fn, w, bias, mult, shift = _dot_layer(lw, node, weights, 1, ep, out)
    geometry = lw.struct("qcc_conv_t", f"qcc_p_{node.name}", [n, k, 1, 1, m, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1])
    return Step(node, [Call(fn, (Ptr(x), w, Ptr(y), geometry, zp(x), bias, mult, shift, *extra))])


def _pool(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    params, window = pool_params(lw, node)
    if node.op in ("MaxPool", "GlobalMaxPool"):
        moved = requant_args(x, y)
        zx, mult, shift, zy = moved
        if lw.ctype(x) == lw.ctype(y) and zx == zy and int(mult) == 1 << int(shift):  # y stores x's values as they are
            fn = KP.maxpool(lw.kernels, lw.ctype(x), lw.ctype(y), same=True)
            return Step(node, [Call(fn, (Ptr(x), Ptr(y), params))])
        fn = KP.maxpool(lw.kernels, lw.ctype(x), lw.ctype(y))
        return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, *moved))])
    m, s = ai.count_params(node, window)
    mult = i32(lw, m, f"qcc_m_{node.name}", f"requantization multiplier of {node.name} per element count")
    shift = i32(lw, s, f"qcc_s_{node.name}", f"requantization shift of {node.name} per element count")
    fn = KP.avgpool_affine(lw.kernels, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, zp(x), mult, shift, zp(y)))])


def _table(lw: Lowering, node: Node) -> Step:
    return _table_step(lw, node, ai.unary_table(node))


def _table_step(lw: Lowering, node: Node, data: np.ndarray) -> Step:
    x, y = node.input(0), node.outputs[0]
    bounds = KE.table_clamp(data, lw.ctype(x), lw.ctype(y))
    if bounds is not None:  # a clamp of the stored value: vectorized max/min instead of a lookup
        step = Step(node, [Call(KE.clamp(lw.kernels, lw.ctype(x)), (Ptr(x), Ptr(y), str(numel(y)),
                                                                    *(str(b) for b in bounds)))])
        step.inplace = (0,)
        return step
    table = lw.array(data, lw.ctype(y), f"qcc_t_{node.name}", f"{node.op} table of {node.name}")
    step = Step(node, [Call(KE.table(lw.kernels, lw.ctype(x), lw.ctype(y)), (Ptr(x), Ptr(y), str(numel(y)), table))])
    step.inplace = (0,)
    return step


def _scalar_table(lw: Lowering, node: Node) -> Step:
    """Div/Pow/Sub by a constant scalar: a lookup table of input 0 (ai.scalar_operand_table)."""
    try:
        data = ai.scalar_operand_table(node)
    except UnsupportedError:
        raise lw.unsupported(node, "only with a constant scalar second input") from None
    return _table_step(lw, node, data)


def _binary(lw: Lowering, node: Node) -> Step:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    out = static_shape(y)
    sa, sy = ai.act(a)[0], ai.act(y)[0]
    sb = ai.act(b)[0]
    if node.op in ("Add", "Sub"):
        (ma, mb), s = ai.common_params([sa / sy, sb / sy])
        exact32 = K32.add32_params(node.op, lw.ctype(a), lw.ctype(b), ai.act(a)[1], ai.act(b)[1], ma, mb, s,
                                   ai.act(y)[1])
        if exact32 is not None:
            return _add32(lw, node, exact32)
        extra = [zp(a), zp(b), str(ma), str(mb), str(s), zp(y)]
    elif node.op == "Mul":
        m, s = ai.requant_params(sa * sb / sy)
        extra = [zp(a), zp(b), str(m), str(s), zp(y)]
    else:
        (ma, s_a), (mb, s_b) = ai.pass_params(a, y), ai.pass_params(b, y)
        extra = [zp(a), str(ma), str(s_a), zp(b), str(mb), str(s_b), zp(y)]
    args: list[Arg] = [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(numel(y)), bcast_params(lw, node),
                       *extra]
    fn = KE.binary_affine(lw.kernels, node.op, lw.ctype(a), lw.ctype(b), lw.ctype(y))
    step = Step(node, [Call(fn, tuple(args))])
    step.inplace = tuple(i for i, v in enumerate((a, b)) if v.const is None and static_shape(v) == out)
    return step


def _add32(lw: Lowering, node: Node, exact32: K32.Add32) -> Step:
    """Add/Sub in 32-bit arithmetic (kernels/add32.py: exact where it is chosen), saturating to the
    output type's range, or to a clamp's when a clamp-table op (an affine Relu) alone reads the sum."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    cy = lw.ctype(y)
    bounds: tuple[int, int] = (cy.lo, cy.hi)
    nxt = lw.consumer(y)
    if nxt is not None and ai.is_table_op(nxt.op):
        clamp = KE.table_clamp(ai.unary_table(nxt), cy, lw.ctype(nxt.outputs[0]))
        if clamp is not None:
            bounds = clamp
            lw.fuse(nxt)
    args: list[Arg] = [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(numel(y)), bcast_params(lw, node),
                       *exact32.args(), *(str(v) for v in bounds)]
    fn = K32.add32_kernel(lw.kernels, node.op, lw.ctype(a), lw.ctype(b), cy)
    step = Step(node, [Call(fn, tuple(args))])
    step.inplace = tuple(i for i, v in enumerate((a, b)) if v.const is None and static_shape(v) == static_shape(y))
    return step


def _prelu(lw: Lowering, node: Node) -> Step:
    """x >= zx: requantize by sx / sy; x < zx: by the signed slope multiplier of its element."""
    x, y = node.input(0), node.outputs[0]
    m_pos, s_pos, m_neg, s_neg = ai.prelu_params(node)
    mn = i32(lw, m_neg, f"qcc_mn_{node.name}", f"negative-side multipliers of {node.name} (slope * sx / sy)")
    sn = i32(lw, s_neg, f"qcc_sn_{node.name}", f"negative-side shifts of {node.name}")
    fn = KE.prelu_affine(lw.kernels, lw.ctype(x), lw.ctype(y))
    args = (Ptr(x), Ptr(y), str(numel(y)), bcast_params(lw, node, always=True), mn, sn, zp(x), str(m_pos), str(s_pos),
            zp(y))
    step = Step(node, [Call(fn, args)])
    step.inplace = (0,)
    return step


def _matmul(lw: Lowering, node: Node) -> Step:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    m, s = ai.matmul_params(node)
    fn = KMm.matmul_affine(lw.kernels, lw.ctype(a), lw.ctype(b), lw.ctype(y))
    return Step(node, [Call(fn, (*shared.matmul_args(lw, node), zp(a), zp(b), str(m), str(s), zp(y)))])


def _reduce(lw: Lowering, node: Node) -> Step:
    """Sum/Mean: the centered sum requantized by sx / sy (/ count); Max: the largest stored value."""
    x, y = node.input(0), node.outputs[0]
    geometry = shared.reduce_geometry(lw, node)
    ratio = ai.act(x)[0] / ai.act(y)[0] / (int(geometry[1]) if node.op == "ReduceMean" else 1)
    m, s = ai.requant_params(ratio)
    fn = KRd.reduce_affine(lw.kernels, node.op, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), *geometry, zp(x), str(m), str(s), zp(y)))])


FLOAT_ISLANDS = frozenset({"Softmax", "BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "ReduceL2", "Resize"})
"""Ops computed in float32 between dequantization and quantization (Resize: the linear mode)."""


class AffineMode(NumericMode):
    name = "affine"
    title = "affine int8/uint8 with integer requantization (bit-identical to qcc.sim.affine_int.run_affine_int)"
    integer = True
    lowerings: ClassVar[dict[str, LowerFn]] = {
        "Conv": _conv, "ConvTranspose": _conv_transpose, "Dense": _dense, "MaxPool": _pool, "AvgPool": _pool, "GlobalAvgPool": _pool,
        "GlobalMaxPool": _pool, "Concat": shared.concat, "Transpose": shared.transpose, "Softmax": shared.softmax,
        "BatchNorm": shared.batchnorm, **{op: _scalar_table for op in ai.SCALAR_OPERAND_OPS},
        **{op: _binary for op in KE.AFFINE_BINARY},
        **LAYERS, "Pad": shared.pad, "PRelu": _prelu, "MatMul": _matmul, "ReduceSum": _reduce, "ReduceMean": _reduce,
        "ReduceMax": _reduce,
    }

    def float_ops(self) -> frozenset[str]:
        return FLOAT_ISLANDS  # dequantize, compute in float32, requantize

    def computes_in_float(self, node: Node) -> bool:
        return node.op in FLOAT_ISLANDS and not (node.op == "Resize" and node.attrs["mode"] == "nearest")

    def lowered_ops(self) -> frozenset[str]:
        """Div and Pow lower only by a constant scalar (a table): the support matrix, which speaks
        of an op on any operands, does not list them."""
        return super().lowered_ops() - ai.SCALAR_OPERAND_OPS

    def claims(self, acts: Sequence[Value]) -> bool:
        return any(isinstance(v.quant, Affine) for v in acts)

    def check(self, acts: Sequence[Value]) -> None:
        for value in acts:
            if not isinstance(value.quant, Affine):
                raise UnsupportedError(
                    f"target c: tensor {value.name!r}{where(value)} is {value.quant or 'float'} while other "
                    "activations are affine; target c needs every activation affine int8/uint8 (or none)")
            try:
                ai.act(value)
            except UnsupportedError as exc:
                raise UnsupportedError(f"target c: {exc}{where(value)}") from None

    def ctype(self, value: Value) -> CType:
        return CType(affine=ai.affine_of(value))

    def param(self, lw: Lowering, value: Value, node: Node) -> tuple[CType, np.ndarray, str]:
        quant = ai.affine_of(value)
        if quant is None or quant.axis is not None or quant.dtype not in ai.ACT_DTYPES:
            raise lw.unsupported(node, f"parameter {value.name!r} is {quant or 'float'}, not per-tensor int8/uint8")
        return CType(affine=quant), ai.store_param(value), f"{value.name}: {quant}"

    def scales(self, x: Value, y: Value) -> list[str]:
        """sx, zx (the getter's), sy, zy (the setter's)."""
        (sx, zx, _), (sy, zy, _) = ai.act(x), ai.act(y)
        return [hexfloat(sx), str(zx), hexfloat(sy), str(zy)]

    def copy_args(self, lw: Lowering, node: Node, x: Value, y: Value) -> list[str]:
        return requant_args(x, y)

    def transfer(self, ks: KernelSet, value: Value, inbound: bool) -> tuple[str, list[str]] | None:
        ct = self.ctype(value)
        assert ct.affine is not None
        fn = (KM.quantize_input_affine if inbound else KM.dequantize_affine)(ks, ct)
        return fn, [hexfloat(ct.affine.scale[0]), str(ct.affine.zero_point[0])]

    def tensor_macros(self, key: str, value: Value) -> list[str]:
        quant = value.quant
        lines = [f'#define {key}_TYPE "{quant}"']
        if isinstance(quant, Affine):
            lines += [f"#define {key}_SCALE {hexfloat(quant.scale[0])}", f"#define {key}_ZERO_POINT {quant.zero_point[0]}"]
        return lines

    def view(self, lw: Lowering, node: Node) -> Step:
        return shared.view(lw, node)

    def derived_lowering(self, op: str) -> LowerFn | None:
        """One-input elementwise ops (any schema) become lookup tables."""
        return _table if ai.is_table_op(op) else None


AFFINE_MODE = AffineMode()
