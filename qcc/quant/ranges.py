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
from qcc.quant.affine import affine_params, qrange, scale_zero_point
from qcc.quant.histerr import approx_sq_error, expected_sq_error, kl_divergences
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


def _finish_all(stats: TensorStats, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_finish` of many candidates at once (the same values: selections and one subtraction)."""
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    finite = np.isfinite(lo) & np.isfinite(hi)
    if not finite.all():
        bad = int(np.argmin(finite))
        _finish(stats, float(lo[bad]), float(hi[bad]))  # raises, naming the tensor
    zero = is_zero_tensor(stats) | (hi - lo < ZERO_THRESHOLD)
    return np.where(zero, ZERO_TENSOR_RANGE[0], lo), np.where(zero, ZERO_TENSOR_RANGE[1], hi)


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
    step, pos, neg = _grids(stats, candidates, dtype, symmetric, reduce_range)
    return expected_sq_error(stats, step, pos, neg)


def _grids(stats: TensorStats, candidates: list[tuple[float, float]], dtype: str, symmetric: bool,
           reduce_range: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step, positive bound, negative bound) of each candidate's affine grid, all at once."""
    los = np.array([c[0] for c in candidates], dtype=np.float64)
    his = np.array([c[1] for c in candidates], dtype=np.float64)
    return _range_grids(stats, los, his, dtype, symmetric, reduce_range)


def _range_grids(stats: TensorStats, los: np.ndarray, his: np.ndarray, dtype: str, symmetric: bool,
                 reduce_range: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_grids` of candidates given as arrays of lower and upper bounds."""
    usable = np.isfinite(los) & np.isfinite(his) & (los <= his)
    if not usable.all():
        bad = int(np.argmin(usable))
        affine_params(float(los[bad]), float(his[bad]), dtype, symmetric, reduce_range, stats.name)  # raises
    qmin, qmax = qrange(dtype, symmetric, reduce_range)
    scale, zp = scale_zero_point(los, his, qmin, qmax, symmetric)
    step = scale.astype(np.float64)
    zpf = zp.astype(np.float64)
    return step, step * (qmax - zpf), step * (zpf - qmin)


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


PERCENTILES = (99.0, 99.9, 99.99, 99.999)
"""Percentile ranges `mse` always considers, so it is never worse than any of them."""

_COARSE = 64  # geometric grid over 12 octaves below the observed extreme
_LINEAR = 128  # and a linear one, extreme * k / 128 (what mse searched before)
_FINE = 24  # linear refinement between the best candidate's neighbours
_EXACT = 4  # screened candidates integrated exactly
_OCTAVES = 12
_ROUNDS = 1  # coordinate-descent rounds for an asymmetric range of signed data

AUTO_TOLERANCE = 1.0
"""`auto` keeps the observed range unless clipping divides the expected error by more than 1 + this.

Clipping error is not like rounding noise of the same power: it always moves the largest values
toward zero, so it is correlated with the signal and adds up downstream instead of averaging out.
Measured on the digits CNN, the least-error ranges (expected error 1.03x to 1.25x lower per tensor)
lowered the logits SQNR: int8 40.5 -> 39.0 dB (with bias correction), FIXED16 66.6 -> 52.8 dB.
Only a large expected gain (2x, 3 dB on the tensor) is worth a clip, and only on a tensor whose
rounding noise matters at all (`AUTO_MAX_SQNR_DB`)."""

AUTO_MAX_SQNR_DB = 40.0
"""`auto` clips only tensors whose observed range stores them below this SQNR: at 16 bits the
rounding noise is negligible and a clip trades it for errors on the values that carry the signal
(digits FIXED16: clipping positions that divided the expected error by 2 to 4 cost 14 dB of logits
SQNR)."""


def clipping_worth_it(stats: TensorStats, full_error: float, best_error: float) -> bool:
    """auto's rule: a clip that divides the error by more than 1 + AUTO_TOLERANCE, on a tensor the
    observed range stores below AUTO_MAX_SQNR_DB."""
    from qcc.quant.histerr import signal_power

    if full_error <= (1.0 + AUTO_TOLERANCE) * best_error or full_error <= 0.0:
        return False
    return 10.0 * math.log10(max(signal_power(stats), 1e-300) / full_error) < AUTO_MAX_SQNR_DB


def mse(
    stats: TensorStats,
    dtype: str = "int8",
    symmetric: bool = True,
    reduce_range: bool = False,
) -> tuple[float, float]:
    """The range whose affine parameters minimize the expected squared error on the histogram.

    Each candidate is scored with the exact scale and zero point affine_params gives it
    (qcc.quant.histerr integrates rounding and clipping error over the histogram). The search:
    the observed range and the PERCENTILES ranges, then per bound a geometric grid over 12
    octaves below the observed extreme (so an optimum at 1/1000 of a heavy tail is found) with a
    linear grid of 128 steps, screened in O(bins) (histerr.approx_sq_error) before the best are
    integrated exactly, and a linear refinement around the best; a symmetric grid moves one threshold, a one-sided tensor
    its upper bound, an asymmetric range of signed data both bounds in turn (coordinate descent).
    The result is never worse than minmax or those percentiles; ties keep the widest range.
    """
    return _mse_search(stats, dtype, symmetric, reduce_range)[0]


def auto(
    stats: TensorStats,
    dtype: str = "int8",
    symmetric: bool = True,
    reduce_range: bool = False,
) -> tuple[tuple[float, float], str]:
    """(range, choice): the observed range ('minmax') unless the least-error range ('mse') divides
    the expected squared error by more than 1 + AUTO_TOLERANCE; clipping only where it pays."""
    if (constant := _checked_stats(stats)) is not None:
        return constant, "minmax"
    if not _clipping_may_pay(stats, dtype, symmetric, reduce_range):
        return minmax(stats), "minmax"
    best, err, full_err = _mse_search(stats, dtype, symmetric, reduce_range)
    full = minmax(stats)
    if best == full or not clipping_worth_it(stats, full_err, err):
        return full, "minmax"
    return best, "mse"


def _clipping_may_pay(stats: TensorStats, dtype: str, symmetric: bool, reduce_range: bool) -> bool:
    """Whether any clipped range on the screening grid comes near the gain `auto` asks for (within
    25%: screening estimates are within a few percent): most tensors stop here."""
    full = minmax(stats)
    # the grid's points in any order, repeats kept: only the least error counts here
    if symmetric:  # _clip_symmetric of each threshold, all at once
        t = _screening_points(stats.absmax)
        lo, hi = np.maximum(-t, stats.min), np.minimum(t, stats.max)
    else:
        a = _screening_points(1.0)
        lo, hi = stats.min * a, stats.max * a
    lo, hi = _finish_all(stats, np.concatenate([[full[0]], lo]), np.concatenate([[full[1]], hi]))
    errors = approx_sq_error(stats, *_range_grids(stats, lo, hi, dtype, symmetric, reduce_range))
    return bool(errors[1:].min() * (1.0 + AUTO_TOLERANCE) < 1.25 * errors[0])


_GEOMETRIC = np.exp2(-np.linspace(0.0, _OCTAVES, _COARSE))
_STEPS = np.arange(1, _LINEAR + 1)


def _screening_points(extreme: float) -> np.ndarray:
    """The search grid's thresholds in any order, repeats kept (screening reads only the least error)."""
    return np.concatenate([extreme * _GEOMETRIC, extreme * _STEPS / _LINEAR])


def _grid_points(extreme: float) -> np.ndarray:
    """The search grid's thresholds, sorted, without repeats."""
    return np.unique(np.concatenate([extreme * _GEOMETRIC, extreme * _STEPS / _LINEAR]))


def _mse_search(stats: TensorStats, dtype: str, symmetric: bool,
                reduce_range: bool) -> tuple[tuple[float, float], float, float]:
    """(best range, its error, the observed range's error)."""
    if (constant := _checked_stats(stats)) is not None:
        return constant, 0.0, 0.0
    quantizer = (dtype, symmetric, reduce_range)
    full = minmax(stats)
    seeds = [full] + [percentile(stats, p) for p in PERCENTILES]
    if not symmetric:
        seeds += [percentile(stats, p, symmetric=False) for p in PERCENTILES]
    errors = _range_errors(stats, seeds, *quantizer)
    best, best_err = _pick(seeds, errors)
    full_err = float(errors[0])
    if symmetric:
        best, best_err = _line_search(stats, quantizer, best, best_err,
                                      lambda t: _clip_symmetric(stats, t), stats.absmax)
    elif stats.min >= 0.0:
        best, best_err = _line_search(stats, quantizer, best, best_err,
                                      lambda t: _finish(stats, 0.0, t), stats.max)
    else:
        for _ in range(_ROUNDS):
            start = best
            best, best_err = _line_search(stats, quantizer, best, best_err, _upper(stats, best[0]), stats.max)
            best, best_err = _line_search(stats, quantizer, best, best_err, _lower(stats, best[1]), -stats.min)
            if best == start:
                break
    return best, best_err, full_err


def _upper(stats: TensorStats, lo: float) -> Callable[[float], tuple[float, float]]:
    return lambda t: _finish(stats, lo, t)


def _lower(stats: TensorStats, hi: float) -> Callable[[float], tuple[float, float]]:
    return lambda t: _finish(stats, -t, hi)


def _pick(cands: list[tuple[float, float]], errors: np.ndarray) -> tuple[tuple[float, float], float]:
    """The least error; among equal errors the widest range."""
    order = sorted(range(len(cands)), key=lambda i: (float(errors[i]), -(cands[i][1] - cands[i][0])))
    return cands[order[0]], float(errors[order[0]])


def _line_search(stats: TensorStats, quantizer: tuple[str, bool, bool], best: tuple[float, float],
                 best_err: float, make: Callable[[float], tuple[float, float]],
                 extreme: float) -> tuple[tuple[float, float], float]:
    """Best of `best` and make(t) over a geometric grid of t in (0, extreme], then refined.

    Every grid point is screened with the O(bins) approximation (histerr.approx_sq_error); only
    the few best are integrated exactly."""
    if extreme <= 0.0:
        return best, best_err
    ts = _grid_points(extreme)
    cands, errors = _screened(stats, quantizer, [make(float(t)) for t in ts], _EXACT)
    found, found_err = _pick([best, *cands], np.concatenate([[best_err], errors]))
    i = int(np.argmin(np.abs(ts - max(abs(x) for x in found))))
    fine_ts = np.linspace(float(ts[max(i - 1, 0)]), float(ts[min(i + 1, len(ts) - 1)]), _FINE)
    fine, fine_err = _screened(stats, quantizer, [make(float(t)) for t in fine_ts], _EXACT // 2)
    return _pick([found, *fine], np.concatenate([[found_err], fine_err]))


def _screened(stats: TensorStats, quantizer: tuple[str, bool, bool], cands: list[tuple[float, float]],
              keep: int) -> tuple[list[tuple[float, float]], np.ndarray]:
    """The `keep` candidates with the least approximate error, with their exact errors."""
    approx = approx_sq_error(stats, *_grids(stats, cands, *quantizer))
    top = [cands[i] for i in np.argsort(approx, kind="stable")[:keep]]
    return top, _range_errors(stats, top, *quantizer)


RANGE_METHODS: dict[str, Callable[..., tuple[float, float]]] = {
    "minmax": minmax,
    "percentile": percentile,
    "entropy": entropy,
    "mse": mse,
    "auto": lambda stats, **options: auto(stats, **options)[0],
}


def choose_range(stats: TensorStats, method: str, **options: Any) -> tuple[float, float]:
    """Dispatch by name ('minmax', 'percentile', 'entropy', 'mse', 'auto'); options go to the method."""
    if method not in RANGE_METHODS:
        raise UsageError(f"unknown range method {method!r}; choose from {sorted(RANGE_METHODS)}")
    return RANGE_METHODS[method](stats, **options)
