"""Scale and zero point from a range, bit-compatible with ONNX Runtime's quantization tool.

Matching ORT exactly (quant_utils.compute_scale_zp) means a QDQ file from qcc and one from
quantize_static agree on every parameter for the same ranges, so comparisons isolate the ranges.
"""

from __future__ import annotations

import numpy as np

from qcc.errors import InvalidInputError, UsageError

# (full, symmetric, reduce_range) integer ranges per dtype, as ORT defines them.
_QRANGES: dict[str, tuple[tuple[int, int], tuple[int, int], tuple[int, int]]] = {
    "int4": ((-8, 7), (-7, 7), (-4, 3)),  # 4-bit weights (W4A8); symmetric like int8's [-127, 127]
    "uint4": ((0, 15), (0, 14), (0, 7)),
    "int8": ((-128, 127), (-127, 127), (-64, 64)),
    "uint8": ((0, 255), (0, 254), (0, 127)),
    "int16": ((-32768, 32767), (-32767, 32767), (-16384, 16384)),
    "uint16": ((0, 65535), (0, 65534), (0, 32767)),
}

_F32_TINY = float(np.finfo(np.float32).tiny)


def qrange(dtype: str, symmetric: bool = False, reduce_range: bool = False) -> tuple[int, int]:
    """(qmin, qmax) used to derive scale/zero point: reduce_range wins, then symmetric."""
    if dtype not in _QRANGES:
        raise UsageError(f"affine dtype must be one of {sorted(_QRANGES)}, not {dtype!r}")
    full, sym, reduced = _QRANGES[dtype]
    if reduce_range:
        return reduced
    return sym if symmetric else full


def scale_zero_point(
    rmin: np.ndarray, rmax: np.ndarray, qmin: int, qmax: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise compute_scale_zp: float32 range arithmetic, float64 scale, float32 result."""
    zero = np.float32(0)
    rmin = np.minimum(rmin.astype(np.float32), zero)
    rmax = np.maximum(rmax.astype(np.float32), zero)
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax - rmin).astype(np.float64) / (float(qmax) - float(qmin))
    if symmetric:
        zp = np.full(scale.shape, np.round((qmin + qmax) / 2.0))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.round(qmin - rmin / scale)
    degenerate = scale < _F32_TINY
    zp = np.where(degenerate, 0.0, zp).astype(np.int64)
    return np.where(degenerate, 1.0, scale).astype(np.float32), zp


def affine_params(
    lo: float,
    hi: float,
    dtype: str,
    symmetric: bool,
    reduce_range: bool = False,
    name: str = "",
) -> tuple[float, int]:
    """(scale, zero_point) for the range [lo, hi], as ORT's compute_scale_zp computes them.

    The range is widened to include 0; symmetric uses [-m, m] with m = max(|lo|, |hi|) and the
    symmetric integer range (int8 [-127, 127], zero point 0; uint8 [0, 254], zero point 127).
    scale is the float32 value (returned as a Python float). A range narrower than float32's
    smallest normal (all-zero tensor) gives ORT's choice: scale 1.0, zero point 0.
    """
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InvalidInputError(f"tensor {name!r}: range [{lo}, {hi}] is not finite")
    if lo > hi:
        raise InvalidInputError(f"tensor {name!r}: range [{lo}, {hi}] has lo > hi")
    qmin, qmax = qrange(dtype, symmetric, reduce_range)
    scale, zp = scale_zero_point(np.asarray(lo), np.asarray(hi), qmin, qmax, symmetric)
    return float(scale), int(zp)


def weight_affine_params(
    w: np.ndarray,
    axis: int | None,
    dtype: str,
    symmetric: bool,
    reduce_range: bool = False,
    name: str = "",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scales float32[C], zero_points int64[C]) from each channel's min/max.

    axis None gives per-tensor parameters as arrays of shape (). Same arithmetic as ORT's
    per-channel weight quantization (compute_data_quant_params on each channel).
    """
    w = np.asarray(w)
    if w.size == 0:
        raise InvalidInputError(f"tensor {name!r}: empty weight")
    if not np.isfinite(w).all():
        raise InvalidInputError(f"tensor {name!r}: weight contains NaN or Inf")
    if axis is None:
        rmin, rmax = w.min(), w.max()
    else:
        if not -w.ndim <= axis < w.ndim:
            raise UsageError(f"tensor {name!r}: axis {axis} out of range for shape {w.shape}")
        others = tuple(a for a in range(w.ndim) if a != axis % w.ndim)
        rmin, rmax = w.min(axis=others), w.max(axis=others)
    qmin, qmax = qrange(dtype, symmetric, reduce_range)
    return scale_zero_point(np.asarray(rmin), np.asarray(rmax), qmin, qmax, symmetric)
