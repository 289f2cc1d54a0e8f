"""Choosing a tensor's quantization range from its calibration statistics.

Every function returns (lo, hi) as Python floats with lo <= 0 <= hi (affine quantization needs 0
in the range, and ORT widens to it anyway), finite and non-degenerate (hi > lo). Data with NaN or
Inf, or no data at all, raise InvalidInputError naming the tensor (onnxruntime #10571, #11928,
#13044 are calibrators returning broken ranges silently).

Safe choice for a constant tensor: a nonzero constant c gives [min(c, 0), max(c, 0)], so c is
exactly representable. An all-zero tensor (|x| < 2**-100 everywhere, below any useful float32
scale) gets ZERO_TENSOR_RANGE = (-1.0, 1.0): 0 stays exact and a nonzero value seen later is not
crushed by a vanishing scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from qcc.errors import InternalError, InvalidInputError, UsageError
from qcc.quant.affine import affine_params, qrange
from qcc.quant.histerr import expected_sq_error, kl_divergences
from qcc.quant.stats import MIN_LOG2_EXTENT, TensorStats

ZERO_TENSOR_RANGE = (-1.0, 1.0)
ZERO_THRESHOLD = math.ldexp(1.0, MIN_LOG2_EXTENT)


def is_zero_tensor(stats: TensorStats) -> bool:
    return stats.absmax < ZERO_THRESHOLD


def usable(stats: TensorStats) -> None:
    """Raise unless the statistics can give a range: finite data, at least one value."""
    stats.check_finite()
    if stats.count == 0:
        raise InvalidInputError(f"tensor {stats.name!r}: no calibration data was collected")


def is_constant(stats: TensorStats) -> bool:
    """A single value seen (zero included): no method has anything to estimate."""
    return is_zero_tensor(stats) or stats.min == stats.max


def _finish(stats: TensorStats, lo: float, hi: float) -> tuple[float, float]:
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InternalError(f"tensor {stats.name!r}: computed range [{lo}, {hi}] is not finite")
    if is_zero_tensor(stats) or hi - lo < ZERO_THRESHOLD:
        return ZERO_TENSOR_RANGE
    return lo, hi


def _clip_symmetric(stats: TensorStats, t: float) -> tuple[float, float]:
    """[-t, t] cut to the observed [min, max], then checked."""
    return _finish(stats, max(-t, stats.min), min(t, stats.max))


def _checked_stats(stats: TensorStats) -> tuple[float, float] | None:
    """Validate; the documented range when the tensor is constant, else None."""
    usable(stats)
    return _finish(stats, stats.min, stats.max) if is_constant(stats) else None


def minmax(stats: TensorStats) -> tuple[float, float]:
    """The observed min and max (widened to include 0)."""
    usable(stats)
    return _finish(stats, stats.min, stats.max)


def _quantile(counts: np.ndarray, start: float, width: float, target: float) -> float:
    """Value below which `target` of the counts lie, linear inside the bin that crosses it."""
    cum = np.cumsum(counts)
    j = min(int(np.searchsorted(cum, target)), len(counts) - 1)
    before = float(cum[j - 1]) if j else 0.0
    inside = (target - before) / counts[j] if counts[j] else 0.0
    return start + (j + min(max(inside, 0.0), 1.0)) * width


def percentile(
    stats: TensorStats, pct: float = 99.99, symmetric: bool = True
) -> tuple[float, float]:
    """Clip at the pct-th percentile: of |x| (symmetric), or pct centred between both tails."""
    if not 0.0 < pct <= 100.0:
        raise UsageError(f"tensor {stats.name!r}: percentile must be in (0, 100], not {pct}")
    if (constant := _checked_stats(stats)) is not None:
        return constant
    w = stats.bin_width
    if symmetric:
        t = _quantile(stats.abs_hist(), 0.0, w, pct / 100.0 * stats.count)
        return _clip_symmetric(stats, min(t, stats.absmax))
    tail = (1.0 - pct / 100.0) / 2.0 * stats.count
    start = -stats.num_bins * w
    lo = _quantile(stats.hist, start, w, tail) if tail > 0 else stats.min
    hi = _quantile(stats.hist, start, w, stats.count - tail)
    return _finish(stats, max(lo, stats.min), min(hi, stats.max))


_FIRST_BATCH = 4
"""KL candidates scored for squared error at once, best KL first (then 4x more each round)."""


def _range_errors(
    stats: TensorStats,
    candidates: list[tuple[float, float]],
    dtype: str,
    symmetric: bool,
    reduce_range: bool,
) -> np.ndarray:
    """Expected squared error on the histogram of each candidate range, quantized with the exact
    scale and zero point affine_params gives it."""
    qmin, qmax = qrange(dtype, symmetric, reduce_range)
    params = [
        affine_params(lo, hi, dtype, symmetric, reduce_range, stats.name) for lo, hi in candidates
    ]
    step = np.array([s for s, _ in params])
    zp = np.array([z for _, z in params], dtype=np.float64)
    return expected_sq_error(stats, step, step * (qmax - zp), step * (zp - qmin))


def entropy(
    stats: TensorStats,
    num_quantized_bins: int | None = None,
    dtype: str = "int8",
    symmetric: bool = True,
    reduce_range: bool = False,
) -> tuple[float, float]:
    """TensorRT's KL-divergence threshold on the |x| histogram, among the thresholds whose
    clipping does not cost more than it saves.

    Candidates keep i = num_quantized_bins .. used bins; the lowest KL wins (the first on ties).
    As in TensorRT, a threshold whose last kept bin is empty while values lie beyond it scores inf
    (no smoothing, unlike MXNet/ORT). With fewer used bins than target bins the histogram cannot
    resolve the grid: no clipping.

    num_quantized_bins defaults to the grid levels the quantizer puts on [0, t]: 128 for a
    two-sided 8-bit grid (TensorRT's int8 value), 256 when an asymmetric grid starts at 0 (uint8
    on a ReLU output: 128 would price its rounding noise 4x too high and over-clip).

    KL prices a clipped value by the mass it moves into the last kept bin, not by how far it
    moves it, so it happily clips a sparse tail that carries much of the signal: a pooled feature
    vector (light_densenet121's GlobalAveragePool output, 8 samples x 1024 channels: 1.4% of the
    values above the KL threshold 55 of 124 held 31% of the energy; 13 dB). A candidate is
    therefore admissible only if its expected squared error on the histogram (qcc.quant.histerr,
    with the scale and zero point affine_params gives it for dtype/symmetric) is at most that of
    the unclipped range; the unclipped range always is.
    """
    if num_quantized_bins is not None and num_quantized_bins < 2:
        raise UsageError(f"tensor {stats.name!r}: num_quantized_bins must be >= 2")
    if (constant := _checked_stats(stats)) is not None:
        return constant
    qmin, qmax = qrange(dtype, symmetric, reduce_range)
    one_sided = not symmetric and stats.min >= 0.0
    levels = num_quantized_bins or (qmax - qmin + 1 if one_sided else (qmax - qmin) // 2 + 1)
    n = stats.used_bins
    full = _clip_symmetric(stats, stats.absmax)
    if n <= levels:
        return full
    kept = np.arange(levels, n + 1)
    kl = kl_divergences(stats.abs_hist()[:n], kept, levels)
    order = np.argsort(kl, kind="stable")
    order = order[np.isfinite(kl[order])]
    quantizer = (dtype, symmetric, reduce_range)
    limit = _range_errors(stats, [full], *quantizer)[0]
    start, size = 0, _FIRST_BATCH
    while start < len(order):  # usually the best KL candidate passes
        batch = [
            _clip_symmetric(stats, min(float(kept[j]) * stats.bin_width, stats.absmax))
            for j in order[start : start + size]
        ]
        err = _range_errors(stats, batch, *quantizer)
        ok = [i for i, (e, r) in enumerate(zip(err, batch)) if e <= limit or r == full]
        if ok:
            return batch[ok[0]]
        start, size = start + size, size * 4
    return full


def mse(
    stats: TensorStats,
    dtype: str = "int8",
    symmetric: bool = True,
    reduce_range: bool = False,
    num_candidates: int = 128,
) -> tuple[float, float]:
    """The range whose affine parameters minimize the expected squared error on the histogram.

    Candidates shrink the observed range: alpha * [min, max] (asymmetric) or [-alpha*m, alpha*m]
    cut to [min, max] (symmetric), alpha = 1/num_candidates .. 1. Each candidate is scored with
    the exact scale and zero point affine_params gives it; ties keep the widest range.
    """
    if (constant := _checked_stats(stats)) is not None:
        return constant
    alphas = np.arange(1, num_candidates + 1) / num_candidates
    candidates = []
    for alpha in alphas:
        if symmetric:
            t = alpha * stats.absmax
            cand = (max(-t, stats.min), min(t, stats.max))
        else:
            cand = (alpha * stats.min, alpha * stats.max)
        candidates.append(_finish(stats, *cand))
    err = _range_errors(stats, candidates, dtype, symmetric, reduce_range)
    best = len(err) - 1 - int(np.argmin(err[::-1]))
    return candidates[best]


RANGE_METHODS: dict[str, Callable[..., tuple[float, float]]] = {
    "minmax": minmax,
    "percentile": percentile,
    "entropy": entropy,
    "mse": mse,
}


def choose_range(stats: TensorStats, method: str, **options: Any) -> tuple[float, float]:
    """Dispatch by name ('minmax', 'percentile', 'entropy', 'mse'); options go to the method."""
    if method not in RANGE_METHODS:
        raise UsageError(f"unknown range method {method!r}; choose from {sorted(RANGE_METHODS)}")
    return RANGE_METHODS[method](stats, **options)
