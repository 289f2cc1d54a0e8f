"""qcc.quant.numerics.clamp is np.clip bit for bit (it compares rows against a cached bound row:
numpy's scalar comparison loops are slower), for Clip, Relu and fake quantization."""

from __future__ import annotations

import numpy as np
import pytest

from qcc.ir.core import Graph
from qcc.ir.registry import get_schema
from qcc.ir.types import TensorType
from qcc.quant import numerics
from qcc.quant.numerics import clamp, fake_quant_affine

SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 6.0, -128.0, 127.0, 127.49, -128.5]


def sample(rng: np.random.Generator, size: int, dtype: type) -> np.ndarray:
    x: np.ndarray = (rng.standard_normal(size) * 100).astype(dtype)
    x[rng.integers(0, size, min(size, 64))] = rng.choice(np.array(SPECIALS, dtype), min(size, 64))
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [5, numerics._ROW - 1, 3 * numerics._ROW, 3 * numerics._ROW + 17])
def test_clamp_is_np_clip_bit_for_bit(dtype: type, size: int) -> None:
    rng = np.random.default_rng(size)
    x = sample(rng, size, dtype).reshape(-1, 1) if size % 2 else sample(rng, size, dtype)
    for lo, hi in ((0.0, 6.0), (-128.0, 127.0), (0.0, None), (None, 6.0), (-0.0, None), (None, None)):
        want = x.copy()
        if lo is not None:
            want = np.maximum(want, dtype(lo))
        if hi is not None:
            want = np.minimum(want, dtype(hi))
        if lo is not None and hi is not None:
            assert np.clip(x, lo, hi).tobytes() == want.tobytes()
        got = clamp(x, lo, hi)
        assert got.dtype == x.dtype and got.shape == x.shape and got is not x
        assert got.tobytes() == want.tobytes(), (lo, hi)
        inplace = x.copy()
        assert clamp(inplace, lo, hi, out=inplace) is inplace
        assert inplace.tobytes() == want.tobytes()


def test_clamp_of_a_strided_view_takes_numpys_path() -> None:
    x = sample(np.random.default_rng(1), 4 * numerics._ROW, np.float32).reshape(4, -1)[:, ::2]
    assert not x.flags.c_contiguous
    assert clamp(x, -1.0, 1.0).tobytes() == np.clip(x, -1.0, 1.0).tobytes()


@pytest.mark.parametrize("op, attrs, lo, hi", [("Relu", {}, 0.0, None), ("Clip", {"min": 0.0, "max": 6.0}, 0.0, 6.0),
                                             ("Clip", {"min": None, "max": 1.5}, None, 1.5)])
def test_clamp_kernels_keep_their_values(op: str, attrs: dict[str, float | None], lo: float | None,
                                         hi: float | None) -> None:
    x = sample(np.random.default_rng(2), 2 * 3 * (numerics._ROW + 5), np.float32).reshape(2, 3, -1)
    graph = Graph("g")
    v = graph.add_input("x", TensorType("float32", x.shape))
    graph.add(op, v, name="n", **attrs)
    (got,) = get_schema(op).kernel(graph.nodes[0], [x])
    want = x
    if lo is not None:
        want = np.maximum(want, np.float32(lo))
    if hi is not None:
        want = np.minimum(want, np.float32(hi))
    assert got.tobytes() == want.tobytes() and got.dtype == np.float32


def test_fake_quantization_clamps_as_before() -> None:
    x = sample(np.random.default_rng(3), 5 * numerics._ROW + 3, np.float32) / 10
    q = np.rint(np.divide(x, np.float32(0.05))) + np.float32(3)
    want = (np.clip(q, -128, 127) - np.float32(3)) * np.float32(0.05)
    assert fake_quant_affine(x, 0.05, 3, "int8").tobytes() == want.tobytes()
