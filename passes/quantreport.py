"""Per-tensor report entries of the annotation passes: range, clipping, SQNR (value.meta["report"]).

Activations are measured on their calibration histogram (values uniform inside each bin, the
same model qcc.quant.histerr uses to choose ranges), parameters on their exact values. An SQNR
of None means no error at all (every value exactly representable).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from qcc.ir.fakequant import apply_annotation
from qcc.ir.types import Affine, FixedPoint, QuantType
from qcc.quant.histerr import expected_sq_error, row_dots
from qcc.quant.numerics import AFFINE_DTYPES, fixed_bounds
from qcc.quant.stats import TensorStats


def grid(quant: QuantType) -> tuple[float, float, float] | None:
    """(step, largest positive value, largest negative magnitude) of a per-tensor annotation."""
    if isinstance(quant, FixedPoint):
        qmin, qmax = fixed_bounds(quant.bits)
        step = math.ldexp(1.0, -quant.frac)
        return step, qmax * step, -qmin * step
    if isinstance(quant, Affine) and quant.axis is None:
        qmin, qmax = AFFINE_DTYPES[quant.dtype]
        s, zp = float(quant.scale[0]), int(quant.zero_point[0])
        return s, s * (qmax - zp), s * (zp - qmin)
    return None


def _mass_beyond(stats: TensorStats, t: float, positive: bool) -> float:
    """Count of values above t (positive side) or below -t (negative side), t >= 0."""
    counts = (stats.positive_hist() if positive else stats.negative_hist()).astype(np.float64)
    w = stats.bin_width
    j = int(t // w)
    if j >= len(counts):
        return 0.0
    inside = (t - j * w) / w
    return float(counts[j + 1:].sum() + counts[j] * (1.0 - inside))


def clip_fraction(stats: TensorStats, lo: float, hi: float) -> float:
    """Fraction of calibration values outside [lo, hi] (none when [lo, hi] covers [min, max])."""
    if not stats.count:
        return 0.0
    above = 0.0 if hi >= stats.max else _mass_beyond(stats, max(hi, 0.0), True)
    below = 0.0 if lo <= stats.min else _mass_beyond(stats, max(-lo, 0.0), False)
    return min((above + below) / stats.count, 1.0)


def positive_part(stats: TensorStats) -> TensorStats:
    """The statistics of max(x, 0): what is left of a tensor that only a Relu reads."""
    hist = stats.hist.copy()
    n = stats.num_bins
    moved = int(hist[:n].sum())
    hist[:n] = 0
    hist[n] += moved
    return attrs.evolve(stats, hist=hist, min=max(stats.min, 0.0), max=max(stats.max, 0.0),
                        zero_count=stats.zero_count + moved, channel_min=None, channel_max=None)


def without_zeros(stats: TensorStats) -> TensorStats:
    """The statistics with exact zeros taken out (for the KL criterion).

    Zeros are exact in every scheme, and a ReLU output is about half zeros: KL on such a
    histogram picks tiny thresholds (digits relu1: 0.81 instead of 2.85, int8 accuracy 53%).
    """
    if not stats.zero_count or stats.zero_count >= stats.count:
        return stats
    hist = stats.hist.copy()
    n = stats.num_bins
    from_pos = min(stats.zero_count, int(hist[n]))
    hist[n] -= from_pos
    hist[n - 1] -= min(stats.zero_count - from_pos, int(hist[n - 1]))
    return attrs.evolve(stats, hist=hist, count=stats.count - stats.zero_count, zero_count=0,
                        channel_min=None, channel_max=None)


def _signal_power(stats: TensorStats) -> float:
    n = stats.num_bins
    w = stats.bin_width
    a = np.arange(n, dtype=np.float64) * w
    b = a + w
    second = (a * a + a * b + b * b) / 3.0  # E[x^2] for x uniform in [a, b)
    return float(row_dots(second, stats.abs_hist().astype(np.float64)))


def _db(signal: float, noise: float) -> float | None:
    if noise <= 0.0:
        return None
    if signal <= 0.0:
        return -math.inf
    return round(10.0 * math.log10(signal / noise), 3)


def activation_entry(stats: TensorStats | None, quant: QuantType, method: str,
                     rounding: str = "half_even", relu_only: bool = False) -> dict[str, Any]:
    """Report fields of an activation annotated `quant`, judged on its calibration statistics.

    relu_only: only a Relu reads the tensor, so it is judged on its positive part.
    """
    entry: dict[str, Any] = {"method": method}
    if stats is not None and stats.count:
        entry["observed"] = [stats.min, stats.max]
        if relu_only:
            entry["judged"] = "after the Relu that reads it"
            stats = positive_part(stats)
    g = grid(quant)
    if g is not None:
        step, pos, neg = g
        entry["range"] = [-neg, pos]
    if isinstance(quant, Affine):
        entry["scale"], entry["zero_point"] = float(quant.scale[0]), int(quant.zero_point[0])
    if isinstance(quant, FixedPoint):
        entry["position"] = quant.frac
    if stats is None or not stats.count or g is None:
        return entry
    entry["clip_fraction"] = round(clip_fraction(stats, -neg, pos), 8)
    noise = float(expected_sq_error(stats, np.array([step]), np.array([pos]), np.array([neg]), rounding)[0])
    entry["sqnr_db"] = _db(_signal_power(stats), noise)
    return entry


def parameter_entry(data: np.ndarray, quant: QuantType) -> dict[str, Any]:
    """Report fields of a parameter, from its exact values."""
    x = np.asarray(data)
    err = np.asarray(apply_annotation(x, quant))
    if err is x or not err.flags.writeable or err.dtype != x.dtype or err.shape != x.shape:
        err = np.asarray(err - x)  # (an annotation that keeps x returns x itself)
    else:
        err -= x  # in x's precision (the sums below are float64), in the buffer the annotation made
    entry: dict[str, Any] = {"observed": [float(x.min()), float(x.max())] if x.size else [0.0, 0.0]}
    if isinstance(quant, Affine):
        entry["scale"] = [float(s) for s in quant.scale] if quant.axis is not None else float(quant.scale[0])
        if quant.axis is None:
            entry["zero_point"] = int(quant.zero_point[0])
        else:
            entry["axis"] = quant.axis
    if isinstance(quant, FixedPoint):
        entry["position"] = quant.frac
        qmin, qmax = fixed_bounds(quant.bits)
        step = math.ldexp(1.0, -quant.frac)
        entry["range"] = [qmin * step, qmax * step]
    half = 0.5 * _steps(quant, x.ndim) * (1.0 + 1e-6)
    noise = float(np.sum(np.square(err, dtype=np.float64), dtype=np.float64))
    np.abs(err, out=err)  # the sums and counts reuse err's buffer: a large weight is not copied again
    entry["clip_fraction"] = float(np.count_nonzero(err > half)) / x.size if x.size else 0.0
    signal = float(np.sum(np.square(x, out=err) if err.dtype == x.dtype else np.square(x), dtype=np.float64))
    entry["sqnr_db"] = _db(signal, noise)
    return entry


def _steps(quant: QuantType, ndim: int) -> np.ndarray:
    """The quantization step, broadcastable to the parameter (per channel for per-channel affine)."""
    if isinstance(quant, FixedPoint):
        return np.array(math.ldexp(1.0, -quant.frac))
    if isinstance(quant, Affine):
        s = np.asarray(quant.scale, dtype=np.float64)
        if quant.axis is None:
            return s[:1].reshape(())
        view = [1] * ndim
        view[quant.axis] = -1
        return s.reshape(view)
    return np.array(np.inf)
