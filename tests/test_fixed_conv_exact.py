"""qcc.sim.fixed's convolution is nnabla-c-runtime's, bit for bit, on every path it takes.

The kernel runs in float32 when every partial sum and running total stays below 2**24, in
float64 below 2**53, else in int64 (`exact_float` decides), on cache-sized blocks of rows and, for
one input channel per group (depthwise), as a sum over taps. The oracle here is the runtime's
definition written out in Python integers: per output, per input channel in increasing order, the
taps' exact sum truncated toward zero by 2**(fx+fw-fy) (or scaled up), added to the running total
with saturation, then the bias with the runtime's saturating add.
"""

from __future__ import annotations

import numpy as np
import pytest

import qcc.sim.fixed as fixed
from qcc.ir.core import Graph, Node
from qcc.ir.types import FixedPoint, TensorType
from qcc.quant.numerics import fixed_bounds


def runtime_conv(x: np.ndarray, w: np.ndarray, n: int, bits: int, node: Node) -> np.ndarray:
    """The runtime's loop, output by output, in Python integers (no bias)."""
    strides, pads, dil, group = (node.attrs[k] for k in ("strides", "pads", "dilations", "group"))
    lo, hi = fixed_bounds(bits)
    batch, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3]))).tolist()
    oh = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    wl = w.tolist()
    y = np.zeros((batch, o, oh, ow), dtype=np.int64)
    for b in range(batch):
        for oc in range(o):
            g = oc // (o // group)
            for r in range(oh):
                for c in range(ow):
                    total = 0
                    for ic in range(cg):
                        plane = xp[b][g * cg + ic]
                        part = sum(plane[r * strides[0] + i * dil[0]][c * strides[1] + j * dil[1]] * wl[oc][ic][i][j]
                                   for i in range(kh) for j in range(kw))
                        step = (abs(part) >> n if part >= 0 else -(abs(part) >> n)) if n >= 0 else part << -n
                        total = min(hi, max(lo, total + step))
                    y[b, oc, r, c] = total
    return y


def conv_layer(rng: np.random.Generator, bits: int, depthwise: bool) -> tuple[Node, list[np.ndarray], int]:
    group = int(rng.integers(2, 6)) if depthwise else int(rng.choice([1, 1, 2]))
    cg = 1 if depthwise else int(rng.integers(2, 12))
    og = int(rng.integers(1, 3)) if depthwise else int(rng.integers(1, 6))
    k, size, batch = int(rng.choice([1, 2, 3])), int(rng.integers(3, 7)), int(rng.integers(1, 3))
    graph = Graph("conv")
    x = graph.add_input("x", TensorType("float32", (batch, cg * group, size, size)))
    w = graph.add_constant("w", np.zeros((og * group, cg, k, k), np.float32))
    y = graph.add("Conv", x, w, name="conv", group=group, pads=[int(p) for p in rng.integers(0, 2, 4)],
                  strides=[int(rng.choice([1, 2]))] * 2, dilations=[1 if k == 1 or size < 5 else int(rng.choice([1, 2]))] * 2)
    fx, fw, fy = int(rng.integers(0, 10)), int(rng.integers(0, 12)), int(rng.integers(-3, 12))
    if rng.random() < 0.15:  # a finer output than the product: an exact up-shift
        fy = fx + fw + int(rng.integers(1, 4))
    x.quant, w.quant, y.quant = FixedPoint(bits, fx, "trunc"), FixedPoint(bits, fw), FixedPoint(bits, fy, "trunc")
    lo, hi = fixed_bounds(bits)
    scale = hi * float(rng.choice([1.0, 0.2, 0.02]))
    xi = np.clip(np.round(rng.standard_normal(x.type.shape) * scale), lo, hi).astype(np.int64)
    if rng.random() < 0.25:  # extremes only: the running total saturates, both ways
        xi = rng.choice([lo, hi], x.type.shape).astype(np.int64)
    wi = np.clip(np.round(rng.standard_normal(w.const.shape) * hi * 0.5), lo, hi).astype(np.int64)
    return graph.nodes[0], [xi, wi], fx + fw - fy


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_kernel_is_the_runtime_loop(bits: int, depthwise: bool) -> None:
    rng = np.random.default_rng(bits + depthwise)
    for _ in range(12):
        node, args, n = conv_layer(rng, bits, depthwise)
        got = fixed.conv_kernel(node, args)[0]
        assert got.dtype == np.int64
        assert np.array_equal(got, runtime_conv(*args, n, bits, node)), (node.attrs, n)


def test_every_path_gives_the_same_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32, float64 and int64 agree, and blocks of any size give the same result."""
    rng = np.random.default_rng(7)
    layers = [conv_layer(rng, 8, d) for d in (False, True, False)]
    expected = [fixed.conv_kernel(node, args)[0] for node, args, _ in layers]
    monkeypatch.setattr(fixed, "TILE", 5)
    monkeypatch.setattr(fixed, "COLUMNS", 7)
    for (node, args, _), want in zip(layers, expected):
        assert np.array_equal(fixed.conv_kernel(node, args)[0], want)
    for dtype in (np.float64, None):
        monkeypatch.setattr(fixed, "exact_float", lambda *_, d=dtype: d)
        for (node, args, _), want in zip(layers, expected):
            assert np.array_equal(fixed.conv_kernel(node, args)[0], want)


@pytest.mark.parametrize("k", [1, 3])
def test_a_batch_in_several_chunks_with_short_last_blocks(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One image per chunk of columns and 25 output rows an image in blocks of 10: each chunk's
    last block is short, and the next chunk's rows follow it (a batch of 64 96x96 images in
    torchvision's mobilenet_v2 once failed here: the block's rows ran into the next image's)."""
    rng = np.random.default_rng(k)
    graph = Graph("chunks")
    x = graph.add_input("x", TensorType("float32", (3, 4, 5, 5)))
    w = graph.add_constant("w", np.zeros((6, 4, k, k), np.float32))
    y = graph.add("Conv", x, w, name="conv", group=1, pads=[k // 2] * 4, strides=[1, 1], dilations=[1, 1])
    x.quant, w.quant, y.quant = FixedPoint(8, 6, "trunc"), FixedPoint(8, 7), FixedPoint(8, 5, "trunc")
    xi = rng.integers(-128, 128, x.type.shape)
    wi = rng.integers(-128, 128, w.const.shape)
    monkeypatch.setattr(fixed, "TILE", 60)  # 10 rows a block for 6 outputs
    monkeypatch.setattr(fixed, "COLUMNS", 100)  # one image a chunk
    got = fixed.conv_kernel(graph.nodes[0], [xi, wi])[0]
    assert np.array_equal(got, runtime_conv(xi, wi, 6 + 7 - 5, 8, graph.nodes[0]))


def pointwise_layer(rng: np.random.Generator, bits: int, n: int, cg: int, og: int) -> tuple[Node, list[np.ndarray]]:
    """A 1x1 layer truncating by 2**n (n < 0: scaling up) on inputs of both signs, zeros and the
    type's extremes (the running total saturates both ways), weights including 0 and MIN."""
    graph = Graph("pointwise")
    x = graph.add_input("x", TensorType("float32", (2, cg, 3, 4)))
    w = graph.add_constant("w", np.zeros((og, cg, 1, 1), np.float32))
    y = graph.add("Conv", x, w, name="conv", group=1, pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1])
    fx = max(n, 0) + 2
    x.quant, w.quant, y.quant = FixedPoint(bits, fx, "trunc"), FixedPoint(bits, 0), FixedPoint(bits, fx - n, "trunc")
    lo, hi = fixed_bounds(bits)
    xi = rng.integers(lo, hi + 1, x.type.shape)
    xi[0, :, 0] = rng.choice([lo, hi, 0, -1, 1], (cg, 4))
    wi = rng.integers(lo, hi + 1, w.const.shape)
    wi[:, 0] = rng.choice([lo, hi, 0, -1, 1], (og, 1, 1))
    return graph.nodes[0], [xi, wi]


@pytest.mark.parametrize("bits", [8, 16])
def test_pointwise_rounding_path_is_the_runtime_loop(bits: int) -> None:
    """1x1 layers truncate by rounding (`rounding_constant`: an offset toward zero and a float
    total kept in the range where its step is 1): every shift, signs, zeros and saturation."""
    rng = np.random.default_rng(bits * 3)
    mantissa = 24 if bits == 8 else 53
    taken = 0
    for n in range(-3, 2 * bits + 2):
        node, args = pointwise_layer(rng, bits, n, int(rng.integers(2, 9)), int(rng.integers(1, 6)))
        partial = (1 << (bits - 1)) ** 2  # |x * w| at most
        dtype = fixed.exact_float(*args, n, bits)
        taken += dtype is not None and fixed.rounding_constant(partial, n, bits, dtype) is not None
        assert np.array_equal(fixed.conv_kernel(node, args)[0], runtime_conv(*args, n, bits, node)), n
    assert taken >= 2 * bits - 2  # the rounding path ran at (almost) every shift
    assert fixed.rounding_constant(1 << (mantissa - 2), 1, bits, np.float64 if bits == 16 else np.float32) is None


def test_exact_float_follows_the_bounds() -> None:
    x8, w8 = np.full((1, 4, 3, 3), 127), np.full((2, 4, 3, 3), -128)
    assert fixed.exact_float(x8, w8, 7, 8) is np.float32  # 127 * 128 * 9 < 2**24
    x16, w16 = np.full((1, 4, 3, 3), 32767), np.full((2, 4, 3, 3), -32768)
    assert fixed.exact_float(x16, w16, 15, 16) is np.float64  # 2**30 * 9: not float32
    assert fixed.exact_float(x8, w8, -20, 8) is np.float64  # the up-shifted sum passes 2**24
    assert fixed.exact_float(x8, w8, 61, 8) is None  # a scaling float32/64 may not hold: int64


def test_conv_bias_and_saturating_add() -> None:
    """The bias goes through the runtime's saturating add, MIN + MIN = 0 quirk included."""
    lo, hi = fixed_bounds(8)
    assert fixed.sat_add(np.array([lo, hi, 100, -100, 3]), np.array([lo, hi, 100, -100, 4]), 8).tolist() == \
        [0, hi, hi, lo, 7]
    graph = Graph("conv")
    x = graph.add_input("x", TensorType("float32", (1, 2, 2, 2)))
    w = graph.add_constant("w", np.zeros((2, 2, 1, 1), np.float32))
    b = graph.add_constant("b", np.zeros(2, np.float32))
    y = graph.add("Conv", x, w, b, name="conv")
    x.quant, w.quant, y.quant, b.quant = (FixedPoint(8, 0, "trunc"), FixedPoint(8, 0), FixedPoint(8, 0, "trunc"),
                                          FixedPoint(8, 0))
    xi = np.array([[[[lo, lo], [1, 0]], [[0, 0], [0, 0]]]])
    got = fixed.conv_kernel(graph.nodes[0], [xi, np.array([[[[1]], [[0]]], [[[-1]], [[0]]]]), np.array([lo, 5])])[0]
    assert got[0, 0].tolist() == [[0, 0], [lo + 1, lo]]  # lo + lo wraps to 0, as the runtime's sum_sat8
    assert got[0, 1].tolist() == [[hi, hi], [4, 5]]


@pytest.mark.parametrize("bits", [8, 16])
def test_the_bias_add_is_the_runtimes_saturating_add(bits: int) -> None:
    """add_bias (a clip unless the bias holds MIN) gives sat_add's values for every sum and bias
    inside the type: saturation both ways, MIN + MIN's wrap to 0 included."""
    lo, hi = fixed_bounds(bits)
    rng = np.random.default_rng(bits)
    total = np.concatenate([rng.integers(lo, hi + 1, (3, 4, 5)), np.full((1, 4, 5), lo), np.full((1, 4, 5), hi)])
    for bias in (rng.integers(lo + 1, hi + 1, 4), np.array([lo, hi, -1, 1]), np.array([lo + 1, hi, 0, -hi])):
        view = bias.reshape(1, -1, 1)
        got = fixed.add_bias(total, view, bits)
        assert got.dtype == np.int64 and np.array_equal(got, fixed.sat_add(total, view, bits))
        assert got.min() >= lo and got.max() <= hi


def test_depthwise_blocks_of_samples_and_groups_give_the_runtime_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The depthwise sum over taps on blocks of `TILE` outputs: one group, several groups, one
    sample and several samples per block (partial last blocks included), float32 and float64."""
    rng = np.random.default_rng(18)
    for trial in range(10):
        bits = 8 if trial % 2 else 16
        node, args, n = conv_layer(rng, bits, True)
        args[0] = np.concatenate([args[0]] * 3)  # 3-6 samples: blocks of several samples
        want = runtime_conv(*args, n, bits, node)
        per_group = int(np.prod(want.shape[2:])) * (args[1].shape[0] // node.attrs["group"])
        per_sample = per_group * node.attrs["group"]
        for tile in (1, per_group, 2 * per_group + 1, per_sample, 2 * per_sample + 1, 1 << 16):
            monkeypatch.setattr(fixed, "TILE", tile)
            for dtype in (np.float32, np.float64) if bits == 8 else (np.float64,):  # exact types only
                monkeypatch.setattr(fixed, "exact_float", lambda *_, d=dtype: d)
                got = fixed.conv_kernel(node, args)[0]
                assert got.dtype == np.int64 and got.flags.c_contiguous and np.array_equal(got, want), (tile, dtype)
