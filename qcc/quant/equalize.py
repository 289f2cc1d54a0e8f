"""Cross-layer equalization and high-bias absorption: the per-channel numbers (numpy only).

Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias Correction".
Two layers y = B(act(A x)) with a positively homogeneous activation between them compute the
same function when A's output channel c is divided by s_c and B's input channel c multiplied by
s_c. With r1 = A's weight range per output channel and r2 = B's per input channel,
s = sqrt(r1 / r2) gives both the range sqrt(r1 * r2): a channel whose BatchNorm folding made its
filter hundreds of times larger than the others shares that factor with the next layer instead
of forcing one per-tensor scale onto every channel.

A clamp with an upper bound (ReLU6 = clip(x, 0, 6)) is homogeneous only where it is not
active: dividing channel c by S moves the clamp, in the original units, from 6 to 6*S. So a
channel that reaches the bound on the data keeps S = 1, and any other channel needs
S >= max_c / 6 (`clamp_scale_limits`). High-bias absorption moves a shift c >= 0 from A's bias
into B's (act(x - c) == act(x) - c where x >= c and the clamp is inactive).
"""

from __future__ import annotations

import math

import numpy as np

OBSERVED_INPUT_VALUES = 1 << 17
"""equalize's input-value budget for its float run (qcc.quant.samples): half bias-correct's (96x96
RGB images: 4 samples, 224x224 ones 4, 8x8 digits all 32). What it observes are per-channel
extremes of the clamps' inputs over every position of every sample, which few large samples
already settle: torchvision mobilenet_v2 96x96, four calibration draws, logits SQNR on 64 held-out
images with 8 / 4 samples observed: int8 per-tensor 40.48 / 40.53 dB, fixed8 .nnb 20.41 / 20.41,
fixed16 64.43 / 64.45 (docs/benchmarks.md, "Compile time"); the float run costs in proportion."""


def cle_scales(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """s = sqrt(r1 / r2) per channel; 1 where either range is 0 (nothing to balance)."""
    r1, r2 = np.asarray(r1, np.float64), np.asarray(r2, np.float64)
    ok = (r1 > 0) & (r2 > 0)
    if ok.all():  # the same values without the masking (equalize calls this 20 times per pair)
        return np.sqrt(r1 / r2)
    return np.where(ok, np.sqrt(np.where(ok, r1, 1.0) / np.where(ok, r2, 1.0)), 1.0)


def clamp_scale_limits(data_lo: np.ndarray | None, data_hi: np.ndarray | None, clamp_lo: float | None,
                       clamp_hi: float | None, channels: int, margin: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Bounds (smin, smax) per channel on the total divisor S of a channel that goes through the clamp.

    Without data a bounded clamp pins S to 1; a lower bound of None or 0 and an upper bound of
    None allow any S > 0. A negative lower bound is treated like an upper bound on -x. `margin`:
    the data's peak times margin must stay below the bound, before and after scaling, so that
    values a little beyond the calibration data still meet the clamp where the float model does.
    """
    fixed = np.ones(channels), np.ones(channels)
    if clamp_lo is not None and clamp_lo > 0:  # clip(x, 1, 5) is not homogeneous at all
        return fixed
    smin, smax = np.zeros(channels), np.full(channels, np.inf)
    sides = [(clamp_hi, data_hi, 1.0)]
    if clamp_lo is not None and clamp_lo < 0:
        sides.append((-clamp_lo, data_lo, -1.0))
    for bound, data, sign in sides:
        if bound is None:
            continue
        if data is None:
            return fixed
        peak = sign * np.asarray(data, np.float64) * margin
        active = peak >= bound
        smin = np.maximum(smin, np.where(active, 1.0, np.maximum(peak, 0.0) / bound))
        smax = np.where(active, 1.0, smax)
    return np.minimum(smin, smax), smax


def limit_scales(s: np.ndarray, total: np.ndarray, smin: np.ndarray, smax: np.ndarray,
                 floor: np.ndarray | None = None) -> np.ndarray:
    """The step s that keeps total * s within [smin, smax] (total: the divisor applied so far).
    `floor`: scale_floor(smin), when the caller keeps it across steps. np.clip's values
    (min(max(x, lo), hi)) without its Python wrapper."""
    lo = scale_floor(smin) if floor is None else floor
    return np.minimum(np.maximum(total * s, lo), smax) / total


def scale_floor(smin: np.ndarray) -> np.ndarray:
    """The least total divisor: smin, and above 0 (a channel's scale never reaches zero)."""
    return np.maximum(smin, 1e-30)


def absorbable_shift(data_lo: np.ndarray, data_hi: np.ndarray, clamp_hi: float | None,
                     margin: float = 0.5) -> np.ndarray:
    """The shift c >= 0 a clamp(x, 0, hi) input can lose: its minimum on the data less `margin`
    times its observed span (inputs a little outside the calibration data stay above it), where
    positive and where twice the channel's peak stays below the clamp's upper bound."""
    lo, hi = np.asarray(data_lo, np.float64), np.asarray(data_hi, np.float64)
    c = np.maximum(lo - margin * (hi - lo), 0.0)
    if clamp_hi is None:
        return c
    return np.where(2.0 * hi < clamp_hi, c, 0.0)


def normal_shift(mean: np.ndarray, std: np.ndarray, clamp_hi: float | None, k: float = 3.0) -> np.ndarray:
    """Data-free absorption: max(0, mean - k*std) of a BatchNorm output N(mean, std^2), the bound
    x stays above with high probability (DFQ's choice k = 3); 0 where the upper clamp is within
    reach (mean + k*std >= hi)."""
    c = np.maximum(np.asarray(mean, np.float64) - k * np.asarray(std, np.float64), 0.0)
    if clamp_hi is None:
        return c
    return np.where(mean + k * std < clamp_hi, c, 0.0)


def clipped_normal_mean(mean: np.ndarray, std: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """E[clip(x, lo, hi)] for x ~ N(mean, std^2) per channel (None: unbounded on that side)."""
    mean, std = np.asarray(mean, np.float64), np.maximum(np.asarray(std, np.float64), 1e-30)
    erf = np.vectorize(math.erf, otypes=[np.float64])

    def cdf(z: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 + erf(z / math.sqrt(2.0)))

    def pdf(z: np.ndarray) -> np.ndarray:
        return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)

    a = np.full(mean.shape, -np.inf) if lo is None else (lo - mean) / std
    b = np.full(mean.shape, np.inf) if hi is None else (hi - mean) / std
    fa, fb = np.where(np.isfinite(a), cdf(np.where(np.isfinite(a), a, 0)), 0.0), \
        np.where(np.isfinite(b), cdf(np.where(np.isfinite(b), b, 0)), 1.0)
    pa = np.where(np.isfinite(a), pdf(np.where(np.isfinite(a), a, 0)), 0.0)
    pb = np.where(np.isfinite(b), pdf(np.where(np.isfinite(b), b, 0)), 0.0)
    inside = mean * (fb - fa) + std * (pa - pb)
    below = 0.0 if lo is None else lo * fa
    above = 0.0 if hi is None else hi * (1.0 - fb)
    return inside + below + above
