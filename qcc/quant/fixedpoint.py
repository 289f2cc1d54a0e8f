"""Choosing the fraction position of power-of-two (fixed-point) quantization.

value = q * 2**-frac with q a signed `bits`-bit integer saturated to the full two's-complement
range (numerics.fixed_bounds). Only a few positions are worth trying: from one above the
position that holds the largest magnitude without clipping down to `bits` below it. Positions
can be confined to [min_frac, max_frac] (nnb stores 0..15); when no candidate survives, the
nearest allowed position is returned. Ties go to the smaller frac (the wider range).

All-zero data (|x| < 2**-100) is treated as if its largest magnitude were 1.0, the same rule as
ranges.ZERO_TENSOR_RANGE: frac = bits - 2. Other constant data gets the (widest) position that
represents its value best.
"""

from __future__ import annotations

import math

import numpy as np

from qcc.errors import InvalidInputError, UsageError
from qcc.quant.histerr import expected_sq_error, kl_divergences
from qcc.quant.numerics import ROUNDINGS, fixed_bounds, quantize_fixed
from qcc.quant.ranges import ZERO_THRESHOLD, is_constant, is_zero_tensor, usable
from qcc.quant.stats import TensorStats, extent_for

STATS_METHODS = ("mse", "kl", "maxabs")
PARAM_METHODS = ("mse", "maxabs", "nnabla")


def _clamp(frac: int, min_frac: int | None, max_frac: int | None) -> int:
    if min_frac is not None:
        frac = max(frac, min_frac)
    if max_frac is not None:
        frac = min(frac, max_frac)
    return frac


def _candidates(absmax: float, bits: int, min_frac: int | None, max_frac: int | None) -> list[int]:
    """Positions from one coarser than 'absmax fits' (absmax < 2**k) to `bits` finer."""
    if min_frac is not None and max_frac is not None and min_frac > max_frac:
        raise UsageError(f"min_frac {min_frac} > max_frac {max_frac}")
    fits = bits - 1 - extent_for(absmax)
    window = [p for p in range(fits - 1, fits + bits + 1) if _clamp(p, min_frac, max_frac) == p]
    return window or [_clamp(fits, min_frac, max_frac)]


def _check(bits: int, method: str, methods: tuple[str, ...], rounding: str) -> None:
    fixed_bounds(bits)
    if method not in methods:
        raise UsageError(f"fixed-point position method must be one of {methods}, not {method!r}")
    if rounding not in ROUNDINGS:
        raise UsageError(f"rounding must be one of {ROUNDINGS}, not {rounding!r}")


def _fits(lo: float, hi: float, bits: int, frac: int, rounding: str) -> bool:
    """Whether no value in [lo, hi] saturates at this position."""
    qmin, qmax = fixed_bounds(bits)
    a, b = math.ldexp(lo, frac), math.ldexp(hi, frac)
    if rounding == "trunc":
        return b < qmax + 1 and a > qmin - 1
    return b < qmax + 0.5 and a >= qmin - 0.5  # qmin is even: qmin - 0.5 rounds to it


def _largest_fitting(lo: float, hi: float, bits: int, cands: list[int], rounding: str) -> int:
    fitting = [p for p in cands if _fits(lo, hi, bits, p, rounding)]
    return max(fitting) if fitting else min(cands)


def fixed_point_position(
    stats: TensorStats,
    bits: int,
    method: str = "mse",
    *,
    rounding: str = "half_even",
    min_frac: int | None = None,
    max_frac: int | None = None,
) -> int:
    """Fraction position for a calibrated tensor (activations).

    'mse': least expected squared error on the histogram (with the given rounding; nnabla-c-runtime
    truncates what it computes, so pass rounding='trunc' for .nnb activations). 'kl': TensorRT's
    KL criterion with 2**(bits-1) target bins, on positions whose clip value falls on a histogram
    edge (needs num_bins >= 2**(bits-1)). 'maxabs': the finest position at which nothing saturates.
    """
    _check(bits, method, STATS_METHODS, rounding)
    usable(stats)
    if is_constant(stats):  # exact answer from the value itself
        value = np.array([stats.min if is_zero_tensor(stats) else stats.max], dtype=np.float64)
        return param_fixed_point_position(
            value,
            bits,
            "mse",
            rounding=rounding,
            min_frac=min_frac,
            max_frac=max_frac,
            name=stats.name,
        )
    cands = _candidates(stats.absmax, bits, min_frac, max_frac)
    if method == "maxabs" or len(cands) == 1:
        return _largest_fitting(stats.min, stats.max, bits, cands, rounding)
    qmin, qmax = fixed_bounds(bits)
    fracs = np.array(cands)
    if method == "mse":
        step = np.ldexp(1.0, -fracs)
        err = expected_sq_error(stats, step, step * qmax, step * -qmin, rounding)
    else:
        err = _kl_positions(stats, bits, fracs)
    return int(fracs[int(np.argmin(err))])


def _kl_positions(stats: TensorStats, bits: int, fracs: np.ndarray) -> np.ndarray:
    levels = 1 << (bits - 1)
    if stats.num_bins < levels:
        raise UsageError(
            f"tensor {stats.name!r}: 'kl' for {bits}-bit needs a histogram of at least {levels} "
            f"bins, this one has {stats.num_bins}; use 'mse'"
        )
    # clip value 2**(bits-1-frac) in bins of width 2**(k - log2 num_bins): a power of two
    log2_kept = bits - 1 - fracs - stats.log2_extent + (stats.num_bins.bit_length() - 1)
    ok = log2_kept >= bits - 1
    err = np.full(fracs.shape, np.inf)
    if ok.any():
        kept = np.left_shift(1, log2_kept[ok])
        err[ok] = kl_divergences(stats.abs_hist()[: stats.used_bins], kept, levels)
    return err


def nnabla_int_bits(w: np.ndarray) -> int:
    """Integer bits nnabla's converter gives a parameter (NnbExporter.__compute_int_bit_num).

    ceil(log2(max|w|)) + 1, or log2(max|w|) + 2 when the first element of largest magnitude (C
    order) is a positive exact power of two, or 1 when max|w| < 1. Computed in float64, as the
    converter gets its arrays from protobuf floats.
    """
    a = np.abs(np.asarray(w, dtype=np.float64)).reshape(-1)
    max_abs = float(a.max())
    if max_abs < 1:
        return 1
    log2 = math.log2(max_abs)
    if log2.is_integer() and float(np.asarray(w).reshape(-1)[int(a.argmax())]) > 0:
        return int(log2) + 2
    return math.ceil(log2) + 1


def param_fixed_point_position(
    w: np.ndarray,
    bits: int,
    method: str = "mse",
    *,
    rounding: str = "half_even",
    min_frac: int | None = None,
    max_frac: int | None = None,
    name: str = "",
) -> int:
    """Fraction position for a parameter, whose values are all known.

    'nnabla': exactly nnabla's automatic FIXED8/FIXED16 rule, frac = bits - nnabla_int_bits(w)
    (then clamped to [min_frac, max_frac]; nnabla itself fails on a negative position).
    'mse': the candidate with the least squared error on the actual values. 'maxabs': the finest
    position at which nothing saturates.
    """
    _check(bits, method, PARAM_METHODS, rounding)
    w = np.asarray(w)
    if w.size == 0:
        raise InvalidInputError(f"tensor {name!r}: empty parameter")
    if not np.isfinite(w).all():
        raise InvalidInputError(f"tensor {name!r}: parameter contains NaN or Inf")
    if method == "nnabla":
        return _clamp(bits - nnabla_int_bits(w), min_frac, max_frac)
    lo, hi = float(w.min()), float(w.max())
    absmax = max(-lo, hi)
    if absmax < ZERO_THRESHOLD:
        return _clamp(bits - 2, min_frac, max_frac)
    cands = _candidates(absmax, bits, min_frac, max_frac)
    if method == "maxabs" or len(cands) == 1:
        return _largest_fitting(lo, hi, bits, cands, rounding)
    errs = _param_errors(w, bits, cands, rounding, absmax)
    return cands[int(np.argmin(errs))]


def _param_errors(w: np.ndarray, bits: int, cands: list[int], rounding: str, absmax: float) -> list[float]:
    """Per candidate position p, sum((dequantized(quantize_fixed(w, p)) - w)**2) in float64.

    The bits of the formula `_param_error`, in fewer passes. The scaling by 2**p is a product by
    a power of two (exact where ldexp is; a value it would make subnormal rounds to 0 either
    way), the clip is skipped where absmax * 2**p cannot round past the bounds. float32 weights
    (float32 work) are compared on the integer grid: q - w * 2**p is 2**p times q * 2**-p - w in
    the reals, and float64 rounding, squaring and pairwise summation commute with powers of two
    while nothing leaves the normal range (|w| >= 2**-149 and |p| <= 100: every nonzero square
    lies in [2**-498, 2**458]), so sum((q - t)**2) * 2**(-2p) is the formula's sum; t = w * 2**p
    is exact in float32 for p >= 0 below 2**127 (a subnormal scaled up keeps its bits), other
    positions compare q * 2**-p with w in float64 as the formula does, and so do other dtypes;
    other layouts (another summation order) and positions far from 0 take the formula itself."""
    if not w.flags.c_contiguous or any(abs(p) > 100 for p in cands):
        return [_param_error(w, bits, p, rounding) for p in cands]
    lo, hi = fixed_bounds(bits)
    work = np.float64 if bits > 24 or w.dtype == np.float64 else np.float32
    scaled_domain = w.dtype == np.float32 and work == np.float32
    src = np.asarray(w, dtype=work)
    x: np.ndarray | None = None
    t = np.empty(w.shape, dtype=work)
    q = np.empty(w.shape, dtype=work)
    d = np.empty(w.shape, dtype=np.float64)
    step = np.rint if rounding == "half_even" else np.trunc
    errs = []
    for p in cands:
        with np.errstate(over="ignore"):  # past the type's range: inf, clipped to the bound (as ldexp's)
            np.multiply(src, work(2.0 ** p), out=t)
        step(t, out=q)
        if math.ldexp(absmax, p) >= min(-lo, hi):  # may round to the bounds or past them
            np.clip(q, lo, hi, out=q)
        grid = scaled_domain and p >= 0 and math.ldexp(absmax, p) < 2.0 ** 127
        if grid:
            np.subtract(q, t, out=d, dtype=np.float64)
        else:
            x = w.astype(np.float64) if x is None else x
            np.multiply(q, 2.0 ** -p, out=d, dtype=np.float64)
            np.subtract(d, x, out=d)
        np.multiply(d, d, out=d)
        total = float(np.sum(d))
        errs.append(total * 2.0 ** (-2 * p) if grid else total)
    return errs


def _param_error(w: np.ndarray, bits: int, p: int, rounding: str) -> float:
    x = w.astype(np.float64)
    return float(np.sum((np.ldexp(quantize_fixed(w, bits, p, rounding).astype(np.float64), -p) - x) ** 2))


def position_errors(stats: TensorStats, bits: int, fracs: np.ndarray, rounding: str,
                    partial_sums: int = 1) -> np.ndarray:
    """Expected squared error of storing the histogram at each position in `fracs`; a value summed
    from `partial_sums` truncated parts (nnb convolutions truncate per input channel) adds about
    step**2 / 3 for each further truncation of a nonzero value."""
    qmin, qmax = fixed_bounds(bits)
    step = np.ldexp(1.0, -np.asarray(fracs))
    err = expected_sq_error(stats, step, step * qmax, step * -qmin, rounding)
    if partial_sums > 1:
        nonzero = max(stats.count - stats.zero_count, 0)
        err = err + (partial_sums - 1) * nonzero * step**2 / 3.0
    return np.asarray(err)


def auto_position(stats: TensorStats, bits: int, rounding: str, partial_sums: int = 1,
                  min_frac: int | None = None, max_frac: int | None = None) -> tuple[int, str]:
    """(position, choice): the finest position at which nothing saturates ('minmax'), unless a finer
    one that clips is worth it by ranges.clipping_worth_it ('mse')."""
    from qcc.quant.ranges import clipping_worth_it

    usable(stats)
    full = fixed_point_position(stats, bits, "maxabs", rounding=rounding, min_frac=min_frac, max_frac=max_frac)
    if is_constant(stats):
        return full, "minmax"
    cands = np.array([p for p in _candidates(stats.absmax, bits, min_frac, max_frac) if p >= full] or [full])
    err = position_errors(stats, bits, cands, rounding, partial_sums)
    best = int(np.argmin(err))
    full_err = float(err[list(cands).index(full)]) if full in cands else float("inf")
    if int(cands[best]) == full or not clipping_worth_it(stats, full_err, float(err[best])):
        return full, "minmax"
    return int(cands[best]), "mse"
