"""Ranges chosen per tensor by the error they cause (issue 18, item 4): `mse` and `auto`.

Oracles: the histogram error model itself (qcc.quant.histerr, checked against real quantization
in test_quant_stats.py), and onnxruntime's quantize_static on the heavy-tailed CNN.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qcc.driver import compile as qcc_compile
from qcc.quant import ranges
from qcc.quant.histerr import approx_sq_error
from qcc.quant.ranges import PERCENTILES, _range_errors, auto, minmax, mse, percentile
from qcc.quant.stats import TensorStats
from tests import ort_quant
from tests.ptq_models import NetFiles

QUANTIZERS = [("int8", True), ("uint8", False), ("int8", False)]


def _sample(seed: int, bulk: float, outliers: int, scale: float, one_sided: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(20_000) * bulk
    if outliers:
        x[rng.choice(x.size, outliers, replace=False)] = rng.uniform(-1, 1, outliers) * scale * bulk
    return (np.abs(x) if one_sided else x).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), bulk=st.floats(1e-3, 1e3), outliers=st.integers(0, 40),
       scale=st.floats(2.0, 5000.0), one_sided=st.booleans(), quantizer=st.sampled_from(QUANTIZERS))
def test_mse_is_never_worse_than_minmax_or_percentile(seed: int, bulk: float, outliers: int, scale: float,
                                                      one_sided: bool, quantizer: tuple[str, bool]) -> None:
    stats = TensorStats("t").update(_sample(seed, bulk, outliers, scale, one_sided))
    dtype, symmetric = quantizer
    rivals = [minmax(stats)] + [percentile(stats, p) for p in PERCENTILES]
    if not symmetric:
        rivals += [percentile(stats, p, symmetric=False) for p in PERCENTILES]
    best = mse(stats, dtype, symmetric)
    errors = _range_errors(stats, [best, *rivals], dtype, symmetric, False)
    assert errors[0] <= errors[1:].min() * (1 + 1e-12)
    chosen, _ = auto(stats, dtype, symmetric)
    assert _range_errors(stats, [chosen], dtype, symmetric, False)[0] <= errors[1] * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), bulk=st.floats(1e-6, 1e3), outliers=st.integers(0, 40),
       scale=st.floats(2.0, 5000.0), one_sided=st.booleans(), quantizer=st.sampled_from(QUANTIZERS),
       reduce_range=st.booleans())
def test_auto_screens_all_candidates_at_once_with_the_same_errors(
        seed: int, bulk: float, outliers: int, scale: float, one_sided: bool, quantizer: tuple[str, bool],
        reduce_range: bool) -> None:
    """auto's screening builds its ~190 candidate ranges as arrays (a tenth of method auto's time on
    torchvision mobilenet_v2): the grids and errors of the ranges built one by one, bit for bit."""
    stats = TensorStats("t").update(_sample(seed, bulk, outliers, scale, one_sided))
    dtype, symmetric = quantizer
    full = minmax(stats)
    if symmetric:
        t = ranges._grid_points(stats.absmax)
        one_by_one = [ranges._clip_symmetric(stats, float(x)) for x in t]
        lo, hi = np.maximum(-t, stats.min), np.minimum(t, stats.max)
    else:
        a = ranges._grid_points(1.0)
        one_by_one = [ranges._finish(stats, stats.min * float(x), stats.max * float(x)) for x in a]
        lo, hi = stats.min * a, stats.max * a
    lo, hi = ranges._finish_all(stats, np.concatenate([[full[0]], lo]), np.concatenate([[full[1]], hi]))
    expected = ranges._grids(stats, [full, *one_by_one], dtype, symmetric, reduce_range)
    got = ranges._range_grids(stats, lo, hi, dtype, symmetric, reduce_range)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(expected, got))
    assert approx_sq_error(stats, *expected).tobytes() == approx_sq_error(stats, *got).tobytes()


def test_mse_is_not_worse_than_the_linear_search_it_replaces() -> None:
    """Scale mixtures of normals (heavy tails): the least error is found, not approximated."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal(20_000) * np.exp(2.0 * rng.standard_normal(20_000))).astype(np.float32)
        stats = TensorStats("t").update(x)
        linear = [(max(-a * stats.absmax, stats.min), min(a * stats.absmax, stats.max))
                  for a in np.arange(1, 129) / 128]
        errors = _range_errors(stats, [mse(stats, "int8", True), *linear], "int8", True, False)
        assert errors[0] <= errors[1:].min() * (1 + 1e-9)


def test_uint8_on_signed_data_gets_an_asymmetric_range() -> None:
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.exponential(1.0, 20_000), -rng.exponential(0.05, 20_000)]).astype(np.float32)
    stats = TensorStats("t").update(x)
    lo, hi = mse(stats, "uint8", False)
    assert -lo < 0.2 * hi  # the short negative side gets only what it needs
    sym = (max(lo, -hi), -max(lo, -hi))
    assert _range_errors(stats, [(lo, hi)], "uint8", False, False)[0] < \
        _range_errors(stats, [(-hi, hi), sym], "uint8", False, False).min()


def test_heavy_tailed_default_int8_beats_every_quantize_static_config(
        heavy_tailed_files: NetFiles, tmp_path: Path) -> None:
    files = heavy_tailed_files
    feeds = {"x": files.x}
    ref = ort_quant.run(files.model, feeds)
    report_path = tmp_path / "r.json"
    out = tmp_path / "qcc.onnx"
    qcc_compile(str(files.model), out, target="onnx-qdq", quantize="int8", calib=str(files.calib),
                report=str(report_path))
    ours = ort_quant.sqnr_db(ort_quant.run(out, feeds, optimize=False), ref)
    calib = dict(np.load(files.calib))
    theirs = {}
    for method in ort_quant.ORT_METHODS:
        for per_channel in (True, False):
            path = tmp_path / f"ort_{method}_{per_channel}.onnx"
            ort_quant.quantize_static(files.model, path, calib, method, per_channel)
            theirs[(method, per_channel)] = ort_quant.sqnr_db(ort_quant.run(path, feeds, optimize=False), ref)
    assert ours >= max(theirs.values()), (ours, theirs)
    tensors = [t for t in json.loads(report_path.read_text())["tensors"] if t["kind"] == "activation"]
    assert all(t["chosen"] in ("minmax", "mse") for t in tensors)  # named per tensor


def test_auto_clips_only_where_it_pays_a_lot() -> None:
    """Two extreme outliers among 400k values: clipping them halves the error of an int8 grid that
    stores the tensor at 19 dB; the same tensor in int16 is stored at 67 dB, nothing to gain."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(400_000).astype(np.float32)
    x[rng.choice(x.size, 2, replace=False)] = [45.0, 58.0]
    stats = TensorStats("t").update(x)
    (lo, hi), choice = auto(stats, "int8", True)
    assert choice == "mse" and -45.0 < lo < 0.0 < hi < 45.0
    assert auto(stats, "int16", True) == (minmax(stats), "minmax")
    bulk = TensorStats("b").update(rng.standard_normal(400_000).astype(np.float32))
    assert auto(bulk, "int8", True)[1] == "minmax"  # a Gaussian's optimum clips a little: not worth it


@pytest.mark.parametrize("scheme", ["int8", "fixed8"])
def test_auto_is_the_default_method(scheme: str, tmp_path: Path) -> None:
    from tests.cli_util import DIGITS

    _, report = qcc_compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / "d.onnx", target="onnx-qdq",
                            quantize=scheme, calib=str(DIGITS / "calib.npz"))
    acts = [t for t in report["tensors"] if t["kind"] == "activation" and "method" in t]
    assert acts and all(t["method"] == "auto" and t["chosen"] in ("minmax", "mse") for t in acts)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), bulk=st.floats(1e-6, 1e3), outliers=st.integers(0, 40),
       scale=st.floats(2.0, 5000.0), one_sided=st.booleans(), quantizer=st.sampled_from(QUANTIZERS))
def test_auto_screening_shortcuts_change_nothing(seed: int, bulk: float, outliers: int, scale: float,
                                                 one_sided: bool, quantizer: tuple[str, bool]) -> None:
    """auto's screening takes the grid unsorted with its repeats (only the least error counts) and
    approx_sq_error skips a sign without values: the same decision, the same error bits as the
    sorted grid and both signs summed."""
    from qcc.quant import histerr

    stats = TensorStats("t").update(_sample(seed, bulk, outliers, scale, one_sided))
    dtype, symmetric = quantizer
    pay = ranges._clipping_may_pay(stats, dtype, symmetric, False)
    original = ranges._screening_points
    try:
        ranges._screening_points = ranges._grid_points  # type: ignore[assignment]
        assert ranges._clipping_may_pay(stats, dtype, symmetric, False) == pay
    finally:
        ranges._screening_points = original  # type: ignore[assignment]
    steps, pos, neg = ranges._range_grids(stats, *ranges._finish_all(
        stats, stats.min * ranges._grid_points(1.0), stats.max * ranges._grid_points(1.0)), dtype, symmetric, False)
    p, n, edges = histerr._signed_counts(stats)
    w = stats.bin_width
    mid = edges[:-1] + 0.5 * w
    second = mid * mid + w * w / 12.0
    both = np.zeros(steps.shape)
    for counts, bound in ((p, pos), (n, neg)):
        both += histerr._side_error(counts, bound, steps, mid, second, w)
    assert approx_sq_error(stats, steps, pos, neg).tobytes() == both.tobytes()
    if one_sided:  # the skipped side would have added +0.0 everywhere
        skipped = histerr._side_error(n, neg, steps, mid, second, w)
        assert not skipped.any() and not np.signbit(skipped).any()


def test_histogram_errors_do_not_depend_on_the_blas_thread_count() -> None:
    """Candidate errors decide the ranges and positions written: OpenBLAS's dgemv gave other last bits
    at 2 threads than at 1 on 300 candidates x 2048 bins (assign-fixed-point's search), so the bytes
    followed the machine's core count."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from qcc.quant.histerr import expected_sq_error, signal_power

    rng = np.random.default_rng(7)
    stats = TensorStats("t").update(np.concatenate([rng.standard_normal(200_000), 40 * rng.standard_normal(50)]).astype(np.float32))
    step = np.geomspace(1e-4, 1.0, 300)
    results = []
    for threads in (1, 2, 4):
        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
            results.append((expected_sq_error(stats, step, 127 * step, 128 * step), signal_power(stats)))
    for errors, power in results[1:]:
        assert errors.tobytes() == results[0][0].tobytes() and power == results[0][1]
    a = rng.random((300, 2049))
    x = rng.random(2049)
    from qcc.quant.histerr import row_dots

    assert np.allclose(row_dots(a, x), a @ x, rtol=1e-12, atol=0.0)
