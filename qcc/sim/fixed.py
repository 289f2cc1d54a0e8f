"""Bit-exact fixed-point execution: nnabla-c-runtime's arithmetic on integer arrays.

A value annotated `FixedPoint(bits, frac)` is held as the integers it stores (int64 arrays);
anything else is held as a float array. Kernels are registered per IR op with the one kernel
signature of `qcc.sim.engine`, `kernel(node, arrays) -> arrays`, and run on its loop (`FixedRunner`);
positions come from the annotations of the node's inputs and outputs. The C backend (target `c`) generates exactly this
arithmetic and the .nnb backend relies on nnabla-c-runtime doing it, so every rule below is part
of a contract (docs/backends.md, "c"; docs/nnb-runtime-semantics.md for the runtime's sources):

- Parameters are quantized once, rounding half to even (nnabla's converter); graph inputs too.
- Dedicated integer kernels (every operand FixedPoint, 8 or 16 bits; a Conv/Dense weight may be
  4-bit, fixed4, which the runtime holds as FIXED8 at the same position): Conv (sum per input channel
  in int64, truncated by 2**(fx+fw-fy) toward zero, added to the running output with saturation,
  then the bias with the runtime's saturating add), Dense (one truncation of the int64 sum), Max/
  Avg/GlobalAvg/GlobalMax pooling, Relu, Add/Sub/Mul (the coarser input position wins), Div,
  views, Transpose, Concat and Quantize (requantization: truncation toward zero when the position
  drops, saturation when it rises).
- Everything else is "generic": inputs dequantized to float32, computed in float32, stored by
  truncation toward zero and saturation (NaN stores 0). Softmax, Sigmoid, Tanh, LeakyRelu, Clip
  and BatchNorm spell out their float32 operation order (the runtime's); exp and tanh are the
  float32 rounding of the double-precision function (Clip between fixed-point values gives those
  values from the integers, `clip_kernel`). Other ops use the reference float kernel.
- Where nnabla-c-runtime has quirks only reachable outside its safe shift range (wrapping
  divisors, int8 upscale overflow, in-place rescaling of an input with a finer position) this
  module computes the clean result; the nnb backend must keep models inside that range. The
  saturating add's quirk (MIN + MIN = 0) and average pooling's wrap on upscale are reproduced.

`run_fixed(model, feeds)` runs a model and returns float outputs (exactly dequantized);
`qcc.sim.run_model(model, feeds, quantized=True)` calls it when every activation (graph input
and node output) is FixedPoint and every computed value truncates, see `runs_integer_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError, UnsupportedError
from qcc.ir.core import Model, Node, Value
from qcc.ir.ops._common import windows
from qcc.ir.ops.nn import pool_windows
from qcc.ir.registry import get_schema, op_has
from qcc.ir.types import FixedPoint
from qcc.quant.numerics import fixed_bounds, fixed_container_bits
from qcc.sim.engine import NodeKernel, Observer, Runner

F32 = np.float32
MAX_SHIFT = 40
"""Larger shifts between positions are rejected (no target computes them meaningfully)."""


# ---------------------------------------------------------------- integer arithmetic


def fixed_of(value: Value | None) -> FixedPoint | None:
    quant = value.quant if value is not None else None
    return quant if isinstance(quant, FixedPoint) else None


def saturate(a: np.ndarray, bits: int) -> np.ndarray:
    lo, hi = fixed_bounds(bits)
    a = np.asarray(a)
    if a.size and (a.min() < lo or a.max() > hi):
        return np.clip(a, lo, hi)
    return a.copy()  # a new array, as np.clip's: `a` may be a kernel's input (a shift by 0 returns it)


def clip_inplace(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """np.clip(a, lo, hi, out=a) after two reductions: numpy's clip costs 5-20x a max (its NaN
    handling) and the values mostly are inside the range already (no NaN here)."""
    if a.size and (a.min() < lo or a.max() > hi):
        np.clip(a, lo, hi, out=a)
    return a


def wrap(a: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement wrap-around (a C conversion to a narrower integer)."""
    half = 1 << (bits - 1)
    return ((np.asarray(a, dtype=np.int64) + half) & ((1 << bits) - 1)) - half


def tdiv(a: np.ndarray, d: np.ndarray | int) -> np.ndarray:
    """C integer division: truncation toward zero (d > 0)."""
    a = np.asarray(a, dtype=np.int64)
    q = np.abs(a) // d
    return np.where(a < 0, -q, q)


def shift(a: np.ndarray, n: int) -> np.ndarray:
    """a * 2**-n: truncating division for n > 0, exact multiplication for n < 0."""
    if abs(n) > MAX_SHIFT:
        raise UnsupportedError(f"fixed-point rescale by 2**{-n} is out of range")
    a = np.asarray(a, dtype=np.int64)
    if n > 0:  # tdiv(a, 2**n) without a division: negatives get 2**n - 1 added before the shift
        return (a + ((a >> 63) & ((1 << n) - 1))) >> n
    return a << -n if n < 0 else a


def requantize(q: np.ndarray, frac_in: int, frac_out: int, bits: int) -> np.ndarray:
    """Store an integer from one position in another: truncate when the position drops."""
    return saturate(shift(q, frac_in - frac_out), bits)


def sat_add(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """nnabla-c-runtime's saturating add (sum_sat16/8): MIN + MIN wraps to 0 and stays 0."""
    lo, hi = fixed_bounds(bits)
    total = np.add(a, b, dtype=np.int64)
    if total.size and lo <= total.min() and total.max() <= hi:
        return total  # nothing wraps: the common case, three passes instead of ten
    r = wrap(total, bits)
    r = np.where((a > 0) & (b > 0) & (r < 0), hi, r)
    return np.where((a < 0) & (b < 0) & (r > 0), lo, r)


def add_bias(total: np.ndarray, bias: np.ndarray, bits: int) -> np.ndarray:
    """`sat_add` of a Convolution/Affine sum and its bias, both inside the type's range (a
    saturated sum, `bias_ints`): only MIN + MIN wraps to 0, so without MIN in the bias the
    runtime's saturating add is a clip (two passes, also where values saturate)."""
    lo, hi = fixed_bounds(bits)
    if bias.size and int(bias.min()) == lo:
        return sat_add(total, bias, bits)
    return clip_inplace(np.add(total, bias, dtype=np.int64), lo, hi)


def sat_sub(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """nnabla-c-runtime's saturating subtract (sub_sat16/8): 0 - MIN gives MIN."""
    lo, hi = fixed_bounds(bits)
    r = wrap(a - b, bits)
    r = np.where((r < 0) & (a > 0) & (b < 0), hi, r)
    return np.where((r > 0) & (a < 0) & (b > 0), lo, r)


def to_float(q: np.ndarray, frac: int) -> np.ndarray:
    """The runtime's getter: q * 2**-frac in float32 (exact)."""
    if abs(frac) <= 100:  # a product by a normal power of two: exact, as ldexp, and a SIMD loop
        return np.multiply(np.asarray(q, dtype=F32), F32(2.0 ** -frac))
    return np.ldexp(np.asarray(q, dtype=F32), -frac)


def store(v: np.ndarray, fixed: FixedPoint) -> np.ndarray:
    """The runtime's setter: v * 2**frac truncated toward zero, saturated; NaN stores 0."""
    t = np.ldexp(np.asarray(v, dtype=F32), fixed.frac)
    lo, hi = fixed_bounds(fixed.bits)
    if np.isnan(t).any():
        t = np.where(np.isnan(t), F32(0), t)
    return clip_inplace(np.trunc(t), lo, hi).astype(np.int64)  # trunc then clip: integer bounds, same values


def quantize_round(x: np.ndarray, fixed: FixedPoint) -> np.ndarray:
    """Round half to even and saturate (parameters and graph inputs); NaN gives 0."""
    t = np.ldexp(np.asarray(x, dtype=F32), fixed.frac)
    lo, hi = fixed_bounds(fixed.bits)
    if np.isnan(t).any():
        t = np.where(np.isnan(t), F32(0), t)
    return clip_inplace(np.rint(t), lo, hi).astype(np.int64)  # rint then clip: integer bounds, same values


def exp_f32(v: np.ndarray) -> np.ndarray:
    """exp as float32: the double-precision result rounded once (C: (float)exp((double)v))."""
    return np.exp(np.asarray(v, dtype=np.float64)).astype(F32)


def tanh_f32(v: np.ndarray) -> np.ndarray:
    return np.tanh(np.asarray(v, dtype=np.float64)).astype(F32)


# ---------------------------------------------------------------- parameters


def quantize_param(value: Value) -> np.ndarray:
    """A constant as stored: integers for FixedPoint, float32 otherwise."""
    assert value.const is not None
    fixed = fixed_of(value)
    if fixed is not None:
        return quantize_round(value.const, fixed)
    if value.quant is not None:
        from qcc.ir.fakequant import apply_annotation

        return np.asarray(apply_annotation(value.const.astype(F32), value.quant))
    return value.const


def bias_ints(node: Node, bias: np.ndarray) -> np.ndarray:
    """The bias a Conv/Dense adds, in the output's position and range.

    A FixedPoint bias finer than the output is divided down (truncation, wrap to its own type:
    what the runtime's first forward does in place); a coarser one is scaled up with
    saturation; an unannotated bias is quantized at the output's position (the nnb rule).
    """
    y = fixed_of(node.outputs[0])
    assert y is not None
    b = fixed_of(node.inputs[2])
    if b is None:
        return quantize_round(bias, y)
    if b.frac > y.frac:
        return saturate(wrap(shift(bias, b.frac - y.frac), b.bits), y.bits)
    return requantize(bias, b.frac, y.frac, y.bits)


def dedicated_problem(node: Node) -> str | None:
    """Why `node` does not run an integer kernel (None: it does). The C backend shares this."""
    ins = [v for v in node.inputs if v is not None]
    count = integer_operands(node.op)
    if count is not None:
        operands = [fixed_of(v) for v in ins[:count]] + [fixed_of(v) for v in node.outputs]
        if any(f is None for f in operands):
            return "an operand is not fixed point"
        index = get_schema(node.op).weight_input
        weight = node.inputs[index] if index is not None and index < len(node.inputs) else None
        narrow = [v is weight and v.is_const for v in ins[:count]] + [False] * len(node.outputs)
        if any(f.bits not in (8, 16) and not (ok and f.bits == 4) for f, ok in zip(operands, narrow) if f is not None):
            return "fixed point other than 8 or 16 bits (4 only for a constant weight)"
        if node.op in SAME_BITS_OPS and len({fixed_container_bits(f.bits) for f in operands if f is not None}) > 1:
            return "operands of different bit widths"
        return None
    return "no integer kernel for this op"


# ---------------------------------------------------------------- dedicated kernels


def _types(node: Node) -> tuple[list[FixedPoint], FixedPoint]:
    ins = [fixed_of(v) for v in node.inputs if v is not None]
    y = fixed_of(node.outputs[0])
    assert y is not None
    return [f for f in ins if f is not None], y


def conv_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """nnabla-c-runtime's integer convolution: per input channel (in increasing order) the taps'
    exact sum, truncated by 2**(fx+fw-fy), added to the running output with saturation."""
    (fx, fw, *_), fy = _types(node)
    x, w = args[0], args[1]
    n = fx.frac + fw.frac - fy.frac
    if n < -MAX_SHIFT:
        raise UnsupportedError(f"fixed-point rescale by 2**{-n} is out of range")
    strides, pads, dil = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
    group = node.attrs["group"]
    _, cg, kh, kw = w.shape
    reach = _absmax(x)
    dtype = exact_float(x, w, n, fy.bits, reach)
    xp = x.astype(dtype) if dtype is not None and cg == 1 else x  # depthwise reads every tap: convert once
    if any(pads):  # (no copy of an unpadded input: the kernels only read it)
        xp = np.pad(xp, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    win = windows(xp, (kh, kw), strides, dil)  # N, C, OH, OW, KH, KW
    if dtype is None:
        y = _conv_int64(win, w, group, n, fy.bits)
    elif cg == 1:
        y = _conv_one_channel(win, w, group, n, fy.bits, dtype)
    else:
        y = _conv_blocked(win, w, group, n, fy.bits, dtype, reach)
    if len(args) > 2 and args[2] is not None:
        y = add_bias(y, bias_ints(node, args[2]).reshape(1, -1, 1, 1), fy.bits)
    return [y]


TILE = 1 << 16
"""Elements of the running output one block of rows updates: a few hundred kilobytes, so the
four passes per input channel (product, truncation, add, saturation) stay in cache."""
COLUMNS = 1 << 22
"""Elements of the im2col copy of one run of images."""


def _absmax(x: np.ndarray) -> int:
    """max|x| of stored integers (0 when empty): two reductions, no |x| array."""
    if not x.size:
        return 0
    if x.dtype.kind in "iu":
        return max(-int(x.min()), int(x.max()))
    return int(np.abs(x).max())


def exact_float(x: np.ndarray, w: np.ndarray, n: int, bits: int, absmax: int | None = None) -> type | None:
    """The narrowest float type that computes the convolution exactly (None: int64 then).

    Every partial sum is an integer times 2**-n (weights scaled by the power of two) below
    `partial` = max|x| * (the largest sum of |w| over one input channel's taps), and every running
    total is below the output's range plus one truncated partial sum: below 2**24 (float32) or
    2**53 (float64) every product, sum and scaling is exact, in any order (BLAS included).
    `absmax`: max|x| when known."""
    if x.size == 0 or w.size == 0 or abs(n) > 60:
        return None
    taps = np.abs(w.reshape(w.shape[0], w.shape[1], -1)).sum(axis=2, dtype=np.int64)
    partial = (_absmax(x) if absmax is None else absmax) * int(taps.max())
    truncated = partial >> n if n >= 0 else partial << -n
    for dtype, mantissa in ((np.float32, 24), (np.float64, 53)):
        if max(partial, truncated + (1 << (bits - 1))) < 1 << mantissa:
            return dtype
    return None


def _conv_one_channel(win: np.ndarray, w: np.ndarray, group: int, n: int, bits: int, dtype: type) -> np.ndarray:
    """One input channel per group (depthwise): each output is one truncated sum, no running
    total; the taps are accumulated over blocks of samples and groups of about `TILE` outputs,
    so the product and the add of every tap stay in cache (each output's taps in the same order
    as over the whole output at once: the same values; float64, FIXED16's type, 1.5-1.8x)."""
    batch, _, oh, ow, kh, kw = win.shape
    o = w.shape[0]
    og = o // group
    scaled = np.ldexp(w.astype(dtype).reshape(group, og, kh * kw), -n)  # exact: a power of two
    lo, hi = fixed_bounds(bits)
    out = np.empty((batch, group, og, oh, ow), dtype=np.int64)
    groups = max(1, min(group, TILE // max(1, og * oh * ow)))  # groups per block
    samples = max(1, min(batch, TILE // max(1, group * og * oh * ow))) if groups == group else 1
    acc: np.ndarray = np.empty((samples, groups, og, oh, ow), dtype=dtype)
    term = np.empty_like(acc)
    for b0 in range(0, batch, samples):
        b1 = min(batch, b0 + samples)
        for g0 in range(0, group, groups):
            g1 = min(group, g0 + groups)
            a, t = acc[:b1 - b0, :g1 - g0], term[:b1 - b0, :g1 - g0]
            a.fill(0)
            for tap in range(kh * kw):
                xs: np.ndarray = win[b0:b1, g0:g1, :, :, tap // kw, tap % kw].astype(dtype, copy=False)[:, :, None]
                np.multiply(xs, scaled[None, g0:g1, :, tap, None, None], out=t)
                a += t
            clip_inplace(np.trunc(a, out=a), lo, hi)
            out[b0:b1, g0:g1] = a  # integers: exact in int64
    return out.reshape(batch, o, oh, ow)


def _conv_blocked(win: np.ndarray, w: np.ndarray, group: int, n: int, bits: int, dtype: type,
                  absmax: int | None = None) -> np.ndarray:
    """The runtime's loop over input channels, run on blocks of output rows small enough for the
    cache (the loop order within a row is what makes it exact, not the order of the rows).
    `absmax`: max|x| of the input when known (the windows add only zeros)."""
    batch, _, oh, ow, kh, kw = win.shape
    o, cg = w.shape[:2]
    og, pixels, k = o // group, oh * ow, kh * kw
    scaled = np.ldexp(w.astype(dtype).reshape(group, og, cg, k), -n).transpose(0, 2, 3, 1)  # G, cg, K, og
    taps = np.abs(w.reshape(group, og, cg, k)).sum(axis=3, dtype=np.int64).max(axis=1)  # G, cg: max sum of |w|
    reach_x = int(np.abs(win).max(initial=0)) if absmax is None else absmax
    magic = rounding_constant(reach_x * int(taps.max(initial=0)), n, bits, dtype) if k == 1 else None
    if magic is not None:  # one column more: the sign of x, times the weights' rounding offsets
        offsets = -np.sign(w.reshape(group, og, cg)).transpose(0, 2, 1) * (0.5 - 2.0 ** -(n + 1) if n > 0 else 0.0)
        scaled = np.concatenate([scaled, offsets.astype(dtype)[:, :, None]], axis=2)  # G, cg, 2, og
    y: np.ndarray = np.full((group, batch * pixels, og), magic or 0, dtype=dtype)
    images = max(1, min(batch, COLUMNS // max(1, cg * pixels * k)))
    block = max(1, TILE // og)
    for g in range(group):
        wg = np.ascontiguousarray(scaled[g])
        for b0 in range(0, batch, images):
            rows = win[b0:b0 + images, g * cg:(g + 1) * cg].transpose(1, 0, 2, 3, 4, 5)  # cg, n, OH, OW, KH, KW
            cols: np.ndarray = np.ascontiguousarray(rows, dtype=dtype).reshape(cg, -1, k)  # cg, rows, K
            if magic is not None:
                cols = np.concatenate([cols, np.sign(cols)], axis=2)  # cg, rows, 2: x and sign(x)
            first = b0 * pixels
            for r0 in range(0, cols.shape[1], block):
                part = cols[:, r0:r0 + block]
                reach = np.abs(part[:, :, :k]).max(axis=(1, 2)).astype(np.int64) * taps[g]  # |partial sum| bounds
                steps = (reach >> n if n >= 0 else reach << -n).tolist()
                # this chunk's rows only: its last block may be short, and the next chunk's rows follow
                total = y[g, first + r0:first + r0 + part.shape[1]]
                if magic is None:
                    _add_channels(total, part, wg, steps, bits)
                else:
                    _add_rounded(total, part, wg, steps, bits, magic)
    ints = np.empty(y.shape, dtype=np.int64)
    if magic is not None:  # T = (M + T) - M exactly, in the float type, then converted
        np.subtract(y, dtype(magic), out=ints, casting="unsafe")
    else:
        np.copyto(ints, y, casting="unsafe")
    return ints.reshape(group, batch, pixels, og).transpose(1, 0, 3, 2).reshape(batch, o, oh, ow)


def rounding_constant(partial: int, n: int, bits: int, dtype: type) -> float | None:
    """1.5 * 2**(mantissa - 1) when a pointwise layer can truncate by rounding (None: it cannot).

    Inside [2**(m-1), 2**m) a float's step is 1, so adding v to M + T (an integer total T held
    with M added) rounds T + v to the nearest integer. A 1x1 layer's partial sum is one product
    x * w * 2**-n whose sign is sign(x) * sign(w): shifted by -sign(x) * sign(w) * (1/2 - 2**-(n+1))
    toward zero, rounding to nearest gives its truncation (odd multiples of 2**-(n+1): never a
    tie). So a matmul with one more column (sign(x) against the offsets) and one add per input
    channel do what a product, a trunc and an add did. Exact while the shifted product is a float
    (2 * partial + 2**n below 2**m) and |T| stays below 2**(m-2)."""
    mantissa = 24 if dtype is np.float32 else 53
    if n > mantissa - 3 or n < -MAX_SHIFT:
        return None
    scaled = 2 * partial + (1 << n) if n > 0 else partial << -n
    truncated = partial >> n if n >= 0 else partial << -n
    if scaled >= 1 << mantissa or (1 << (bits - 1)) + 2 * truncated + 2 >= 1 << (mantissa - 2):
        return None
    return 1.5 * 2.0 ** (mantissa - 1)


def _add_rounded(total: np.ndarray, cols: np.ndarray, w: np.ndarray, steps: list[int], bits: int,
                 magic: float) -> None:
    """`_add_channels` for a pointwise layer with `rounding_constant`'s total (`magic` added):
    [x, sign(x)] @ [w * 2**-n, offsets] is each shifted product, the add to the total rounds it."""
    lo, hi = fixed_bounds(bits)
    part = np.empty_like(total)
    reach, clipped, following = 0, False, _following(steps)
    for c in range(cols.shape[0]):
        if steps[c] == 0:  # every |product| < 2**n: truncates to 0
            continue
        np.matmul(cols[c], w[c], out=part)
        total += part
        reach += steps[c]
        if reach > hi:
            reach, clipped = _saturate(total, lo, hi, following[c], clipped, magic)


def _add_channels(total: np.ndarray, cols: np.ndarray, w: np.ndarray, steps: list[int], bits: int) -> None:
    """total := saturate(total + trunc(cols[c] @ w[c])) for each input channel c, in order.

    `steps[c]` bounds |trunc(cols[c] @ w[c])|; while the running bound of |total| stays inside
    the range no value can saturate and the clip is skipped (it would change nothing)."""
    lo, hi = fixed_bounds(bits)
    part = np.empty_like(total)
    reach, clipped, following = 0, False, _following(steps)  # |total| bound, last saturation clipped
    for c in range(cols.shape[0]):
        if steps[c] == 0:  # every |partial sum| < 2**n: truncates to 0 (adding -0.0 changes nothing)
            continue
        np.matmul(cols[c], w[c], out=part)  # a BLAS outer product for one tap: 7x numpy's broadcast multiply
        np.trunc(part, out=part)
        total += part
        reach += steps[c]
        if reach > hi:  # may have left the range: saturate now, as the runtime does at this step
            reach, clipped = _saturate(total, lo, hi, following[c], clipped)


def _following(steps: list[int]) -> list[int]:
    """Per channel, the bound of the next channel that adds something (0: none left)."""
    following, last = [0] * len(steps), 0
    for c in range(len(steps) - 1, -1, -1):
        following[c] = last
        last = steps[c] or last
    return following


def _saturate(total: np.ndarray, lo: int, hi: int, following: int, clipped: bool,
              origin: float = 0.0) -> tuple[int, bool]:
    """Clip `total - origin` to [lo, hi] in place: (a bound of |total - origin| afterwards,
    whether values were out of range).

    numpy's clip costs 5-20x a max here (its NaN handling): where the last saturation found
    values out of range (a layer whose total sits at the bounds) clip at once, as the runtime
    does, and take the range as the bound unless the next channel adds less than it; elsewhere
    check with two reductions first, and clip only what left the range."""
    if clipped:
        np.clip(total, origin + lo, origin + hi, out=total)
        if following >= hi:
            return -lo, True
        top, bottom = float(total.max()) - origin, float(total.min()) - origin
        return int(max(top, -bottom)), top >= hi or bottom <= lo
    top, bottom = float(total.max()) - origin, float(total.min()) - origin
    out = top > hi or bottom < lo
    if out:
        np.clip(total, origin + lo, origin + hi, out=total)
    return int(max(min(top, hi), -max(bottom, lo))), out


def _conv_int64(win: np.ndarray, w: np.ndarray, group: int, n: int, bits: int) -> np.ndarray:
    """The runtime's loop in int64, one input channel at a time (values too wide for a float)."""
    batch, _, oh, ow, kh, kw = win.shape
    o, cg = w.shape[:2]
    og = o // group
    wt = w.astype(np.int64).reshape(group, og, cg, kh * kw).transpose(2, 0, 3, 1)
    y = np.zeros((batch, group, oh * ow, og), dtype=np.int64)
    for im in range(cg):
        xs = win[:, im::cg].astype(np.int64).reshape(batch, group, oh * ow, kh * kw)
        part = np.matmul(xs, wt[im])
        if n > 62:  # |part| < 2**63: truncates to 0
            part = np.zeros_like(part)
        elif n > 0:  # truncation toward zero, as `shift`, without its range check
            part = (part + ((part >> 63) & ((1 << n) - 1))) >> n
        else:
            part = shift(part, n)
        y = saturate(y + part, bits)
    return y.transpose(0, 1, 3, 2).reshape(batch, o, oh, ow)


def dense_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    (fx, fw, *_), fy = _types(node)
    total = (args[0].astype(np.float64) @ args[1].astype(np.float64)).astype(np.int64)
    y = saturate(shift(total, fx.frac + fw.frac - fy.frac), fy.bits)
    if len(args) > 2 and args[2] is not None:
        y = add_bias(y, bias_ints(node, args[2]).reshape(1, -1), fy.bits)
    return [y]


def _pool_shape(node: Node) -> tuple[int, int]:
    shape = node.outputs[0].type.shape
    return int(shape[2]), int(shape[3])


def maxpool_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    (fx,), fy = _types(node)
    if node.op == "GlobalMaxPool":
        m = args[0].max(axis=tuple(range(2, args[0].ndim)), keepdims=True)
    else:
        win = pool_windows(args[0], node.attrs, -np.inf, _pool_shape(node))
        m = np.nanmax(win, axis=(4, 5)).astype(np.int64)
    return [requantize(m, fx.frac, fy.frac, fy.bits)]


def average(total: np.ndarray, count: np.ndarray | int, fx: FixedPoint, fy: FixedPoint) -> np.ndarray:
    """The runtime's fixed average: int8 sums wrap at 16 bits, an upscale wraps to the type."""
    if fx.bits == 8:
        total = wrap(total, 16)
    mean = wrap(tdiv(total, count), fx.bits)
    return wrap(requantize(mean, fx.frac, fy.frac, 2 * fy.bits), fy.bits)


def avgpool_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    (fx,), fy = _types(node)
    x = args[0]
    if node.op == "GlobalAvgPool":
        spatial = tuple(range(2, x.ndim))
        return [average(x.sum(axis=spatial, keepdims=True), int(np.prod(x.shape[2:])), fx, fy)]
    out_hw = _pool_shape(node)
    total = np.nansum(pool_windows(x, node.attrs, 0.0, out_hw), axis=(4, 5)).astype(np.int64)
    ones = np.ones((1, 1, *x.shape[2:]))
    pad = 1.0 if node.attrs["count_include_pad"] else 0.0
    count = np.nansum(pool_windows(ones, node.attrs, pad, out_hw), axis=(4, 5)).astype(np.int64)
    return [average(total, count, fx, fy)]


def relu_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    (fx,), fy = _types(node)
    return [requantize(np.maximum(args[0], 0), fx.frac, fy.frac, fy.bits)]


def _align(node: Node, args: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Add2/Sub2: the finer input is truncated to the coarser position."""
    (f0, f1), _ = _types(node)
    common = min(f0.frac, f1.frac)
    return shift(args[0], f0.frac - common), shift(args[1], f1.frac - common), common


def add_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    _, fy = _types(node)
    a, b, common = _align(node, args)
    r = sat_add(a, b, fy.bits) if node.op == "Add" else sat_sub(a, b, fy.bits)
    return [requantize(r, common, fy.frac, fy.bits)]


def mul_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    (f0, f1), fy = _types(node)
    return [saturate(shift(args[0] * args[1], f0.frac + f1.frac - fy.frac), fy.bits)]


def div_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    (f0, f1), fy = _types(node)
    if np.any(args[1] == 0):
        raise InvalidInputError(f"node {node.name!r} (Div): integer division by zero")
    num = shift(np.broadcast_to(args[0], np.broadcast_shapes(args[0].shape, args[1].shape)),
                -(f1.frac + fy.frac - f0.frac))
    return [saturate(tdiv(num * np.sign(args[1]), np.abs(args[1])), fy.bits)]


def copy_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Views (the registry's `view` trait), Transpose, Quantize: the float kernel moves the
    integers, then requantize."""
    (fx,), fy = _types(node)
    moved = get_schema(node.op).kernel(node, [args[0]]) if node.op != "Quantize" else [args[0]]
    return [requantize(np.asarray(moved[0], dtype=np.int64), fx.frac, fy.frac, fy.bits)]


INTEGER_OPS: dict[str, int] = {
    "Conv": 2, "Dense": 2, "MaxPool": 1, "AvgPool": 1, "GlobalAvgPool": 1, "GlobalMaxPool": 1,
    "Relu": 1, "Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Transpose": 1, "Quantize": 1,
}
"""Ops with an integer kernel -> how many leading inputs must be fixed point (plus the output);
views (any op with the registry's `view` trait) too, see `integer_operands`."""

SAME_BITS_OPS = frozenset({"MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool", "Relu", "Add", "Sub",
                           "Mul", "Div"})
"""The runtime's dedicated kernel needs one type for all operands; otherwise it is generic."""

_DEDICATED: dict[str, NodeKernel] = {
    "Conv": conv_kernel, "Dense": dense_kernel, "MaxPool": maxpool_kernel, "GlobalMaxPool": maxpool_kernel,
    "AvgPool": avgpool_kernel, "GlobalAvgPool": avgpool_kernel, "Relu": relu_kernel, "Add": add_kernel,
    "Sub": add_kernel, "Mul": mul_kernel, "Div": div_kernel, "Transpose": copy_kernel,
    "Quantize": copy_kernel,
}


def integer_operands(op: str) -> int | None:
    """How many leading inputs of `op` its integer kernel reads as fixed point (None: no kernel)."""
    if op in INTEGER_OPS:
        return INTEGER_OPS[op]
    return 1 if op_has(op, "view") else None


# ---------------------------------------------------------------- generic (float32) kernels


def getter(value: Value | None, array: np.ndarray) -> np.ndarray:
    fixed = fixed_of(value)
    return to_float(array, fixed.frac) if fixed is not None else np.asarray(array, dtype=F32)


def setter(value: Value, array: np.ndarray) -> np.ndarray:
    fixed = fixed_of(value)
    return store(array, fixed) if fixed is not None else np.asarray(array, dtype=F32)


def generic_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Dequantize, run the reference float kernel, store each output."""
    floats = [getter(v, a) for v, a in zip(node.inputs, args)]
    outs = get_schema(node.op).kernel(node, floats)
    return [setter(v, np.asarray(o)) for v, o in zip(node.outputs, outs)]


def _unary(fn: Callable[[Node, np.ndarray], np.ndarray]) -> NodeKernel:
    def kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        return [setter(node.outputs[0], fn(node, getter(node.inputs[0], args[0])))]

    kernel.__doc__ = fn.__doc__
    return kernel


@_unary
def sigmoid_f32(node: Node, v: np.ndarray) -> np.ndarray:
    """1.0f / (1.0f + expf(-v))."""
    return F32(1) / (F32(1) + exp_f32(-v))


@_unary
def tanh_generic(node: Node, v: np.ndarray) -> np.ndarray:
    """tanhf(v)."""
    return tanh_f32(v)


@_unary
def leaky_f32(node: Node, v: np.ndarray) -> np.ndarray:
    """v > 0.0f ? v : v * alpha."""
    return np.where(v > 0, v, v * F32(node.attrs["alpha"]))


@_unary
def clip_f32(node: Node, v: np.ndarray) -> np.ndarray:
    """v < lo ? lo : v, then v > hi ? hi : v (float32 bounds)."""
    lo, hi = node.attrs["min"], node.attrs["max"]
    if lo is not None:
        v = np.where(v < F32(lo), F32(lo), v)
    if hi is not None:
        v = np.where(v > F32(hi), F32(hi), v)
    return v


def clip_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """`clip_f32` computed on the integers when input and output are fixed point (ReLU6 after
    every mobilenet convolution): the same values without the float32 round trip.

    The getter's v = q * 2**-fx is exact and the setter (`store`: scale by a power of two,
    truncate, saturate) is nondecreasing, so store(clamp(v, lo, hi)) = clamp(store(v), store(lo),
    store(hi)), with store(v) = q shifted by fx - fy and saturated. Crossed bounds (lo > hi) give
    hi everywhere, as the runtime's two selects do."""
    fx, fy = fixed_of(node.inputs[0]), fixed_of(node.outputs[0])
    if fx is None or fy is None or max(abs(fx.frac), abs(fy.frac)) > 100 or abs(fx.frac - fy.frac) > MAX_SHIFT:
        return clip_f32(node, args)
    q = np.asarray(args[0], dtype=np.int64)
    lo, hi = node.attrs["min"], node.attrs["max"]
    bottom, top = fixed_bounds(fy.bits)
    stored_lo = bottom if lo is None else int(store(np.array([F32(lo)]), fy)[0])
    stored_hi = top if hi is None else int(store(np.array([F32(hi)]), fy)[0])
    if lo is not None and hi is not None and F32(lo) > F32(hi):
        return [np.full(q.shape, stored_hi, dtype=np.int64)]
    return [clip_saturated(shift(q, fx.frac - fy.frac), bottom, top, stored_lo, stored_hi)]


def clip_saturated(a: np.ndarray, bottom: int, top: int, lo: int, hi: int) -> np.ndarray:
    """np.clip(saturate(a), lo, hi) for bottom <= lo <= hi <= top (saturate's bounds): one clip,
    the same values in a new array of the same layout (C order where saturate copies, a's layout
    where it clips), without saturate's copy."""
    a = np.asarray(a)
    if a.size and (a.min() < bottom or a.max() > top):
        return np.clip(a, lo, hi)  # type: ignore[no-any-return]
    return np.clip(a, lo, hi, out=np.empty(a.shape, dtype=a.dtype))  # type: ignore[no-any-return]


def softmax_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """The runtime's generic Softmax, including its read-back of the stored exponentials."""
    x = getter(node.inputs[0], args[0])
    axis = node.attrs["axis"] % x.ndim
    shape = x.shape
    x3 = x.reshape(int(np.prod(shape[:axis])), shape[axis], -1)
    out = node.outputs[0]
    peak = x3[:, 0]
    for k in range(shape[axis]):
        peak = np.where(x3[:, k] > peak, x3[:, k], peak)
    total = np.zeros_like(peak)
    stored = []
    for k in range(shape[axis]):
        e = exp_f32(x3[:, k] - peak)
        stored.append(setter(out, e))
        total = total + e
    y = [setter(out, getter(out, s) / total) for s in stored]
    return [np.stack(y, axis=1).reshape(shape)]


def batchnorm_params(node: Node, args: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """(mean, gamma, beta, sqrt(var + eps)) per channel as float32, read through the getters."""
    scale, bias, mean, var = (getter(v, a) for v, a in zip(node.inputs[1:], args[1:]))
    std = np.sqrt(var + F32(node.attrs["epsilon"]))
    return mean, scale, bias, std


def batchnorm_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """((x - mean) * gamma) / sqrt(var + eps) + beta in float32 (the runtime's order)."""
    x = getter(node.inputs[0], args[0])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, gamma, beta, std = (p.reshape(shape) for p in batchnorm_params(node, args))
    return [setter(node.outputs[0], (x - mean) * gamma / std + beta)]


def concat_kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    out = node.outputs[0]
    fy = fixed_of(out)
    parts = []
    for value, array in zip(node.inputs, args):
        fx = fixed_of(value)
        if fy is not None and fx is not None:
            parts.append(requantize(array, fx.frac, fy.frac, fy.bits))
        else:
            parts.append(setter(out, getter(value, array)))
    return [np.concatenate(parts, axis=node.attrs["axis"])]


@_unary
def lrn_f32(node: Node, v: np.ndarray) -> np.ndarray:
    """The .nnb functions' LRN (qcc.sim.f32.lrn): x * x, window sum, scale, bias, power, x / that."""
    from qcc.sim.f32 import lrn

    return lrn(node, v)


@_unary
def store_f32(node: Node, v: np.ndarray) -> np.ndarray:
    """Quantize from a float input: the runtime's setter stores v (truncation toward zero), as
    its Identity does; the reference kernel would round half to even first."""
    return v


PRECISE_GENERIC: dict[str, NodeKernel] = {
    "Sigmoid": sigmoid_f32, "Tanh": tanh_generic, "LeakyRelu": leaky_f32, "Clip": clip_kernel,
    "Softmax": softmax_kernel, "BatchNorm": batchnorm_kernel, "Concat": concat_kernel, "Quantize": store_f32,
    "LRN": lrn_f32,
}
"""Generic kernels whose float32 operation order is specified (and generated by target c)."""


def _dispatch(op: str) -> NodeKernel:
    dedicated = _DEDICATED.get(op) or (copy_kernel if op_has(op, "view") else None)
    fallback = PRECISE_GENERIC.get(op, generic_kernel)
    if dedicated is None:
        return fallback

    def kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        return dedicated(node, args) if dedicated_problem(node) is None else fallback(node, args)

    kernel.__doc__ = dedicated.__doc__
    return kernel


FIXED_KERNELS: dict[str, NodeKernel] = {op: _dispatch(op) for op in {*_DEDICATED, *PRECISE_GENERIC}}
"""Per-op kernels on stored arrays; views run `copy_kernel`, ops not listed `generic_kernel`."""


def fixed_kernel(op: str) -> NodeKernel:
    """The kernel of `op` on stored arrays."""
    return FIXED_KERNELS.get(op) or _dispatch(op)


# ---------------------------------------------------------------- running a model


def is_fixed_model(model: Model) -> bool:
    """Every activation (graph input and node output) is FixedPoint."""
    graph = model.graph
    acts = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    return bool(acts) and all(fixed_of(v) is not None for v in acts)


def runs_integer_kernels(model: Model) -> bool:
    """Every activation FixedPoint and every computed value stored by truncation toward zero
    (`FixedPoint.rounding == "trunc"`): nnabla-c-runtime's arithmetic, which `FixedRunner`
    computes, so run_model(quantized=True) runs it. A fixed-point model for a runtime that rounds
    to nearest (onnx-qdq: QuantizeLinear) is fake-quantized value by value instead."""
    computed = [v for n in model.graph.nodes for v in n.outputs]
    return is_fixed_model(model) and all(fixed_of(v).rounding == "trunc" for v in computed)  # type: ignore[union-attr]


class FixedRunner(Runner):
    """Runs a model on stored arrays (int64 for FixedPoint values); parameters quantized once."""

    holds_floats = False

    def __init__(self, model: Model, kernels: dict[str, NodeKernel] | None = None,
                 observer: Observer | None = None, keep_all: bool = False) -> None:
        self.kernels = kernels or {}
        super().__init__(model, observer, keep_all)

    def kernel_for(self, node: Node) -> NodeKernel:
        return self.kernels.get(node.op) or fixed_kernel(node.op)

    def store_param(self, value: Value) -> np.ndarray:
        return quantize_param(value)

    def store_input(self, value: Value, array: np.ndarray) -> np.ndarray:
        fixed = fixed_of(value)
        return quantize_round(array, fixed) if fixed is not None else array

    def to_float(self, value: Value, array: np.ndarray) -> np.ndarray:
        return dequantize_stored(value, array)


def dequantize_stored(value: Value, array: np.ndarray) -> np.ndarray:
    fixed = fixed_of(value)
    return to_float(array, fixed.frac) if fixed is not None else np.asarray(array)


def param_values(value: Value) -> np.ndarray:
    """A parameter as float kernels read it in every mode: the values its annotation stores
    (a fixed-point one dequantized), float32."""
    return np.asarray(dequantize_stored(value, quantize_param(value)), dtype=F32)


def run_fixed(model: Model, feeds: dict[str, np.ndarray], **kwargs: Any) -> dict[str, np.ndarray]:
    """Run once with the integer kernels; float32 outputs by name (kwargs: kernels, observer)."""
    return FixedRunner(model, **kwargs).run(feeds)

