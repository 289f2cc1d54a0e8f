"""qcc.sim.fixed's integer Clip gives the runtime's float32 Clip (getter, clamp, setter) bit for bit.

nnabla-c-runtime runs Clip (ReLU6) generically: each stored integer read as float32, clamped to
the float32 bounds, stored again by truncation toward zero with saturation. `clip_kernel`
computes that on the integers; the oracle is `clip_f32`, the float32 path itself, on every
integer of the type, positions that shift both ways, bounds on and off the grid, one-sided and
crossed bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

import qcc.sim.fixed as fixed
from qcc.ir.core import Graph
from qcc.ir.types import FixedPoint, TensorType
from qcc.quant.numerics import fixed_bounds

BOUNDS = [(0.0, 6.0), (None, 6.0), (-1.5, None), (0.1, 0.7), (-3.3, 2.2), (2.0, -1.0), (0.0, 1e30), (-1e-9, 1e-9)]


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("bounds", BOUNDS)
def test_integer_clip_is_the_float32_path(bits: int, bounds: tuple[float | None, float | None]) -> None:
    lo, hi = fixed_bounds(bits)
    q = np.arange(lo, hi + 1, dtype=np.int64).reshape(1, 1, -1)
    for fx, fy in [(4, 4), (7, 2), (2, 7), (0, 12), (13, 0), (-3, 2), (5, -2), (bits - 1, bits - 1)]:
        graph = Graph("clip")
        x = graph.add_input("x", TensorType("float32", q.shape))
        y = graph.add("Clip", x, name="clip", min=bounds[0], max=bounds[1])
        x.quant, y.quant = FixedPoint(bits, fx, "trunc"), FixedPoint(bits, fy, "trunc")
        node = graph.nodes[0]
        got = fixed.clip_kernel(node, [q])[0]
        want = fixed.clip_f32(node, [q])[0]
        assert got.dtype == np.int64 and np.array_equal(got, want), (fx, fy)


def test_one_clip_is_saturate_then_clip_with_its_layout() -> None:
    """`clip_saturated` (one pass) against np.clip(saturate(a), lo, hi): the same values, dtype
    and memory layout (C order where saturate copies, the input's where it clips), on channel-last
    views (what the 1x1 integer convolution returns), other strides, in and out of range."""
    rng = np.random.default_rng(6)
    for bits in (8, 16):
        bottom, top = fixed_bounds(bits)
        for trial in range(40):
            spread = (top + 1) * (3 if trial % 3 == 0 else 1) - 1
            base = rng.integers(-spread - 1, spread + 1, size=(3, 5, 7, 4), dtype=np.int64)
            for a in (base, base.transpose(0, 3, 1, 2), base[:, ::2], base[:0]):
                lo = int(rng.integers(bottom, top))
                hi = int(rng.integers(lo, top + 1))
                want = np.clip(fixed.saturate(a, bits), lo, hi)
                got = fixed.clip_saturated(a, bottom, top, lo, hi)
                assert got.dtype == want.dtype and got.strides == want.strides and np.array_equal(got, want)
                assert not np.shares_memory(got, a)
