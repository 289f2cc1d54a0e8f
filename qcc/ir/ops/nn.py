"""Neural-network ops in NCHW layout: convolutions, dense layers, normalization, pooling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from qcc.ir.ops._common import attr_list, pairs, spatial_out, windows
from qcc.ir.registry import BIAS, AttrSpec, OpDef, register, weight
from qcc.ir.types import TensorType

_CONV_ATTRS = {
    "strides": AttrSpec("ints", [1, 1]),
    "pads": AttrSpec("ints", [0, 0, 0, 0], "begin_h, begin_w, end_h, end_w"),
    "dilations": AttrSpec("ints", [1, 1]),
    "group": AttrSpec("int", 1),
}


def _conv_geometry(attrs: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
    return (
        pairs(attrs["strides"], 2, "strides"),
        pairs(attrs["pads"], 4, "pads"),
        pairs(attrs["dilations"], 2, "dilations"),
    )


def _check_bias(types: list[TensorType], channels: Any) -> None:
    if len(types) > 2 and types[2] is not None and tuple(types[2].shape) != (channels,):
        raise ValueError(f"bias shape {types[2].shape} must be ({channels},)")


@register
class Conv(OpDef):
    """2-D convolution, weight (O, C/group, KH, KW), optional bias (O)."""

    inputs = ("x", "w", "b?")
    roles = {"w": weight(0), "b": BIAS}
    attrs = _CONV_ATTRS
    traits = frozenset({"product"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x, w = types[0], types[1]
        if x.rank != 4 or w.rank != 4:
            raise ValueError(f"Conv needs rank-4 x and w, got {x.shape} and {w.shape}")
        strides, pads, dil = _conv_geometry(attrs)
        group = attrs["group"]
        if group < 1 or not isinstance(x.shape[1], int) or x.shape[1] != w.shape[1] * group:
            raise ValueError(f"input channels {x.shape[1]} != weight channels {w.shape[1]} x group {group}")
        if int(w.shape[0]) % group:
            raise ValueError(f"output channels {w.shape[0]} not divisible by group {group}")
        _check_bias(types, w.shape[0])
        oh = spatial_out(x.shape[2], int(w.shape[2]), strides[0], pads[0], pads[2], dil[0])
        ow = spatial_out(x.shape[3], int(w.shape[3]), strides[1], pads[1], pads[3], dil[1])
        return [TensorType(x.dtype, (x.shape[0], w.shape[0], oh, ow))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x, w = xs[0], xs[1]
        b = xs[2] if len(xs) > 2 else None
        return [conv2d(x, w, b, node.attrs)]


_BLOCK_ELEMENTS = 1 << 22
"""Patch-matrix elements built at once (16 MB in float32): bounds a convolution's extra memory."""


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any],
           accumulate: Any = None, out: np.ndarray | None = None) -> np.ndarray:
    """Grouped convolution in `accumulate` (default x's dtype; int64 for fixed point: exact).

    One matrix product per group and block of samples/rows on a contiguous patch matrix (im2col;
    1x1 convolutions use the input itself), depthwise ones as a sum of shifted products: BLAS
    speed in float32, no float64 upcast, extra memory bounded by _BLOCK_ELEMENTS. `out`: a
    C-contiguous array of the output's shape and dtype to compute into (calibration's threads
    each write their samples of one batch output: no concatenation afterwards); same bits.
    """
    strides, pads, dil = _conv_geometry(attrs)
    group = int(attrs["group"])
    dtype = np.dtype(accumulate or x.dtype)
    x = x.astype(dtype, copy=False)
    w = w.astype(dtype, copy=False)
    h, wd = x.shape[2:]
    cg, kh, kw = w.shape[1:]
    oh = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    if out is not None and (out.shape != (x.shape[0], w.shape[0], oh, ow) or out.dtype != dtype
                            or not out.flags.c_contiguous):
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}, the convolution computes "
                         f"{(x.shape[0], w.shape[0], oh, ow)} in {dtype} (C-contiguous)")
    bias = b.astype(dtype, copy=False) if b is not None else None
    if _channel_scale(x, w, bias, strides, pads, group):
        # a standalone batch norm folded to a 1x1 depthwise convolution (DenseNet's, before every
        # layer): x * w + b in two passes. _depthwise sums its one tap onto zeros, turning a -0.0
        # product into +0.0; a bias without -0.0 gives the same sums either way (-0.0 + b == 0.0 + b)
        y = np.multiply(x, w.reshape(1, -1, 1, 1), out=out)
    elif cg == 1 and group > 1:
        y = _depthwise(x, w, strides, pads, dil, (oh, ow), group, out)
    else:
        y = _conv_gemm(x, w, strides, pads, dil, (oh, ow), group, out)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    return y


def _channel_scale(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: list[int], pads: list[int],
                   group: int) -> bool:
    """A float 1x1 depthwise convolution with one output per channel, no padding, stride 1 and a
    bias without -0.0: each output is x * w[c] + b[c]."""
    return (x.dtype.kind == "f" and group > 1 and group == x.shape[1] == w.shape[0] and w.shape[2:] == (1, 1)
            and strides == [1, 1] and not any(pads) and b is not None
            and not np.any(np.signbit(b) & (b == 0)))


def _padded(x: np.ndarray, pads: list[int]) -> np.ndarray:
    if not any(pads):
        return x
    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], w + pads[1] + pads[3]), dtype=x.dtype)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + w] = x
    return xp


def _tap(xp: np.ndarray, i: int, j: int, rows: tuple[int, int], ow: int, strides: list[int],
         dil: list[int]) -> np.ndarray:
    """The input under kernel tap (i, j) for output rows [r0, r1): (N, C, r1 - r0, OW) view."""
    r0, r1 = rows
    top, left = i * dil[0] + r0 * strides[0], j * dil[1]
    return xp[:, :, top:top + (r1 - r0 - 1) * strides[0] + 1:strides[0], left:left + (ow - 1) * strides[1] + 1:strides[1]]


def _conv_gemm(x: np.ndarray, w: np.ndarray, strides: list[int], pads: list[int], dil: list[int],
               out_hw: tuple[int, int], group: int, out: np.ndarray | None = None) -> np.ndarray:
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    oh, ow = out_hw
    og, k = o // group, cg * kh * kw
    wk = w.reshape(group, og, k)
    y = np.empty((n, o, oh, ow), dtype=x.dtype) if out is None else out
    if kh == kw == 1 and not any(pads) and strides == [1, 1]:  # the input is the patch matrix
        np.matmul(wk, x.reshape(n, group, cg, oh * ow), out=y.reshape(n, group, og, oh * ow))
        return y
    if (strides == [1, 1] and group == 1 and 2 * o <= c and x.dtype.kind == "f"
            and kh * kw * o * ((x.shape[2] + pads[0] + pads[2] + 1) * (x.shape[3] + pads[1] + pads[3])) <= _BLOCK_ELEMENTS):
        _conv_by_taps(x, w, pads, dil, y)
        return y
    xp = _padded(x, pads)
    per_row = max(1, c * kh * kw * ow)
    rows = max(1, min(oh, _BLOCK_ELEMENTS // per_row))
    samples = max(1, _BLOCK_ELEMENTS // (per_row * oh)) if rows == oh else 1
    for n0 in range(0, n, samples):
        part = xp[n0:n0 + samples]
        m = len(part)
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            cols = np.empty((m, c, kh, kw, r1 - r0, ow), dtype=x.dtype)
            for i in range(kh):
                for j in range(kw):
                    cols[:, :, i, j] = _tap(part, i, j, (r0, r1), ow, strides, dil)
            patches = cols.reshape(m, group, k, (r1 - r0) * ow)
            if r1 - r0 == oh:
                np.matmul(wk, patches, out=y[n0:n0 + m].reshape(m, group, og, oh * ow))
            else:
                y[n0:n0 + m, :, r0:r1] = np.matmul(wk, patches).reshape(m, o, r1 - r0, ow)
    return y


def _conv_by_taps(x: np.ndarray, w: np.ndarray, pads: list[int], dil: list[int], y: np.ndarray) -> None:
    """A stride-1 float convolution that narrows the channels (DenseNet's 3x3 layers: 128 -> 32)
    as one product of every tap's weights with the padded input, then the taps' shifted slices summed.

    With the padded image flattened row by row, tap (i, j) of output pixel (r, q) reads element
    (r + i*dh) * Wp + q + j*dw: output row r's Wp columns, shifted by i*dh*Wp + j*dw, are one
    contiguous slice of that tap's product rows (the last kw-1 columns of each row are past the
    image and dropped). The patch matrix that im2col writes (KH*KW times the input) is never built:
    the product reads the input once and writes KH*KW*O rows, fewer when O < C. One sample at a
    time, taps summed in a fixed order: a sample's bits never depend on its batch.
    """
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = y.shape[2:]
    hp, wp = h + pads[0] + pads[2], wd + pads[1] + pads[3]
    span = oh * wp
    length = hp * wp + (kw - 1) * dil[1]
    taps = np.ascontiguousarray(w.transpose(2, 3, 0, 1)).reshape(kh * kw * o, c)
    flat = np.zeros((c, length), dtype=x.dtype)
    image = flat[:, :hp * wp].reshape(c, hp, wp)[:, pads[0]:pads[0] + h, pads[1]:pads[1] + wd]
    products = np.empty((kh * kw * o, length), dtype=x.dtype)
    total = np.empty((o, span), dtype=x.dtype)
    for k in range(n):
        image[...] = x[k]  # the borders stay zero
        np.matmul(taps, flat, out=products)
        for tap in range(kh * kw):
            i, j = divmod(tap, kw)
            start = i * dil[0] * wp + j * dil[1]
            part = products[tap * o:(tap + 1) * o, start:start + span]
            if tap:
                total += part
            else:
                total[...] = part
        y[k] = total.reshape(o, oh, wp)[:, :, :ow]


def _depthwise(x: np.ndarray, w: np.ndarray, strides: list[int], pads: list[int], dil: list[int],
               out_hw: tuple[int, int], group: int, out: np.ndarray | None = None) -> np.ndarray:
    """One input channel per group: a sum over kernel taps of per-channel scaled shifted inputs."""
    last = _depthwise_channels_last(x, w, strides, pads, dil, out_hw, out)
    if last is not None:
        return last
    o, _, kh, kw = w.shape
    mult = o // group
    xp = _padded(x, pads)
    if mult > 1:  # each input channel feeds `mult` consecutive output channels
        xp = np.repeat(xp, mult, axis=1)
    oh, ow = out_hw
    if out is None:
        y = np.zeros((x.shape[0], o, oh, ow), dtype=x.dtype)
    else:
        y = out
        y[...] = 0
    samples = max(1, _DEPTHWISE_BLOCK // max(1, o * oh * ow))
    tmp = np.empty_like(y[:samples])
    for n0 in range(0, x.shape[0], samples):  # a few samples at a time: the passes stay in cache
        part, out = xp[n0:n0 + samples], y[n0:n0 + samples]
        for i in range(kh):
            for j in range(kw):
                np.multiply(_tap(part, i, j, (0, oh), ow, strides, dil), w[:, 0, i, j].reshape(1, o, 1, 1),
                            out=tmp[:len(part)])
                out += tmp[:len(part)]
    return y


_DEPTHWISE_BLOCK = 1 << 17
"""Output elements of one block of samples in a depthwise convolution (half a megabyte in float32)."""


def _depthwise_channels_last(x: np.ndarray, w: np.ndarray, strides: list[int], pads: list[int], dil: list[int],
                             out_hw: tuple[int, int], out: np.ndarray | None = None) -> np.ndarray | None:
    """`_depthwise`'s bytes for a float32 depthwise convolution with one output per channel and a
    kernel larger than 1x1, computed channels last (None: any other case).

    Per channel, a strided NCHW tap times a weight broadcast over the map makes numpy copy both
    into buffers (in MobileNetV2's float runs, more instructions than the 1x1 layers' BLAS). Here
    the zero-padded input is transposed once to (N, H, W, C): each tap is a view with C contiguous,
    times the tap's weights (C,), added onto zeros in the same tap order, then transposed back: the
    same float32 products and sums, bit for bit (MobileNetV2's layers 1.3x at 48x48, 3.6x at 3x3)."""
    n, c, h, wd = (int(d) for d in x.shape)
    kh, kw = int(w.shape[2]), int(w.shape[3])
    if not (x.dtype == w.dtype == np.float32 and int(w.shape[0]) == c and kh * kw > 1 and min(pads) >= 0):
        return None
    oh, ow = out_hw
    y = np.empty((n, c, oh, ow), np.float32) if out is None else out
    taps = np.ascontiguousarray(w[:, 0].transpose(1, 2, 0))  # (kh, kw, C)
    samples = max(1, _DEPTHWISE_BLOCK // max(1, c * oh * ow))
    for n0 in range(0, n, samples):  # a few samples at a time: the passes stay in cache
        part = x[n0:n0 + samples]
        padded = np.zeros((len(part), h + pads[0] + pads[2], wd + pads[1] + pads[3], c), np.float32)
        padded[:, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = part.transpose(0, 2, 3, 1)
        acc = np.zeros((len(part), oh, ow, c), np.float32)
        tmp = np.empty_like(acc)
        for i in range(kh):
            for j in range(kw):
                top, left = i * dil[0], j * dil[1]
                tap = padded[:, top:top + (oh - 1) * strides[0] + 1:strides[0],
                             left:left + (ow - 1) * strides[1] + 1:strides[1]]
                np.multiply(tap, taps[i, j], out=tmp)
                acc += tmp
        y[n0:n0 + samples] = acc.transpose(0, 3, 1, 2)
    return y


@register
class ConvTranspose(OpDef):
    """2-D transposed convolution (nnabla Deconvolution), weight (C, O/group, KH, KW)."""

    inputs = ("x", "w", "b?")
    roles = {"w": weight(1), "b": BIAS}
    attrs = {**_CONV_ATTRS, "output_padding": AttrSpec("ints", [0, 0])}
    traits = frozenset({"product", "scatters"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x, w = types[0], types[1]
        if x.rank != 4 or w.rank != 4:
            raise ValueError("ConvTranspose needs rank-4 x and w")
        strides, pads, dil = _conv_geometry(attrs)
        group = attrs["group"]
        if x.shape[1] != w.shape[0]:
            raise ValueError(f"input channels {x.shape[1]} != weight dim 0 {w.shape[0]}")
        o = int(w.shape[1]) * group
        _check_bias(types, o)
        outp = pairs(attrs["output_padding"], 2, "output_padding")
        dims = []
        for i in range(2):
            size = x.shape[2 + i]
            if not isinstance(size, int):
                raise ValueError("spatial dims must be static")
            k = int(w.shape[2 + i])
            dims.append((size - 1) * strides[i] - pads[i] - pads[2 + i] + dil[i] * (k - 1) + 1 + outp[i])
        return [TensorType(x.dtype, (x.shape[0], o, dims[0], dims[1]))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x, w = xs[0], xs[1]
        b = xs[2] if len(xs) > 2 else None
        strides, pads, dil = _conv_geometry(node.attrs)
        group = node.attrs["group"]
        n, c, h, wd = x.shape
        cg = c // group
        og = w.shape[1]
        kh, kw = w.shape[2:]
        full_h = (h - 1) * strides[0] + dil[0] * (kh - 1) + 1 + node.attrs["output_padding"][0]
        full_w = (wd - 1) * strides[1] + dil[1] * (kw - 1) + 1 + node.attrs["output_padding"][1]
        y = np.zeros((n, og * group, full_h, full_w), dtype=np.float64)
        for g in range(group):
            xg = x[:, g * cg:(g + 1) * cg].astype(np.float64)
            wg = w[g * cg:(g + 1) * cg].astype(np.float64)  # cg, og, kh, kw
            contrib = np.tensordot(xg, wg, axes=([1], [0]))  # n, h, w, og, kh, kw
            for i in range(kh):
                for j in range(kw):
                    y[:, g * og:(g + 1) * og,
                      i * dil[0]: i * dil[0] + (h - 1) * strides[0] + 1: strides[0],
                      j * dil[1]: j * dil[1] + (wd - 1) * strides[1] + 1: strides[1]] += (
                        contrib[..., i, j].transpose(0, 3, 1, 2))
        y = y[:, :, pads[0]: full_h - pads[2], pads[1]: full_w - pads[3]]
        if b is not None:
            y = y + b.reshape(1, -1, 1, 1)
        return [np.ascontiguousarray(y.astype(x.dtype))]


@register
class Dense(OpDef):
    """y = x @ w + b, x (N, K), w (K, M) (nnabla Affine layout), b (M)."""

    inputs = ("x", "w", "b?")
    roles = {"w": weight(1), "b": BIAS}
    traits = frozenset({"product"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x, w = types[0], types[1]
        if x.rank != 2 or w.rank != 2 or x.shape[1] != w.shape[0]:
            raise ValueError(f"Dense needs x (N,K) and w (K,M), got {x.shape} and {w.shape}")
        _check_bias(types, w.shape[1])
        return [TensorType(x.dtype, (x.shape[0], w.shape[1]))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        y = xs[0] @ xs[1]
        if len(xs) > 2 and xs[2] is not None:
            y = y + xs[2]
        return [y.astype(xs[0].dtype, copy=False)]


@register
class MatMul(OpDef):
    """numpy-style matmul of two tensors (batched, broadcasting).

    Frontends import a product with a constant 2-D matrix as Dense (the op with a weight role:
    per-channel weights, BN folding), so MatMul is activation x activation (attention) or a
    batched constant, whose operands quantize per tensor."""

    inputs = ("a", "b")
    traits = frozenset({"product", "quantizes_constants"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        from qcc.ir.ops._common import broadcast_shapes

        a, b = types
        if a.rank < 2 or b.rank < 2:
            raise ValueError("MatMul inputs need rank >= 2")
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"MatMul inner dims differ: {a.shape} @ {b.shape}")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return [TensorType(a.dtype, (*batch, a.shape[-2], b.shape[-1]))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.matmul(xs[0], xs[1]).astype(xs[0].dtype, copy=False)]


@register
class BatchNorm(OpDef):
    """Inference batch normalization over axis 1: (x - mean) / sqrt(var + eps) * scale + bias."""

    traits = frozenset({"inplace"})
    inputs = ("x", "scale", "bias", "mean", "var")
    attrs = {"epsilon": AttrSpec("float", 1e-5)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        if x.rank < 2:
            raise ValueError("BatchNorm input needs rank >= 2")
        for t in types[1:]:
            if tuple(t.shape) != (x.shape[1],):
                raise ValueError(f"BatchNorm parameter shape {t.shape} must be ({x.shape[1]},)")
        return [x]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x, scale, bias, mean, var = xs
        shape = (1, -1) + (1,) * (x.ndim - 2)
        inv = scale / np.sqrt(var.astype(np.float64) + node.attrs["epsilon"])
        y = x * inv.astype(x.dtype).reshape(shape)  # one multiply and one add over x: x * inv + shift
        y += (bias - mean * inv).astype(x.dtype).reshape(shape)
        return [y.astype(x.dtype, copy=False)]


_POOL_ATTRS = {
    "kernel": AttrSpec("ints"),
    "strides": AttrSpec("ints", []),
    "pads": AttrSpec("ints", [0, 0, 0, 0]),
    "ceil_mode": AttrSpec("bool", False),
}


def _pool_infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    x = types[0]
    if x.rank != 4:
        raise ValueError(f"pooling needs rank-4 input, got {x.shape}")
    k = pairs(attrs["kernel"], 2, "kernel")
    s = attr_list(attrs, "strides", 2, 1)
    p = pairs(attrs["pads"], 4, "pads")
    if k[0] <= p[0] or k[0] <= p[2] or k[1] <= p[1] or k[1] <= p[3]:
        raise ValueError(f"pads {p} must be smaller than kernel {k}")
    oh = spatial_out(x.shape[2], k[0], s[0], p[0], p[2], 1, attrs["ceil_mode"])
    ow = spatial_out(x.shape[3], k[1], s[1], p[1], p[3], 1, attrs["ceil_mode"])
    return [TensorType(x.dtype, (x.shape[0], x.shape[1], oh, ow))]


def pool_windows(x: np.ndarray, attrs: dict[str, Any], pad_value: float, out_hw: tuple[int, int]) -> np.ndarray:
    """Windows over x padded with pad_value (declared pads) and NaN (ceil-mode overhang)."""
    k = attrs["kernel"]
    s = attr_list(attrs, "strides", 2, 1)
    p = attrs["pads"]
    oh, ow = out_hw
    need_h = (oh - 1) * s[0] + k[0]
    need_w = (ow - 1) * s[1] + k[1]
    h, w = x.shape[2] + p[0] + p[2], x.shape[3] + p[1] + p[3]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])), constant_values=pad_value)
    extra_h, extra_w = max(0, need_h - h), max(0, need_w - w)
    if extra_h or extra_w:
        xp = np.pad(xp, ((0, 0), (0, 0), (0, extra_h), (0, extra_w)), constant_values=np.nan)
    return windows(xp, k, s, (1, 1))


def _pool_taps(x: np.ndarray, node: Any, pad_value: float, overhang_value: float) -> Iterator[np.ndarray]:
    """The KH*KW strided views of x padded with pad_value (declared pads) and overhang_value
    (ceil-mode cells past the padded input), one per kernel tap: a pooling is a reduction over them."""
    attrs = node.attrs
    k = attrs["kernel"]
    s = attr_list(attrs, "strides", 2, 1)
    p = attrs["pads"]
    shape = node.outputs[0].type.shape
    oh, ow = int(shape[2]), int(shape[3])
    n, c, h, w = x.shape
    ph, pw = h + p[0] + p[2], w + p[1] + p[3]
    need_h, need_w = max(ph, (oh - 1) * s[0] + k[0]), max(pw, (ow - 1) * s[1] + k[1])
    xp = x
    if any(p) or need_h > ph or need_w > pw:
        xp = np.full((n, c, need_h, need_w), overhang_value, dtype=x.dtype)
        if pad_value != overhang_value:
            xp[:, :, :ph, :pw] = pad_value
        xp[:, :, p[0]:p[0] + h, p[1]:p[1] + w] = x
    for i in range(k[0]):
        for j in range(k[1]):
            yield xp[:, :, i:i + (oh - 1) * s[0] + 1:s[0], j:j + (ow - 1) * s[1] + 1:s[1]]


def _pool_reduce(ufunc: np.ufunc, x: np.ndarray, node: Any, pad_value: float, overhang_value: float) -> np.ndarray:
    """ufunc (np.maximum, np.add) folded over the kernel taps of x (in float: pads can be -inf)."""
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    out: np.ndarray | None = None
    for tap in _pool_taps(x, node, pad_value, overhang_value):
        out = tap.copy() if out is None else ufunc(out, tap, out=out)
    assert out is not None
    return out


class _WindowPool(OpDef):
    attrs = _POOL_ATTRS

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return _pool_infer(types, attrs)


@register
class MaxPool(_WindowPool):
    """Max over KHxKW windows."""

    traits = frozenset({"keeps_annotation", "channel_pool"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [_pool_reduce(np.maximum, xs[0], node, -np.inf, -np.inf).astype(xs[0].dtype, copy=False)]


@register
class AvgPool(_WindowPool):
    """Mean over KHxKW windows; count_include_pad counts declared padding as zeros."""

    attrs = {**_POOL_ATTRS, "count_include_pad": AttrSpec("bool", False)}
    traits = frozenset({"channel_pool"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        total = _pool_reduce(np.add, xs[0], node, 0.0, 0.0)
        # divisor per output position: window cells inside the input (and declared pads if counted)
        inside = np.ones((1, 1, *xs[0].shape[2:]), dtype=total.dtype)
        total /= _pool_reduce(np.add, inside, node, 1.0 if node.attrs["count_include_pad"] else 0.0, 0.0)
        return [total.astype(xs[0].dtype, copy=False)]


class _GlobalPool(OpDef):
    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        if x.rank < 3:
            raise ValueError("global pooling needs rank >= 3")
        return [TensorType(x.dtype, (*x.shape[:2],) + (1,) * (x.rank - 2))]


@register
class GlobalAvgPool(_GlobalPool):
    """Mean over all spatial positions (keeps 1x1 spatial dims)."""

    traits = frozenset({"channel_pool"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        axes = tuple(range(2, x.ndim))
        return [x.astype(np.float64).mean(axis=axes, keepdims=True).astype(x.dtype)]


@register
class GlobalMaxPool(_GlobalPool):
    """Max over all spatial positions (keeps 1x1 spatial dims)."""

    traits = frozenset({"keeps_annotation", "channel_pool"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


@register
class LRN(OpDef):
    """Local response normalization across channels (ONNX semantics)."""

    attrs = {
        "size": AttrSpec("int"),
        "alpha": AttrSpec("float", 1e-4),
        "beta": AttrSpec("float", 0.75),
        "bias": AttrSpec("float", 1.0),
    }

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0].astype(np.float64)
        size = node.attrs["size"]
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        sq = np.pad(x * x, ((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
        csum = np.cumsum(sq, axis=1)
        csum = np.concatenate([np.zeros_like(csum[:, :1]), csum], axis=1)
        window = csum[:, size:] - csum[:, :-size]
        a, b, k = node.attrs["alpha"], node.attrs["beta"], node.attrs["bias"]
        return [(x / (k + a / size * window) ** b).astype(xs[0].dtype)]
