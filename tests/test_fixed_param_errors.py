"""A parameter's fixed-point position errors (qcc.quant.fixedpoint._param_errors) are the bits of
the formula sum((ldexp(quantize_fixed(w, p), -p) - w)**2) for every candidate: the position
chosen (and so every written .nnb/.c byte) cannot move."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcc.quant.fixedpoint import (
    _candidates,
    _param_error,
    _param_errors,
    param_fixed_point_position,
)

FINITE32 = st.floats(-(2.0 ** 100), 2.0 ** 100, allow_nan=False, width=32)


def _check(w: np.ndarray, bits: int, rounding: str) -> None:
    absmax = max(-float(w.min()), float(w.max()))
    if absmax < 2.0 ** -100:
        return
    cands = list(range(-3, 20)) + _candidates(absmax, bits, None, None)
    fast = _param_errors(w, bits, cands, rounding, absmax)
    slow = [_param_error(w, bits, p, rounding) for p in cands]
    assert fast == slow


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=4, max_side=7), elements=FINITE32),
       st.sampled_from([4, 8, 16]), st.sampled_from(["half_even", "trunc"]))
@example(np.array([2.0 ** 25, 4.7116195e-39], np.float32), 4, "half_even")  # a subnormal scaled down
@example(np.array([3e38, -1e-3], np.float32), 8, "trunc")  # w * 2**p overflows float32
def test_position_errors_are_the_formulas_bits(w: np.ndarray, bits: int, rounding: str) -> None:
    _check(w, bits, rounding)


def test_position_errors_on_weights_ties_bounds_and_layouts() -> None:
    rng = np.random.default_rng(11)
    for bits in (4, 8, 16, 32):
        for rounding in ("half_even", "trunc"):
            w = (rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(np.float32)
            w.reshape(-1)[:40] = np.arange(-20, 20) * np.float32(2.0 ** -7)  # halves at position 6
            _check(w, bits, rounding)
            for edge in (127.5, -128.5, 126.5, -127.5, 32767.5, -32768.5):  # rounds to a bound, or past it
                e = w.copy()
                e.reshape(-1)[40] = np.float32(edge * 2.0 ** -6)
                _check(e, bits, rounding)
            _check(w.astype(np.float64) * 1.000001, bits, rounding)  # float64 weights: float64 work
            _check(w.transpose(1, 0, 2, 3), bits, rounding)  # not C order: the formula itself
            assert param_fixed_point_position(w, bits, rounding=rounding, min_frac=0, max_frac=15) == \
                param_fixed_point_position(w.copy(order="F"), bits, rounding=rounding, min_frac=0, max_frac=15)
