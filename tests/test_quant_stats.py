"""qcc.quant: streaming statistics, range choice, affine/fixed-point parameters and numerics.

Oracles: ONNX Runtime's calibrators, compute_scale_zp and QuantizeLinear/DequantizeLinear
kernels; nnabla's converter (its automatic fixed-point position rule); brute-force loops.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcc.errors import InvalidInputError, UsageError
from qcc.quant import (
    ZERO_TENSOR_RANGE,
    TensorStats,
    affine_params,
    choose_range,
    dequantize_affine,
    dequantize_fixed,
    entropy,
    fake_quant_affine,
    fixed_bounds,
    fixed_point_position,
    minmax,
    mse,
    nnabla_int_bits,
    param_fixed_point_position,
    percentile,
    qrange,
    quantize_affine,
    quantize_fixed,
    weight_affine_params,
)
from qcc.quant.histerr import expected_sq_error, kl_divergences

F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
ARRAYS = hnp.arrays(np.float32, st.integers(0, 300), elements=F32)
DTYPES = ["int8", "uint8", "int16", "uint16"]
ORT_TYPES = {"int8": 3, "uint8": 2, "int16": 5, "uint16": 4}  # onnx TensorProto codes


def _heavy_tailed(seed: int, n: int = 200_000, outliers: int = 20) -> np.ndarray:
    """Gaussian bulk with a few values 40 times larger."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, outliers)] *= 40.0
    return x


def _same(a: TensorStats, b: TensorStats) -> None:
    assert (a.count, a.zero_count, a.nan_count, a.inf_count) == (
        b.count,
        b.zero_count,
        b.nan_count,
        b.inf_count,
    )
    assert (a.min, a.max, a.log2_extent) == (b.min, b.max, b.log2_extent)
    np.testing.assert_array_equal(a.hist, b.hist)


# ---------------------------------------------------------------- statistics


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(ARRAYS, min_size=1, max_size=5), num_bins=st.sampled_from([2, 8, 64, 2048]))
def test_merge_of_parts_equals_stats_of_whole(parts: list[np.ndarray], num_bins: int) -> None:
    whole = TensorStats("t", num_bins).update(np.concatenate(parts))
    separate = [TensorStats("t", num_bins).update(p) for p in parts]
    merged = functools.reduce(TensorStats.merge, separate)
    _same(merged, whole)
    # other association order and plain sequential updates agree too
    _same(functools.reduce(lambda a, b: b.merge(a), reversed(separate)), whole)
    sequential = TensorStats("t", num_bins)
    for p in parts:
        sequential.update(p)
    _same(sequential, whole)


@settings(max_examples=100, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 300), elements=F32))
def test_bins_match_independent_binning(x: np.ndarray) -> None:
    s = TensorStats("t", 64).update(x)
    assert s.count == x.size and s.min == float(x.min()) and s.max == float(x.max())
    assert s.zero_count == int(np.count_nonzero(x == 0))
    x64 = x.astype(np.float64)
    u = np.abs(x64) / s.bin_width  # exact: division by a power of two
    neg = np.signbit(x)
    # |x| in [j*w, (j+1)*w): bin 64 + j for x >= 0, bin 63 - j for x < 0 and -0.0
    idx = np.where(neg, 63 - np.floor(u), 64 + np.floor(u)).astype(int)
    np.testing.assert_array_equal(s.hist, np.bincount(idx, minlength=128))
    assert s.absmax < 2.0**s.log2_extent and (
        s.absmax >= 2.0 ** (s.log2_extent - 1) or s.log2_extent == -100
    )


def test_memory_is_independent_of_number_of_updates() -> None:
    rng = np.random.default_rng(0)
    s = TensorStats("act", channel_axis=1)
    s.update(rng.standard_normal((4, 8, 5, 5)).astype(np.float32))
    shapes = (s.hist.shape, s.channel_min.shape if s.channel_min is not None else None)
    first = s.nbytes()
    for i in range(200):
        s.update(rng.standard_normal((4, 8, 5, 5)).astype(np.float32) * (1 + i))
    assert s.nbytes() == first
    assert (s.hist.shape, s.channel_min.shape if s.channel_min is not None else None) == shapes
    assert s.count == 201 * 4 * 8 * 25


def test_per_channel_min_max_and_round_trip() -> None:
    rng = np.random.default_rng(1)
    batches = [
        rng.standard_normal((3, 6, 4)).astype(np.float32) * np.arange(1, 7)[:, None]
        for _ in range(5)
    ]
    a = TensorStats("x", channel_axis=-2)
    b = TensorStats("x", channel_axis=-2)
    for i, x in enumerate(batches):
        (a if i < 2 else b).update(x)
    m = a.merge(b)
    allx = np.concatenate(batches)
    assert m.channel_min is not None and m.channel_max is not None
    np.testing.assert_array_equal(m.channel_min, allx.min(axis=(0, 2)))
    np.testing.assert_array_equal(m.channel_max, allx.max(axis=(0, 2)))
    back = TensorStats.from_dict(m.to_dict())
    _same(back, m)
    assert back.channel_min is not None
    np.testing.assert_array_equal(back.channel_min, m.channel_min)
    with pytest.raises(InvalidInputError, match="'x'"):
        m.update(np.zeros((2, 5, 4), np.float32))


def test_merge_refuses_incompatible_stats() -> None:
    with pytest.raises(UsageError):
        TensorStats("a").merge(TensorStats("b"))
    with pytest.raises(UsageError):
        TensorStats("a", 64).merge(TensorStats("a", 128))
    with pytest.raises(UsageError):
        TensorStats("a", 100)


# ---------------------------------------------------------------- ranges vs ONNX Runtime


class _Reader:
    def __init__(self, batches: list[np.ndarray]) -> None:
        self._it = iter([{"x": b} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _ort_ranges(
    tmp_path: Path, batches: list[np.ndarray], method: str, **extra: object
) -> tuple[float, float]:
    """Range ONNX Runtime's calibrator finds for graph input x (model y = x + 0)."""
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "zero"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(batches[0].shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(batches[0].shape))],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"{method}.onnx"
    onnx.save(model, path)
    cal = create_calibrator(
        path,
        augmented_model_path=str(tmp_path / f"{method}_aug.onnx"),
        calibrate_method=getattr(CalibrationMethod, method),
        extra_options=extra,
    )
    cal.collect_data(_Reader(batches))
    lo, hi = cal.compute_data()["x"].range_value
    return float(lo), float(hi)


def test_minmax_equals_onnxruntime_and_gives_same_params(tmp_path: Path) -> None:
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((4, 16)) * 3 + 0.5).astype(np.float32) for _ in range(6)]
    s = TensorStats("x")
    for b in batches:
        s.update(b)
    ort_lo, ort_hi = _ort_ranges(tmp_path, batches, "MinMax")
    assert minmax(s) == (min(ort_lo, 0.0), max(ort_hi, 0.0))
    zp, scale = compute_scale_zp(np.float32(ort_lo), np.float32(ort_hi), np.uint8(0), np.uint8(255))
    assert affine_params(*minmax(s), "uint8", symmetric=False) == (float(scale), int(zp))


def test_percentile_close_to_onnxruntime_and_numpy(tmp_path: Path) -> None:
    batches = [_heavy_tailed(seed, 20_000, outliers=5).reshape(100, 200) for seed in range(3)]
    s = TensorStats("x")
    for b in batches:
        s.update(b)
    allx = np.concatenate(batches)
    ort_lo, ort_hi = _ort_ranges(tmp_path, batches, "Percentile", percentile=99.9, num_bins=2048)
    lo, hi = percentile(s, 99.9)
    ort_bin = float(np.abs(allx).max()) / 2048
    assert lo == -hi and ort_lo == -ort_hi
    assert abs(hi - ort_hi) <= s.bin_width + ort_bin
    assert abs(hi - float(np.percentile(np.abs(allx), 99.9))) <= s.bin_width
    assert hi < 0.5 * s.absmax  # the outliers are clipped
    # asymmetric: between the two numpy percentiles of the tails
    lo2, hi2 = percentile(s, 99.9, symmetric=False)
    assert abs(lo2 - float(np.percentile(allx, 0.05))) <= s.bin_width
    assert abs(hi2 - float(np.percentile(allx, 99.95))) <= s.bin_width


# ---------------------------------------------------------------- entropy and MSE


def _kl_reference(hist: np.ndarray, i: int, nq: int) -> float:
    """TensorRT's calibration step for one threshold, written as loops."""
    p = hist[:i].astype(np.float64).copy()
    p[-1] += hist[i:].sum()
    q = np.zeros(i)
    for g in range(nq):
        lo, hi = g * i // nq, (g + 1) * i // nq
        nonzero = [j for j in range(lo, hi) if hist[j] > 0]
        for j in nonzero:
            q[j] = hist[lo:hi].sum() / len(nonzero)
    p, q = p / p.sum(), q / q.sum()
    if np.any((p > 0) & (q == 0)):
        return math.inf
    m = p > 0
    return float(np.sum(p[m] * np.log(p[m] / q[m])))


def test_kl_divergences_match_reference_loops() -> None:
    rng = np.random.default_rng(3)
    hist = rng.poisson(np.exp(-np.linspace(0, 6, 300)) * 500).astype(np.int64)
    hist[250] = 0
    kept = np.array([16, 17, 40, 99, 251, 252, 300])
    got = kl_divergences(hist, kept, 16)
    want = np.array([_kl_reference(hist, int(i), 16) for i in kept])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("levels", [16, 24])  # a power of two (shift) and not (floor division)
def test_kl_divergences_of_many_candidates_match_each_alone(levels: int) -> None:
    """Each candidate's KL is its own: 200 candidates scored at once give bit for bit what each
    gives alone (a vectorized form may not mix candidates), and the reference loops' values."""
    rng = np.random.default_rng(4)
    hist = rng.poisson(np.exp(-np.linspace(0, 5, 260)) * 300).astype(np.int64)
    hist[[70, 180, 181]] = 0
    kept = np.arange(levels, 260)
    got = kl_divergences(hist, kept, levels)
    alone = np.array([kl_divergences(hist, kept[k:k + 1], levels)[0] for k in range(len(kept))])
    assert len(kept) > 2 * 64 and got.tobytes() == alone.tobytes()
    picked = kept[::17]
    want = np.array([_kl_reference(hist, int(i), levels) for i in picked])
    np.testing.assert_allclose(got[::17], want, rtol=1e-9, atol=1e-12)


def test_entropy_clips_outliers_and_keeps_uniform_data() -> None:
    s = TensorStats("x").update(_heavy_tailed(4))
    lo, hi = entropy(s)
    assert lo == -hi and 2.0 < hi < 0.5 * s.absmax
    u = np.random.default_rng(5).uniform(-1, 1, 200_000).astype(np.float32)
    _, hi_u = entropy(TensorStats("u").update(u))
    assert hi_u > 0.95 * float(np.abs(u).max())


@pytest.mark.parametrize("dtype,symmetric", [("int8", True), ("uint8", False), ("int16", True)])
def test_expected_error_matches_real_quantization(dtype: str, symmetric: bool) -> None:
    x = _heavy_tailed(6)
    s = TensorStats("x").update(x)
    qmin, qmax = qrange(dtype, symmetric)
    for t in (0.3, 2.0, 5.0, s.absmax):
        scale, zp = affine_params(-t, t * 0.8, dtype, symmetric)
        real = float(np.sum((fake_quant_affine(x, scale, zp, dtype).astype(np.float64) - x) ** 2))
        model = expected_sq_error(
            s, np.array([scale]), np.array([scale * (qmax - zp)]), np.array([scale * (zp - qmin)])
        )
        assert model[0] == pytest.approx(real, rel=0.02)


def test_mse_range_is_near_the_best_real_error() -> None:
    x = _heavy_tailed(7)
    s = TensorStats("x").update(x)

    def real_error(r: tuple[float, float]) -> float:
        scale, zp = affine_params(*r, "int8", True)
        return float(np.mean((fake_quant_affine(x, scale, zp, "int8").astype(np.float64) - x) ** 2))

    best = mse(s, "int8", True)
    sweep = [real_error((-t, t)) for t in np.linspace(0.5, 1.0, 101) * s.absmax]
    sweep += [real_error(percentile(s, p)) for p in (99.9, 99.99, 99.999)]
    assert real_error(best) <= 1.01 * min(sweep)
    assert real_error(best) < 0.7 * real_error(minmax(s))


# ---------------------------------------------------------------- degenerate and bad data


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
@pytest.mark.parametrize("value", [0.0, 3.25, -0.7, 1e-35])
def test_constant_tensors_get_the_documented_range(method: str, value: float) -> None:
    s = TensorStats("c").update(np.full((50, 7), value, np.float32))
    lo, hi = choose_range(s, method)
    assert math.isfinite(lo) and math.isfinite(hi) and lo <= 0.0 <= hi and hi > lo
    if abs(float(np.float32(value))) < 2.0**-100:
        assert (lo, hi) == ZERO_TENSOR_RANGE
    else:
        c = float(np.float32(value))
        assert (lo, hi) == (min(c, 0.0), max(c, 0.0))
    scale, zp = affine_params(lo, hi, "int8", False)
    q = quantize_affine(np.full(3, value, np.float32), scale, zp, "int8")
    assert np.all(np.abs(dequantize_affine(q, scale, zp) - np.float32(value)) <= scale / 2 + 1e-30)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf_are_counted_and_refused_with_the_tensor_name(bad: float) -> None:
    x = np.arange(10, dtype=np.float32)
    x[3] = bad
    s = TensorStats("conv1/out").update(x)
    assert s.count == 9 and s.nan_count + s.inf_count == 1 and s.max == 9.0
    for method in ("minmax", "percentile", "entropy", "mse"):
        with pytest.raises(InvalidInputError, match="conv1/out"):
            choose_range(s, method)
    with pytest.raises(InvalidInputError, match="conv1/out"):
        fixed_point_position(s, 8)
    with pytest.raises(InvalidInputError, match="fc/W"):
        weight_affine_params(x, None, "int8", True, name="fc/W")
    with pytest.raises(InvalidInputError, match="fc/W"):
        param_fixed_point_position(x, 8, name="fc/W")


def test_empty_stats_and_bad_arguments_raise() -> None:
    with pytest.raises(InvalidInputError, match="'e'"):
        minmax(TensorStats("e"))
    s = TensorStats("p").update(np.ones(4, np.float32))
    with pytest.raises(UsageError):
        percentile(s, 0.0)
    with pytest.raises(UsageError):
        choose_range(s, "kl")
    with pytest.raises(UsageError):
        affine_params(-1, 1, "int3", True)


# ---------------------------------------------------------------- affine parameters vs ORT


@settings(max_examples=300, deadline=None)
@given(
    lo=st.floats(-1e6, 1e6, width=32),
    hi=st.floats(-1e6, 1e6, width=32),
    dtype=st.sampled_from(DTYPES),
    symmetric=st.booleans(),
    reduce_range=st.booleans(),
)
def test_affine_params_equal_onnxruntime(
    lo: float, hi: float, dtype: str, symmetric: bool, reduce_range: bool
) -> None:
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    lo, hi = min(lo, hi), max(lo, hi)
    qmin, qmax = get_qmin_qmax_for_qType(ORT_TYPES[dtype], reduce_range, symmetric)
    zp, scale = compute_scale_zp(np.float32(lo), np.float32(hi), qmin, qmax, symmetric)
    assert qrange(dtype, symmetric, reduce_range) == (int(qmin), int(qmax))
    assert affine_params(lo, hi, dtype, symmetric, reduce_range) == (float(scale), int(zp))


@pytest.mark.parametrize(
    "dtype,symmetric,reduce_range",
    [("int8", True, False), ("int8", True, True), ("uint8", False, False), ("int16", False, True)],
)
def test_weight_affine_params_equal_onnxruntime_per_channel(
    dtype: str, symmetric: bool, reduce_range: bool
) -> None:
    from onnxruntime.quantization.quant_utils import compute_data_quant_params

    rng = np.random.default_rng(8)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * rng.uniform(
        0.01, 5, (6, 1, 1, 1)
    ).astype(np.float32)
    w[2] = 0.0  # a dead channel: ORT's degenerate choice (scale 1, zero point 0)
    w[4] = np.abs(w[4])
    scales, zps = weight_affine_params(w, 0, dtype, symmetric, reduce_range)
    for c in range(6):
        zp, scale = compute_data_quant_params(
            w[c].ravel(), ORT_TYPES[dtype], symmetric, reduce_range
        )
        assert (scales[c], zps[c]) == (scale, zp)
    s1, z1 = weight_affine_params(w, None, dtype, symmetric, reduce_range)
    zp, scale = compute_data_quant_params(w.ravel(), ORT_TYPES[dtype], symmetric, reduce_range)
    assert (s1, z1) == (scale, zp)


# ---------------------------------------------------------------- numerics vs ORT kernels


def _ort_qdq(
    x: np.ndarray, scale: np.ndarray, zp: np.ndarray, dtype: str, axis: int | None
) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    attrs: dict[str, Any] = {} if axis is None else {"axis": axis}
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [
            helper.make_tensor_value_info("q", ORT_TYPES[dtype], list(x.shape)),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape)),
        ],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp.astype(dtype), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q, y = sess.run(None, {"x": x})
    return q, y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [None, 1])
def test_affine_numerics_equal_onnxruntime_kernels(dtype: str, axis: int | None) -> None:
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((5, 4, 33)) * 4).astype(np.float32)
    lo, hi = qrange(dtype)
    x.flat[:8] = np.float32(0.5) * np.arange(-4, 4)  # exact halves: ties to even
    if axis is None:
        scale, zp = affine_params(-3.0, 5.0, dtype, symmetric=False)
        s_arr, z_arr = np.array(scale, np.float32), np.array(zp)
    else:
        s_arr, z_arr = weight_affine_params(np.moveaxis(x, 1, 0) * 0.7, 0, dtype, symmetric=False)
        z_arr = np.clip(z_arr, lo, hi)
    q_ort, y_ort = _ort_qdq(x, s_arr, z_arr, dtype, axis)
    q = quantize_affine(x, s_arr, z_arr, dtype, axis)
    assert q.dtype == q_ort.dtype
    np.testing.assert_array_equal(q, q_ort)
    np.testing.assert_array_equal(dequantize_affine(q, s_arr, z_arr, axis), y_ort)
    np.testing.assert_array_equal(fake_quant_affine(x, s_arr, z_arr, dtype, axis), y_ort)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(DTYPES), st.booleans(),
       st.lists(st.floats(width=32, allow_nan=False), min_size=6, max_size=6),
       st.floats(2.0**-20, 1024.0, width=32), st.integers(0, 2**16))
def test_fake_quant_is_the_integer_round_trip(dtype: str, per_channel: bool, values: list[float], scale: float,
                                              seed: int) -> None:
    """The float32 fast path (no integer copies) gives the bits of quantize then dequantize: signed
    zeros, saturation at +-3.4e38 and ties included."""
    lo, hi = qrange(dtype)
    rng = np.random.default_rng(seed)
    x = np.array(values, np.float32).reshape(2, 3)
    if per_channel:
        s = (np.float32(scale) * rng.uniform(0.5, 2.0, 3)).astype(np.float32)
        z = rng.integers(lo, hi + 1, 3) if lo == 0 else np.zeros(3, np.int64)
        axis: int | None = 1
    else:
        s, z, axis = np.float32(scale), (int(rng.integers(lo, hi + 1)) if lo == 0 else 0), None
    with np.errstate(over="ignore"):  # x / s past float32's range: inf, saturated either way
        want = dequantize_affine(quantize_affine(x, s, z, dtype, axis), s, z, axis)
    got = fake_quant_affine(x, s, z, dtype, axis)
    assert got.dtype == want.dtype == np.float32 and got.tobytes() == want.tobytes()


# ---------------------------------------------------------------- fixed point


@settings(max_examples=200, deadline=None)
@given(
    x=hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(-1e5, 1e5, width=32)),
    bits=st.sampled_from([8, 16]),
    frac=st.integers(-2, 15),
)
def test_quantize_fixed_follows_nnabla_saturation_and_rounding(
    x: np.ndarray, bits: int, frac: int
) -> None:
    qmin, qmax = fixed_bounds(bits)
    assert (qmin, qmax) == ((-128, 127) if bits == 8 else (-32768, 32767))
    half_even = quantize_fixed(x, bits, frac, "half_even")
    trunc = quantize_fixed(x, bits, frac, "trunc")
    assert half_even.dtype == trunc.dtype == (np.int8 if bits == 8 else np.int16)
    for v, he, tr in zip(x.tolist(), half_even.tolist(), trunc.tolist()):
        scaled = v * 2.0**frac  # exact
        assert he == min(max(round(scaled), qmin), qmax)  # Python round: half to even
        # nnabla-c-runtime set_int8/16: >= MAX -> MAX, <= MIN -> MIN, else C cast (toward zero)
        assert tr == (qmax if scaled >= qmax else qmin if scaled <= qmin else math.trunc(scaled))
    np.testing.assert_array_equal(
        dequantize_fixed(half_even, frac), half_even.astype(np.float64) * 2.0**-frac
    )


_POW2_EDGES = [2.0**k * f for k in range(-3, 17) for f in (1.0, 1 - 2**-24, 1 + 2**-23)]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.sampled_from(_POW2_EDGES), st.floats(0, 70000, width=32)),
        min_size=1,
        max_size=20,
    ),
    signs=st.lists(st.booleans(), min_size=20, max_size=20),
    bits=st.sampled_from([8, 16]),
)
def test_nnabla_position_rule_equals_nnabla_converter(
    values: list[float], signs: list[bool], bits: int
) -> None:
    from nnabla.utils.converter.nnablart.nnb import NnbExporter

    nnabla_int_bit_num = NnbExporter._NnbExporter__compute_int_bit_num  # type: ignore[attr-defined]
    w = np.array([-v if s else v for v, s in zip(values, signs)], dtype=np.float32)
    as_converter_sees_it = np.array(w.tolist())  # protobuf floats -> float64
    int_bits = nnabla_int_bit_num(as_converter_sees_it)
    assert nnabla_int_bits(w) == int_bits
    assert param_fixed_point_position(w, bits, "nnabla") == bits - int_bits
    assert param_fixed_point_position(w, bits, "nnabla", min_frac=0, max_frac=15) == min(
        max(bits - int_bits, 0), 15
    )


def test_param_positions_mse_is_best_and_maxabs_never_saturates() -> None:
    rng = np.random.default_rng(10)
    w = (rng.standard_normal(5000) * 0.2).astype(np.float32)
    w[0] = 1.9  # one outlier

    def err(p: int, bits: int) -> float:
        back = dequantize_fixed(quantize_fixed(w, bits, p), p).astype(np.float64)
        return float(np.sum((back - w) ** 2))

    for bits in (8, 16):
        best = param_fixed_point_position(w, bits, "mse")
        assert err(best, bits) == min(err(p, bits) for p in range(-4, 30))
        safe = param_fixed_point_position(w, bits, "maxabs")
        qmin, qmax = fixed_bounds(bits)
        q = quantize_fixed(w, bits, safe)
        assert q.max() < qmax or q.min() > qmin
        assert (
            np.abs(
                quantize_fixed(w, bits, safe + 1).astype(np.float64) - w * 2.0 ** (safe + 1)
            ).max()
            > 1
        )
        assert param_fixed_point_position(w, bits, "mse", min_frac=0, max_frac=3) <= 3


@pytest.mark.parametrize("bits,rounding", [(8, "half_even"), (8, "trunc"), (16, "half_even")])
def test_activation_position_mse_matches_real_error(bits: int, rounding: str) -> None:
    x = np.maximum(_heavy_tailed(11), 0)  # ReLU output: half exact zeros
    s = TensorStats("a").update(x)

    def err(p: int) -> float:
        q = quantize_fixed(x, bits, p, rounding)
        return float(np.sum((dequantize_fixed(q, p).astype(np.float64) - x) ** 2))

    chosen = fixed_point_position(s, bits, "mse", rounding=rounding)
    assert err(chosen) <= 1.01 * min(err(p) for p in range(-6, 30))
    assert (
        fixed_point_position(s, bits, "mse", rounding=rounding, min_frac=chosen + 1, max_frac=15)
        == chosen + 1
    )
    maxabs = fixed_point_position(s, bits, "maxabs", rounding=rounding)
    assert quantize_fixed(x, bits, maxabs, rounding).max() < fixed_bounds(bits)[1]
    assert maxabs <= chosen


def test_activation_position_kl_and_zero_tensor() -> None:
    x = np.random.default_rng(12).laplace(size=200_000).astype(np.float32)
    s = TensorStats("a").update(x)
    kl = fixed_point_position(s, 8, "kl")
    hist = s.abs_hist()
    # brute force over positions: clip value 2**(7 - p) = i bins of the histogram
    scores = {}
    for p in range(-2, 12):
        i = 2.0 ** (7 - p) / s.bin_width
        if i >= 128 and i.is_integer():
            padded = np.concatenate([hist, np.zeros(max(int(i) - hist.size, 0), np.int64)])
            scores[p] = _kl_reference(padded, int(i), 128)
    assert sum(math.isfinite(v) for v in scores.values()) >= 3
    assert kl == min(scores, key=lambda p: (scores[p], p))
    with pytest.raises(UsageError):
        fixed_point_position(s, 16, "kl")
    z = TensorStats("z").update(np.zeros(100, np.float32))
    for method in ("mse", "kl", "maxabs"):
        assert fixed_point_position(z, 8, method) == 6  # as if max |x| were 1.0
    assert param_fixed_point_position(np.zeros(9, np.float32), 16, "mse", max_frac=12) == 12
