"""Bit-exact integer execution of affine int8/uint8 models: the arithmetic of target c's affine mode.

`qcc.ir.fakequant` simulates an affine model the way ONNX Runtime's QDQ graph reads: float
arithmetic between quantize/dequantize round trips. An integer-only target cannot do that, so
this module fixes integer semantics (docs/backends.md, "c", affine mode), and target c generates
exactly this arithmetic; `run_affine_int` is the oracle its tests compare bit for bit.

- Storage: int8/uint8 q with real value (q - zp) * scale. Graph inputs are quantized with
  q = sat(round_half_even(x / scale) + zp) in float32 (NaN stores zp); outputs read back as
  (float)(q - zp) * scale.
- Requantization by a real multiplier M > 0: an integer m and a shift s with M ~ m * 2**-s and
  m in [2**30, 2**31) (s <= 62; `requant_params`); y = sat(zp_y + rshift(v * m, s)), where
  rshift rounds half away from zero. Ops with several inputs share one shift (`common_params`).
- Conv/Dense: int32 accumulator sum((qx - zx) * (qw - zw)) + bias, with the bias requantized to
  the accumulator scale sx * sw[c]; `layer_ints` refuses models whose sums could overflow
  int32. Per-channel multipliers M[c] = sx * sw[c] / sy.
- MaxPool: max of stored values (requantization is monotone) then requant; AvgPool: the sum of
  (q - zx) over the window, requantized by sx / (sy * count), one multiplier per count.
- Add/Sub: rshift((qa - za) * ma +- (qb - zb) * mb, s); Mul: rshift((qa - za) * (qb - zb) * m, s);
  Max/Min: each input requantized to the output, then compared.
- Views, Transpose, Concat, Quantize: requantization (a copy when the annotations are equal).
- Any elementwise op with one input (Relu, Clip, Sigmoid, Tanh, LeakyRelu, HardSwish, ...): a
  256-entry table built from the reference float32 kernel (`unary_table`): exact by construction.
- PRelu: x >= 0 requantized by sx / sy, x < 0 by slope * sx / sy (a signed multiplier per slope
  element; the slope itself stays float). MatMul (activation x activation, or a constant operand
  quantized per tensor): int32 sums of (qa - za) * (qb - zb), requantized by sa * sb / sy.
- ReduceSum/ReduceMean: the sum of (q - zx), requantized by sx / sy (/ count); ReduceMax: the
  largest stored value, requantized. ArgMax/TopK compare stored values (ties: the lower index).
- Gather, DepthToSpace, SpaceToDepth, nearest Resize, Slice and Split move stored values (requantized).
- Softmax, BatchNorm, LayerNorm, GroupNorm, InstanceNorm, linear Resize and ReduceL2: dequantize
  to float32, compute in a fixed float32 operation order (`qcc.sim.f32`; exp is the double result
  rounded once), quantize like a graph input: float islands between int8 tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

import qcc.sim.f32 as f32
from qcc.errors import UnsupportedError
from qcc.ir.core import Model, Node, Value
from qcc.ir.ops.nn import conv2d, pool_windows
from qcc.ir.registry import get_schema, op_has
from qcc.ir.types import Affine
from qcc.quant.numerics import AFFINE_DTYPES, quantize_affine
from qcc.sim.engine import NodeKernel, Runner
from qcc.sim.fixed import batchnorm_params, exp_f32, param_values, quantize_param

F32 = np.float32
ACT_DTYPES = ("int8", "uint8")
WEIGHT_DTYPES = (*ACT_DTYPES, "int4", "uint4")
"""4-bit weights (W4A8) compute like 8-bit ones: their integers fit the same kernels."""
ACC_LIMIT = 2**31 - 1
MAX_SHIFT = 62
WEIGHT_AXIS = {"Conv": 0, "Dense": 1}


# ---------------------------------------------------------------- annotations


def affine_of(value: Value | None) -> Affine | None:
    quant = value.quant if value is not None else None
    return quant if isinstance(quant, Affine) else None


def act(value: Value) -> tuple[float, int, str]:
    """(scale, zero point, dtype) of a per-tensor 8-bit activation."""
    quant = affine_of(value)
    if quant is None or quant.axis is not None or quant.dtype not in ACT_DTYPES:
        raise UnsupportedError(f"affine integer mode: tensor {value.name!r} is {quant or 'float'}; "
                               "activations must be per-tensor int8/uint8")
    return float(F32(quant.scale[0])), int(quant.zero_point[0]), quant.dtype


def bounds(value: Value) -> tuple[int, int]:
    return AFFINE_DTYPES[act(value)[2]]


def channel_params(value: Value, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale float64, zero point int64) of a weight, broadcast from per tensor."""
    quant = affine_of(value)
    assert quant is not None
    scale = np.asarray(quant.scale, dtype=F32).astype(np.float64)
    zp = np.asarray(quant.zero_point, dtype=np.int64)
    return np.broadcast_to(scale, (channels,)).copy(), np.broadcast_to(zp, (channels,)).copy()


# ---------------------------------------------------------------- integer arithmetic


def requant_params(multiplier: float) -> tuple[int, int]:
    """M -> (m, s) with M ~ m * 2**-s, m in [2**30, 2**31) when s allows (s <= 62)."""
    m, s = common_params([multiplier])
    return m[0], s


def common_params(multipliers: Sequence[float]) -> tuple[list[int], int]:
    """One shift for several multipliers: the largest gets 31 significant bits."""
    top = max(multipliers)
    if not math.isfinite(top) or top < 0:
        raise UnsupportedError(f"affine integer mode: requantization multiplier {top} is not finite and >= 0")
    if top == 0:
        return [0] * len(multipliers), 0
    s = min(31 - math.frexp(top)[1], MAX_SHIFT)
    if s < 0:
        raise UnsupportedError(f"affine integer mode: requantization multiplier {top:g} is >= 2**31")
    m = [int(np.rint(x * 2.0**s)) for x in multipliers]
    if max(m) >= 2**31:
        s -= 1
        m = [int(np.rint(x * 2.0**s)) for x in multipliers]
    return m, s


def rshift(v: np.ndarray, s: np.ndarray | int) -> np.ndarray:
    """v / 2**s rounded half away from zero (|v| < 2**62)."""
    v = np.asarray(v, dtype=np.int64)
    s = np.asarray(s, dtype=np.int64)
    half = np.where(s > 0, np.left_shift(1, np.maximum(s - 1, 0)), 0)
    mag = (np.abs(v) + half) >> s
    return np.where(v < 0, -mag, mag)


def saturate(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.clip(v, lo, hi)


def requantize(v: np.ndarray, m: np.ndarray | int, s: np.ndarray | int, out: Value) -> np.ndarray:
    """sat(zp_out + rshift(v * m, s)), v an integer on the scale m * 2**-s maps to the output's."""
    _, zp, _ = act(out)
    lo, hi = bounds(out)
    return saturate(zp + rshift(np.asarray(v, dtype=np.int64) * np.asarray(m, dtype=np.int64), s), lo, hi)


def quantize_input(x: np.ndarray, value: Value) -> np.ndarray:
    """sat(round_half_even(x / scale) + zp) in float32; NaN stores zp."""
    scale, zp, _ = act(value)
    lo, hi = bounds(value)
    t = np.asarray(x, dtype=F32) / F32(scale)
    t = np.where(np.isnan(t), F32(0), t)
    return np.rint(np.clip(t, lo - zp, hi - zp)).astype(np.int64) + zp


def dequantize(q: np.ndarray, value: Value) -> np.ndarray:
    scale, zp, _ = act(value)
    return (np.asarray(q, dtype=np.int64) - zp).astype(F32) * F32(scale)


def centered(value: Value, q: np.ndarray) -> np.ndarray:
    return np.asarray(q, dtype=np.int64) - act(value)[1]


def is_index(value: Value | None) -> bool:
    """An integer tensor of element indices (ArgMax, TopK): stored as is, never quantized."""
    return value is not None and value.type.dtype in ("int64", "int32")


# ---------------------------------------------------------------- parameters


def store_param(value: Value) -> np.ndarray:
    """Affine constants as their stored integers (int64); others as float32."""
    assert value.const is not None
    quant = affine_of(value)
    if quant is None:
        return np.asarray(value.const, dtype=F32)
    if quant.axis is None:
        return quantize_affine(value.const, quant.scale[0], quant.zero_point[0], quant.dtype).astype(np.int64)
    return quantize_affine(value.const, np.asarray(quant.scale), np.asarray(quant.zero_point), quant.dtype,
                           axis=quant.axis).astype(np.int64)


def weight_ints(node: Node) -> np.ndarray:
    """qw - zw of a Conv/Dense weight (Conv OIHW, Dense (K, M))."""
    w = node.input(1)
    axis = WEIGHT_AXIS[node.op]
    quant = affine_of(w)
    if w.const is None or quant is None or quant.dtype not in WEIGHT_DTYPES:
        what = quant.dtype if quant is not None else "float"
        raise UnsupportedError(f"affine integer mode: node {node.name!r} ({node.op}) needs a constant "
                               f"{'/'.join(WEIGHT_DTYPES)} weight, not {w.name!r} ({what})")
    if quant.axis not in (None, axis):
        raise UnsupportedError(f"affine integer mode: weight {w.name!r} is quantized along axis {quant.axis}, "
                               f"not the output-channel axis {axis}")
    stored = store_param(w)
    _, zw = channel_params(w, stored.shape[axis])
    shape = [1] * stored.ndim
    shape[axis] = -1
    return stored - zw.reshape(shape)


def accumulator_scales(node: Node) -> np.ndarray:
    """sx * sw[c] per output channel, in float64."""
    w = node.input(1)
    sw, _ = channel_params(w, int(node.outputs[0].type.shape[1]))
    return act(node.input(0))[0] * sw


def bias_ints(node: Node) -> np.ndarray:
    """The bias on the accumulator scale (int64, one per output channel; zeros without a bias)."""
    channels = int(node.outputs[0].type.shape[1])
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if b is None:
        return np.zeros(channels, dtype=np.int64)
    if b.const is None:
        raise UnsupportedError(f"affine integer mode: node {node.name!r} ({node.op}): bias {b.name!r} is not "
                               "a constant")
    quant = affine_of(b)
    if quant is None:
        real = np.asarray(b.const, dtype=np.float64)
    else:
        sb, zb = channel_params(b, channels)
        real = (store_param(b).astype(np.float64) - zb) * sb
    acc = np.rint(real / accumulator_scales(node))
    if np.any(np.abs(acc) > ACC_LIMIT):
        raise UnsupportedError(f"affine integer mode: bias {b.name!r} of node {node.name!r} overflows int32 "
                               "on the accumulator scale")
    return acc.astype(np.int64)


def _check_accumulator(node: Node, weights: np.ndarray, bias: np.ndarray) -> None:
    """Refuse a Conv/Dense whose int32 accumulator could overflow (target c sums in int32)."""
    x_lo, x_hi = bounds(node.input(0))
    zx = act(node.input(0))[1]
    span = max(abs(x_lo - zx), abs(x_hi - zx))
    axis = WEIGHT_AXIS[node.op]
    per_out = np.abs(weights).sum(axis=tuple(i for i in range(weights.ndim) if i != axis))
    worst = int(per_out.max(initial=0)) * span + int(np.abs(bias).max(initial=0))
    if worst > ACC_LIMIT:
        raise UnsupportedError(f"affine integer mode: node {node.name!r} ({node.op}) could overflow its int32 "
                               f"accumulator (worst case {worst})")


@attrs.frozen
class LayerInts:
    """What a Conv/Dense computes with: centered weights, accumulator bias, per-channel (m, s)."""

    weights: np.ndarray
    bias: np.ndarray
    mult: np.ndarray
    shift: np.ndarray


def layer_ints(node: Node) -> LayerInts:
    """The integers of a Conv/Dense, computed once; refuses sums that could overflow int32."""
    weights, bias = weight_ints(node), bias_ints(node)
    _check_accumulator(node, weights, bias)
    sy = act(node.outputs[0])[0]
    pairs = [requant_params(float(x)) for x in accumulator_scales(node) / sy]
    return LayerInts(weights, bias, np.array([p[0] for p in pairs], dtype=np.int64),
                     np.array([p[1] for p in pairs], dtype=np.int64))


def prelu_params(node: Node) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(m, s) for x >= 0 and signed multipliers/shifts per slope element for x < 0."""
    x, slope, y = node.input(0), node.input(1), node.outputs[0]
    if slope.const is None:
        raise UnsupportedError(f"affine integer mode: node {node.name!r} (PRelu) needs a constant slope")
    m_pos, s_pos = pass_params(x, y)
    ratio = act(x)[0] / act(y)[0]
    pairs = [requant_params(abs(float(a)) * ratio) for a in param_values(slope).reshape(-1)]
    signs = np.where(param_values(slope).reshape(-1) < 0, -1, 1)
    return (m_pos, s_pos, np.array([p[0] for p in pairs], dtype=np.int64) * signs,
            np.array([p[1] for p in pairs], dtype=np.int64))


def matmul_params(node: Node) -> tuple[int, int]:
    """(m, s) requantizing a MatMul's sums by sa * sb / sy; refuses sums that could overflow int32."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    spans = []
    for value in (a, b):
        quant = affine_of(value)
        if quant is None or quant.axis is not None or quant.dtype not in ACT_DTYPES:
            raise UnsupportedError(f"affine integer mode: node {node.name!r} (MatMul) needs per-tensor int8/uint8 "
                                   f"operands, not {value.name!r} ({quant or 'float'})")
        lo, hi = AFFINE_DTYPES[quant.dtype]
        spans.append(max(abs(lo - int(quant.zero_point[0])), abs(hi - int(quant.zero_point[0]))))
    depth = int(a.type.shape[-1])
    if depth * spans[0] * spans[1] > ACC_LIMIT:
        raise UnsupportedError(f"affine integer mode: node {node.name!r} (MatMul) could overflow its int32 "
                               f"accumulator ({depth} products)")
    return requant_params(float(F32(affine_of(a).scale[0])) * float(F32(affine_of(b).scale[0]))  # type: ignore[union-attr]
                          / act(y)[0])


def pass_params(x: Value, y: Value) -> tuple[int, int]:
    """(m, s) moving a centered value from x's scale to y's."""
    return requant_params(act(x)[0] / act(y)[0])


def unary_table(node: Node) -> np.ndarray:
    """y's stored value for every stored x (index q - lo): the reference kernel in float32."""
    x, y = node.input(0), node.outputs[0]
    lo, hi = bounds(x)
    q = np.arange(lo, hi + 1, dtype=np.int64)
    real = get_schema(node.op).kernel(node, [dequantize(q, x)])[0]
    return quantize_input(np.asarray(real, dtype=F32), y)


def pool_counts(node: Node, x_shape: tuple[int, ...]) -> np.ndarray:
    """Elements averaged per output position (padding counted when count_include_pad)."""
    ones = np.ones((1, 1, *x_shape[2:]))
    pad = 1.0 if node.attrs["count_include_pad"] else 0.0
    out = node.outputs[0].type.shape
    return np.nansum(pool_windows(ones, node.attrs, pad, (int(out[2]), int(out[3]))), axis=(4, 5)).astype(np.int64)


def count_params(node: Node, max_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(m, s) for every count 0..max_count of an average: sx / (sy * count)."""
    ratio = act(node.input(0))[0] / act(node.outputs[0])[0]
    pairs = [(0, 0)] + [requant_params(ratio / c) for c in range(1, max_count + 1)]
    return np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64)


# ---------------------------------------------------------------- kernels


def conv_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    li = layer_ints(node)
    x = centered(node.input(0), args[0]).astype(np.float64)
    acc = conv2d(x, li.weights.astype(np.float64), None, node.attrs, accumulate=np.float64)
    acc = np.rint(acc).astype(np.int64) + li.bias.reshape(1, -1, 1, 1)  # exact: |sum| < 2**31
    return [requantize(acc, li.mult.reshape(1, -1, 1, 1), li.shift.reshape(1, -1, 1, 1), node.outputs[0])]


def dense_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    li = layer_ints(node)
    x = centered(node.input(0), args[0]).astype(np.float64)
    acc = np.rint(x @ li.weights.astype(np.float64)).astype(np.int64) + li.bias.reshape(1, -1)
    return [requantize(acc, li.mult.reshape(1, -1), li.shift.reshape(1, -1), node.outputs[0])]


def maxpool_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    x = node.input(0)
    q = args[0]
    if node.op == "GlobalMaxPool":
        peak = q.max(axis=tuple(range(2, q.ndim)), keepdims=True)
    else:
        out = node.outputs[0].type.shape
        peak = np.nanmax(pool_windows(q, node.attrs, -np.inf, (int(out[2]), int(out[3]))), axis=(4, 5))
    m, s = pass_params(x, node.outputs[0])
    return [requantize(centered(x, peak.astype(np.int64)), m, s, node.outputs[0])]


def avgpool_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    x = node.input(0)
    c = centered(x, args[0])
    if node.op == "GlobalAvgPool":
        total = c.sum(axis=tuple(range(2, c.ndim)), keepdims=True)
        count = np.full(total.shape, int(np.prod(c.shape[2:])), dtype=np.int64)
    else:
        out = node.outputs[0].type.shape
        total = np.nansum(pool_windows(c, node.attrs, 0.0, (int(out[2]), int(out[3]))), axis=(4, 5))
        total = total.astype(np.int64)
        count = np.broadcast_to(pool_counts(node, c.shape), total.shape)
    m, s = count_params(node, int(count.max(initial=1)))
    return [requantize(total, m[count], s[count], node.outputs[0])]


def add_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    (ma, mb), s = common_params([act(a)[0] / act(y)[0], act(b)[0] / act(y)[0]])
    sign = 1 if node.op == "Add" else -1
    total = centered(a, args[0]) * ma + sign * (centered(b, args[1]) * mb)
    return [requantize(total, 1, s, y)]


def mul_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    m, s = requant_params(act(a)[0] * act(b)[0] / act(y)[0])
    return [requantize(centered(a, args[0]) * centered(b, args[1]), m, s, y)]


def minmax_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    y = node.outputs[0]
    parts = [requantize(centered(v, q), *pass_params(v, y), y) for v, q in zip(node.inputs, args)
             if v is not None]
    return [(np.maximum if node.op == "Max" else np.minimum)(*parts)]


def view_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Views (the registry's `view` trait), Transpose, Quantize: the reference kernel moves the
    integers, then requantize."""
    x, y = node.input(0), node.outputs[0]
    moved = args[0] if node.op == "Quantize" else get_schema(node.op).kernel(node, [args[0]])[0]
    return [requantize(centered(x, np.asarray(moved)), *pass_params(x, y), y)]


def split_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Split: the reference kernel moves the integers, each part is requantized to its output."""
    x = node.input(0)
    parts = get_schema(node.op).kernel(node, [args[0]])
    return [requantize(centered(x, p), *pass_params(x, y), y) for p, y in zip(parts, node.outputs)]


def concat_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    y = node.outputs[0]
    parts = [requantize(centered(v, q), *pass_params(v, y), y) for v, q in zip(node.inputs, args)
             if v is not None]
    return [np.concatenate(parts, axis=node.attrs["axis"])]


def prelu_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    x, y = node.input(0), node.outputs[0]
    m_pos, s_pos, m_neg, s_neg = prelu_params(node)
    c = centered(x, args[0])
    index = np.broadcast_to(np.arange(len(m_neg)).reshape(node.input(1).const.shape), c.shape)  # type: ignore[union-attr]
    return [np.where(c < 0, requantize(c, m_neg[index], s_neg[index], y), requantize(c, m_pos, s_pos, y))]


def matmul_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    a, b = (centered(node.input(i), q).astype(np.float64) for i, q in enumerate(args))
    m, s = matmul_params(node)
    acc = np.rint(np.matmul(a, b)).astype(np.int64)  # exact: |sum| < 2**31
    return [requantize(acc, m, s, node.outputs[0])]


def reduce_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """ReduceMax: the largest stored value; ReduceSum/ReduceMean: the centered sum, requantized."""
    x, y = node.input(0), node.outputs[0]
    outer, red, inner = f32.reduce_geometry(node, args[0].shape)
    rows = centered(x, args[0]).reshape(outer, red, inner)
    if node.op == "ReduceMax":
        total, ratio = rows.max(axis=1), act(x)[0] / act(y)[0]
    else:
        total = rows.sum(axis=1)
        ratio = act(x)[0] / act(y)[0] / (red if node.op == "ReduceMean" else 1)
    m, s = requant_params(ratio)
    return [requantize(total, m, s, y).reshape(f32._shape_like(node, args[0].shape))]


def argmax_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """The stored integers order like the values they stand for (scale > 0)."""
    return get_schema(node.op).kernel(node, [np.asarray(args[0], dtype=np.int64)])


def topk_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    x, y = node.input(0), node.outputs[0]
    values, order = get_schema(node.op).kernel(node, [np.asarray(args[0], dtype=np.int64)])
    return [requantize(centered(x, values), *pass_params(x, y), y), order]


def float_island(compute: Any) -> NodeKernel:
    """A kernel computing `compute(node, x, *params)` in float32 between dequantization of x
    (parameters as float32) and quantization of the output."""

    def kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        x = dequantize(args[0], node.input(0))
        params = [param_values(v) if v is not None and v.const is not None else None for v in node.inputs[1:]]
        return [quantize_input(compute(node, x, *params), node.outputs[0])]

    return kernel


def resize_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Nearest moves stored values; linear interpolates in float32 (qcc.sim.f32)."""
    if node.attrs["mode"] == "nearest":
        return view_kernel(node, args)
    return float_island(f32.resize_linear)(node, args)


def unary_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    lo = bounds(node.input(0))[0]
    return [unary_table(node)[np.asarray(args[0], dtype=np.int64) - lo]]


def softmax_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Peak, then total of exp(x - peak) in index order, then quantize(exp(x - peak) / total)."""
    x = dequantize(args[0], node.input(0))
    axis = node.attrs["axis"] % x.ndim
    shape = x.shape
    x3 = x.reshape(int(np.prod(shape[:axis])), shape[axis], -1)
    peak = x3[:, 0]
    for k in range(shape[axis]):
        peak = np.where(x3[:, k] > peak, x3[:, k], peak)
    total = np.zeros_like(peak)
    for k in range(shape[axis]):
        total = total + exp_f32(x3[:, k] - peak)
    y = [quantize_input(exp_f32(x3[:, k] - peak) / total, node.outputs[0]) for k in range(shape[axis])]
    return [np.stack(y, axis=1).reshape(shape)]


def batchnorm_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """((x - mean) * gamma) / sqrt(var + eps) + beta in float32 (target c's order in every mode)."""
    x = dequantize(args[0], node.input(0))
    for value in node.inputs[1:]:
        if value is None or value.const is None:
            raise UnsupportedError(f"affine integer mode: BatchNorm {node.name!r} needs constant parameters")
    params = [np.zeros(0)] + [quantize_param(v) for v in node.inputs[1:] if v is not None]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, gamma, beta, std = (p.reshape(shape) for p in batchnorm_params(node, params))
    return [quantize_input((x - mean) * gamma / std + beta, node.outputs[0])]


INTEGER_KERNELS: dict[str, NodeKernel] = {
    "Conv": conv_kernel, "Dense": dense_kernel, "MaxPool": maxpool_kernel, "GlobalMaxPool": maxpool_kernel,
    "AvgPool": avgpool_kernel, "GlobalAvgPool": avgpool_kernel, "Add": add_kernel, "Sub": add_kernel,
    "Mul": mul_kernel, "Max": minmax_kernel, "Min": minmax_kernel, "Concat": concat_kernel,
    "Softmax": softmax_kernel, "BatchNorm": batchnorm_kernel, "Quantize": view_kernel, "Transpose": view_kernel,
    "PRelu": prelu_kernel, "MatMul": matmul_kernel, "ReduceSum": reduce_kernel, "ReduceMean": reduce_kernel,
    "ReduceMax": reduce_kernel, "ArgMax": argmax_kernel, "TopK": topk_kernel, "Gather": view_kernel,
    "DepthToSpace": view_kernel, "SpaceToDepth": view_kernel, "Resize": resize_kernel, "Slice": view_kernel,
    "Split": split_kernel,
    "LayerNorm": float_island(f32.layernorm), "GroupNorm": float_island(f32.groupnorm),
    "InstanceNorm": float_island(f32.groupnorm), "ReduceL2": float_island(f32.reduce),
}
"""Kernels by op; views (the `view` trait) and one-input elementwise ops (tables) are found by
`kernel_for` from the registry."""


def is_table_op(op: str) -> bool:
    """One-input elementwise ops run as a 256-entry table (no kernel to write per op)."""
    schema = get_schema(op)
    return schema.has("elementwise") and schema.max_inputs == 1


def kernel_for(op: str) -> NodeKernel | None:
    if op in INTEGER_KERNELS:
        return INTEGER_KERNELS[op]
    if op_has(op, "view"):
        return view_kernel
    return unary_kernel if is_table_op(op) else None


# ---------------------------------------------------------------- running a model


def is_affine_model(model: Model) -> bool:
    """Every activation (graph input and node output) is affine."""
    graph = model.graph
    acts = [v for v in (*graph.inputs, *(v for n in graph.nodes for v in n.outputs)) if not is_index(v)]
    return bool(acts) and all(affine_of(v) is not None for v in acts)


class AffineRunner(Runner):
    """Runs an affine model on stored integers (int64 arrays)."""

    holds_floats = False

    def kernel_for(self, node: Node) -> NodeKernel:
        """The node's kernel, once its activations are checked to be per-tensor int8/uint8."""
        for value in (*node.outputs, node.inputs[0]):
            if value is not None and value.const is None and not is_index(value):
                act(value)
        kernel = kernel_for(node.op)
        if kernel is None:
            raise UnsupportedError(f"affine integer mode: op {node.op} (node {node.name!r}) has no integer kernel")
        return kernel

    def store_param(self, value: Value) -> np.ndarray:
        return store_param(value)

    def store_input(self, value: Value, array: np.ndarray) -> np.ndarray:
        return quantize_input(array, value)

    def to_float(self, value: Value, array: np.ndarray) -> np.ndarray:
        return dequantize(array, value) if affine_of(value) is not None and value.const is None else array


def run_affine_int(model: Model, feeds: dict[str, np.ndarray], **kwargs: Any) -> dict[str, np.ndarray]:
    """Run once in integer affine arithmetic; float32 outputs by name (kwargs: observer)."""
    return AffineRunner(model, **kwargs).run(feeds)
