"""The fast convolution and pooling kernels (qcc.ir.ops.nn) against straightforward references.

conv2d builds patch matrices and calls BLAS, takes 1x1 convolutions as plain products and
depthwise ones as sums of shifted products; the references here compute every output as an
explicit window sum in float64 (or int64), and ONNX Runtime is the oracle for the float32 paths.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from qcc.ir.ops import nn
from qcc.ir.ops.nn import AvgPool, MaxPool, conv2d
from qcc.ir.types import TensorType
from tests.onnx_zoo import ort_run


def reference_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any],
                   dtype: Any = np.float64) -> np.ndarray:
    """Each output is the sum over its window, position by position."""
    (sh, sw), (dh, dw), group = attrs["strides"], attrs["dilations"], attrs["group"]
    p = attrs["pads"]
    xp = np.pad(x.astype(dtype), ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    n, hp, wp = xp.shape[0], xp.shape[2], xp.shape[3]
    o, cg, kh, kw = w.shape
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    og = o // group
    y = np.zeros((n, o, oh, ow), dtype=dtype)
    wd = w.astype(dtype)
    for k in range(o):
        g = k // og
        for i in range(oh):
            for j in range(ow):
                window = xp[:, g * cg:(g + 1) * cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                            j * sw:j * sw + dw * (kw - 1) + 1:dw]
                y[:, k, i, j] = (window * wd[k]).sum(axis=(1, 2, 3))
    if b is not None:
        y += b.astype(dtype).reshape(1, -1, 1, 1)
    return y


def random_conv(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]:
    """A random geometry: groups (depthwise with and without multiplier), dilation, strides, pads, 1x1."""
    kind = rng.integers(0, 4)
    group = 1 if kind == 0 else int(rng.integers(2, 5))
    cg = 1 if kind == 2 else int(rng.integers(1, 4))
    og = int(rng.integers(1, 4))
    k = (1, 1) if kind == 3 else (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
    strides = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    dil = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    pads = [int(v) for v in rng.integers(0, 3, 4)] if rng.random() < 0.7 else [0, 0, 0, 0]
    if kind == 3 and rng.random() < 0.5:
        strides, pads = [1, 1], [0, 0, 0, 0]  # the input itself is the patch matrix
    h = int(rng.integers(dil[0] * (k[0] - 1) + 1, 13))
    w = int(rng.integers(dil[1] * (k[1] - 1) + 1, 13))
    x_shape = (int(rng.integers(1, 4)), group * cg, h, w)
    w_shape = (group * og, cg, *k)
    return x_shape, w_shape, {"strides": strides, "pads": pads, "dilations": dil, "group": group}


CASES = 120


@pytest.mark.parametrize("seed", range(4))
def test_float32_conv_matches_window_sums(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(CASES // 4):
        xs, ws, attrs = random_conv(rng)
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32) if rng.random() < 0.5 else None
        y = conv2d(x, w, b, attrs)
        ref = reference_conv(x, w, b, attrs)
        assert y.dtype == np.float32 and y.flags.c_contiguous and y.shape == ref.shape, attrs
        # float32 rounding of a sum of cg*kh*kw products of standard normals
        bound = 1e-6 * (np.abs(x).max() * np.abs(w).max() * ws[1] * ws[2] * ws[3] + 1)
        assert np.abs(y - ref).max() <= bound, attrs


@pytest.mark.parametrize("seed", range(2))
def test_integer_accumulation_is_exact(seed: int) -> None:
    """The fixed-point simulator's use: int8-range data, int64 (or float64) accumulation, no rounding."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(CASES // 4):
        xs, ws, attrs = random_conv(rng)
        x = rng.integers(-128, 128, xs).astype(np.int64)
        w = rng.integers(-128, 128, ws).astype(np.int8)
        b = rng.integers(-2**20, 2**20, ws[0]).astype(np.int64)
        ref = reference_conv(x, w, b, attrs, dtype=np.int64)
        y = conv2d(x, w, b, attrs, accumulate=np.int64)
        assert y.dtype == np.int64
        np.testing.assert_array_equal(y, ref)
        yf = conv2d(x.astype(np.float32), w, None, attrs, accumulate=np.float64)
        assert yf.dtype == np.float64
        np.testing.assert_array_equal(yf, ref - b.reshape(1, -1, 1, 1))


def test_blocks_bound_memory_and_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """A patch matrix larger than the block limit is built by samples, then by output rows."""
    rng = np.random.default_rng(7)
    x = rng.integers(-50, 50, (3, 4, 17, 15)).astype(np.int64)
    w = rng.integers(-50, 50, (6, 2, 3, 3)).astype(np.int64)
    attrs = {"strides": [2, 1], "pads": [1, 2, 0, 1], "dilations": [1, 2], "group": 2}
    whole = conv2d(x, w, None, attrs, accumulate=np.int64)
    np.testing.assert_array_equal(whole, reference_conv(x, w, None, attrs, dtype=np.int64))
    per_row = 4 * 3 * 3 * whole.shape[3]  # patch-matrix elements of one output row: c*kh*kw * ow
    per_sample = per_row * whole.shape[2]
    for limit in (per_sample * 2, per_sample, per_row * 3, 1):  # 2 samples, 1 sample, 3 rows, 1 row
        monkeypatch.setattr(nn, "_BLOCK_ELEMENTS", limit)
        np.testing.assert_array_equal(conv2d(x, w, None, attrs, accumulate=np.int64), whole)



def test_depthwise_blocks_of_samples_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The depthwise sum runs a few samples at a time (cache); float32 bits do not depend on it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 6, 9, 8)).astype(np.float32)
    w = rng.standard_normal((12, 1, 3, 3)).astype(np.float32)
    attrs = {"strides": [1, 2], "pads": [1, 0, 1, 2], "dilations": [1, 1], "group": 6}
    whole = conv2d(x, w, None, attrs)
    np.testing.assert_allclose(whole, reference_conv(x, w, None, attrs), rtol=1e-5, atol=1e-5)
    per_sample = whole[0].size
    for limit in (per_sample * 2, per_sample, 1):  # 2 samples (and a last one alone), 1 sample
        monkeypatch.setattr(nn, "_DEPTHWISE_BLOCK", limit)
        assert conv2d(x, w, None, attrs).tobytes() == whole.tobytes()

def _ort_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    from onnx import TensorProto, helper, numpy_helper

    p = attrs["pads"]
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=attrs["strides"], dilations=attrs["dilations"],
                            group=attrs["group"], pads=[p[0], p[1], p[2], p[3]])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return ort_run(model.SerializeToString(), {"x": x})[0]


@pytest.mark.parametrize("name,x_shape,w_shape,attrs", [
    ("resnet-3x3", (2, 16, 14, 14), (24, 16, 3, 3), {"strides": [1, 1], "pads": [1, 1, 1, 1], "group": 1}),
    ("stem-7x7-s2", (1, 3, 32, 32), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3], "group": 1}),
    ("pointwise", (2, 32, 9, 9), (16, 32, 1, 1), {"strides": [1, 1], "pads": [0, 0, 0, 0], "group": 1}),
    ("pointwise-s2", (2, 32, 9, 9), (16, 32, 1, 1), {"strides": [2, 2], "pads": [0, 0, 0, 0], "group": 1}),
    ("depthwise", (2, 12, 11, 11), (12, 1, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 12}),
    ("depthwise-x2", (1, 6, 10, 10), (12, 1, 5, 5), {"strides": [1, 1], "pads": [2, 1, 2, 1], "group": 6}),
    ("grouped-dilated", (2, 12, 13, 13), (9, 4, 3, 3), {"strides": [1, 2], "pads": [2, 2, 2, 2], "group": 3,
                                                       "dilations": [2, 2]}),
])
def test_float32_conv_equals_onnxruntime(name: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                         attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(3)
    attrs = {"dilations": [1, 1], **attrs}
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    ref = _ort_conv(x, w, b, attrs)
    y = conv2d(x, w, b, attrs)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert np.abs(y - ref).max() <= 1e-5 * max(1.0, float(np.abs(ref).max()))


def _pool_node(x_shape: tuple[int, ...], attrs: dict[str, Any]) -> Any:
    (out,) = nn._pool_infer([TensorType("float32", x_shape)], attrs)
    return SimpleNamespace(attrs=attrs, outputs=[SimpleNamespace(type=out)])


def _window_reduce(x: np.ndarray, attrs: dict[str, Any], out_hw: tuple[int, int], reduce: str) -> np.ndarray:
    """Max / mean over each window, cell by cell: declared pads count as zeros for the mean only
    with count_include_pad; ceil-mode cells past the padded input never count."""
    k, s, p = attrs["kernel"], attrs["strides"], attrs["pads"]
    n, c, h, w = x.shape
    y = np.zeros((n, c, *out_hw))
    for i in range(out_hw[0]):
        for j in range(out_hw[1]):
            rows = [r for r in range(i * s[0] - p[0], i * s[0] - p[0] + k[0]) if r < h + p[2]]
            cols = [q for q in range(j * s[1] - p[1], j * s[1] - p[1] + k[1]) if q < w + p[3]]
            inside = x[:, :, [r for r in rows if 0 <= r < h]][:, :, :, [q for q in cols if 0 <= q < w]]
            if reduce == "max":
                y[:, :, i, j] = inside.max(axis=(2, 3))
            else:
                count = len(rows) * len(cols) if attrs["count_include_pad"] else inside.shape[2] * inside.shape[3]
                y[:, :, i, j] = inside.astype(np.float64).sum(axis=(2, 3)) / count
    return y


def test_pools_match_window_references() -> None:
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 60:
        k = [int(rng.integers(1, 5)), int(rng.integers(1, 5))]
        attrs = {"kernel": k, "strides": [int(rng.integers(1, 4)), int(rng.integers(1, 4))],
                 "pads": [int(rng.integers(0, k[0])), int(rng.integers(0, k[1])),
                          int(rng.integers(0, k[0])), int(rng.integers(0, k[1]))],
                 "ceil_mode": bool(rng.random() < 0.5), "count_include_pad": bool(rng.random() < 0.5)}
        x = (rng.standard_normal((2, 3, int(rng.integers(k[0], 11)), int(rng.integers(k[1], 11)))) - 2).astype(np.float32)
        node = _pool_node(x.shape, attrs)
        out_shape = node.outputs[0].type.shape
        out_hw = (int(out_shape[2]), int(out_shape[3]))
        (ymax,) = MaxPool.kernel(node, [x])
        (yavg,) = AvgPool.kernel(node, [x])
        assert ymax.dtype == yavg.dtype == np.float32
        np.testing.assert_array_equal(ymax, _window_reduce(x, attrs, out_hw, "max").astype(np.float32))
        np.testing.assert_allclose(yavg, _window_reduce(x, attrs, out_hw, "mean"), rtol=1e-6, atol=1e-6)
        checked += 1


@pytest.mark.parametrize("seed", range(2))
def test_narrowing_convolution_sums_taps_without_a_patch_matrix(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stride 1, O <= C/2 (DenseNet's 3x3 layers): one product of all taps' weights with the padded
    input, the taps' shifted slices summed; no im2col copy (nn._tap is never called). Each sample
    gets the bits it has alone, and the window sums hold within float32 rounding."""
    def no_patches(*args: Any) -> Any:
        raise AssertionError("im2col patch matrix built")

    monkeypatch.setattr(nn, "_tap", no_patches)
    rng = np.random.default_rng(50 + seed)
    for _ in range(12):
        kh, kw = int(rng.integers(1, 5)), int(rng.integers(2, 5))
        dil = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
        pads = [int(v) for v in rng.integers(0, 3, 4)]
        o = int(rng.integers(1, 5))
        c = 2 * o + int(rng.integers(0, 6))
        h, w_ = int(rng.integers(dil[0] * (kh - 1) + 1, 12)), int(rng.integers(dil[1] * (kw - 1) + 1, 12))
        attrs = {"strides": [1, 1], "pads": pads, "dilations": dil, "group": 1}
        x = rng.standard_normal((3, c, h, w_)).astype(np.float32)
        w = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        y = conv2d(x, w, b, attrs)
        ref = reference_conv(x, w, b, attrs)
        assert y.dtype == np.float32 and y.flags.c_contiguous and y.shape == ref.shape, attrs
        bound = 1e-6 * (np.abs(x).max() * np.abs(w).max() * c * kh * kw + 1)
        assert np.abs(y - ref).max() <= bound, attrs
        for k in range(3):
            assert conv2d(x[k:k + 1], w, b, attrs).tobytes() == y[k:k + 1].tobytes(), attrs
