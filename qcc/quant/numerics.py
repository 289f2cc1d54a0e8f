"""The quantize/dequantize arithmetic every part of qcc shares (simulation, backends, tests).

Affine follows ONNX QuantizeLinear/DequantizeLinear as ONNX Runtime computes them: x / scale in
float32 (float64 for int32 biases, as ORT's quantizer does), round half to even, add the zero
point, saturate to the dtype; dequantize is (q - zp) * scale in float32.

Fixed point follows nnabla (.nnb FIXED8/FIXED16): value = q * 2**-frac with q saturated to the
full two's-complement range of `bits`: FIXED8 [-128, 127], FIXED16 [-32768, 32767] (nnabla's
converter: np.clip(round(x * 2**fp), -0x7fff - 1, 0x7fff) / (-128, 127); nnabla-c-runtime's
set_int8/set_int16 and saturate*_to_8/16 use INT8_MIN..INT8_MAX / INT16_MIN..INT16_MAX).
Rounding 'half_even' is the converter's for parameters (np.round); 'trunc' is the runtime's for
everything it computes (setters cast float to int, kernels rescale by C integer division).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.errors import UsageError

AFFINE_DTYPES: dict[str, tuple[int, int]] = {
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1),
}

ROUNDINGS = ("half_even", "trunc")

NUMPY_STORAGE = {"int4": "int8", "uint4": "uint8"}
"""numpy has no 4-bit integers: int4/uint4 values are held in the 8-bit type of the same sign."""


def clamp(x: np.ndarray, lo: float | np.floating[Any] | None, hi: float | np.floating[Any] | None,
          out: np.ndarray | None = None) -> np.ndarray:
    """np.clip(x, lo, hi) with either bound optional (None: none on that side), into `out` (x
    itself may be it), in x's dtype: the same bits, NaN and signed zeros included.

    numpy 1.26 compares an array with a scalar in a loop 3-5x slower than with an array of the
    same layout (np.clip's and np.maximum's scalar paths: ReLU6 took a third of a float run's
    elementwise time). A C-contiguous x is compared, `_ROW` values at a time, with a row holding
    the bound (kept per dtype and value); anything else takes numpy's path."""
    x = np.asarray(x)
    result = out if out is not None else np.empty_like(x)
    rows = x.dtype.kind == "f" and x.flags.c_contiguous and result.flags.c_contiguous and x.size >= _ROW
    source = x
    for bound, op in ((lo, np.maximum), (hi, np.minimum)):
        if bound is None:
            continue
        value = x.dtype.type(bound)
        if rows:
            flat_in, flat_out, whole = source.reshape(-1), result.reshape(-1), x.size // _ROW * _ROW
            op(flat_in[:whole].reshape(-1, _ROW), _bound_row(value), out=flat_out[:whole].reshape(-1, _ROW))
            op(flat_in[whole:], value, out=flat_out[whole:])
        else:
            op(source, value, out=result)
        source = result
    if source is x:
        np.copyto(result, x)
    return result


_ROW = 1 << 14
_BOUND_ROWS: dict[tuple[str, bytes], np.ndarray] = {}


def _bound_row(value: np.floating[Any]) -> np.ndarray:
    key = (value.dtype.str, value.tobytes())
    row = _BOUND_ROWS.get(key)
    if row is None:
        row = _BOUND_ROWS[key] = np.full(_ROW, value, dtype=value.dtype)
        row.flags.writeable = False
    return row


def fixed_bounds(bits: int) -> tuple[int, int]:
    """Saturation bounds of a signed `bits`-bit fixed-point value (nnabla: full range)."""
    if not 2 <= bits <= 32:
        raise UsageError(f"fixed-point bits must be in 2..32, not {bits}")
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def fixed_container_bits(bits: int) -> int:
    """The width of the integer type `bits`-bit fixed point computes in: fixed4's 4-bit weights in
    8 bits (nnabla-c-runtime has no 4-bit type; -8..7 fit in FIXED8 at the same position, so every
    kernel computes exactly what it computes for FIXED8 weights holding those values)."""
    return 8 if bits <= 8 else 16 if bits <= 16 else 32


def _fixed_storage(bits: int) -> np.dtype:
    return np.dtype(np.int8 if bits <= 8 else np.int16 if bits <= 16 else np.int32)


def _channel_shape(x: np.ndarray, values: np.ndarray, axis: int | None) -> np.ndarray:
    """Per-channel parameters reshaped to broadcast along `axis` of x."""
    if axis is None or values.ndim == 0:
        return values
    if not -x.ndim <= axis < x.ndim:
        raise UsageError(f"quantization axis {axis} out of range for shape {x.shape}")
    shape = [1] * x.ndim
    shape[axis] = -1
    return values.reshape(shape)


def quantize_affine(
    x: np.ndarray,
    scale: float | np.ndarray,
    zero_point: int | np.ndarray,
    dtype: str,
    axis: int | None = None,
) -> np.ndarray:
    """q = saturate(round_half_even(x / scale) + zero_point) as `dtype`; per channel with axis."""
    if dtype not in AFFINE_DTYPES:
        raise UsageError(f"affine dtype must be one of {sorted(AFFINE_DTYPES)}, not {dtype!r}")
    work = np.float64 if dtype == "int32" else np.float32
    x = np.asarray(x, dtype=work)
    s = _channel_shape(x, np.asarray(scale, dtype=work), axis)
    zp = _channel_shape(x, np.asarray(zero_point, dtype=work), axis)
    lo, hi = AFFINE_DTYPES[dtype]
    q = np.asarray(x / s)  # a 0-d input gives a numpy scalar, which cannot be written in place
    np.rint(q, out=q)
    q += zp
    np.clip(q, lo, hi, out=q)
    return q.astype(NUMPY_STORAGE.get(dtype, dtype))


def dequantize_affine(
    q: np.ndarray,
    scale: float | np.ndarray,
    zero_point: int | np.ndarray,
    axis: int | None = None,
) -> np.ndarray:
    """(q - zero_point) * scale in float32."""
    q = np.asarray(q)
    zp = _channel_shape(q, np.asarray(zero_point, dtype=np.int64), axis)
    s = _channel_shape(q, np.asarray(scale, dtype=np.float32), axis)
    return (q.astype(np.int64) - zp).astype(np.float32) * s


def fake_quant_affine(
    x: np.ndarray,
    scale: float | np.ndarray,
    zero_point: int | np.ndarray,
    dtype: str,
    axis: int | None = None,
) -> np.ndarray:
    """x after an affine round trip (QuantizeLinear then DequantizeLinear), float32.

    Up to 16-bit storage every intermediate of that round trip is an integer below 2**24, exact in
    float32: the result is computed there, in place, without the integer copies (the bits of
    quantize_affine then dequantize_affine, in under half the time: simulation's hot spot;
    bench/bench_fake_quant.py)."""
    x = np.asarray(x)
    if dtype not in AFFINE_DTYPES or dtype == "int32" or x.ndim == 0:
        return dequantize_affine(quantize_affine(x, scale, zero_point, dtype, axis), scale, zero_point, axis)
    x = np.asarray(x, dtype=np.float32)
    s = _channel_shape(x, np.asarray(scale, dtype=np.float32), axis)
    zp = _channel_shape(x, np.asarray(zero_point, dtype=np.float32), axis)
    lo, hi = AFFINE_DTYPES[dtype]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN stays NaN; x / s past float32 saturates
        q = np.divide(x, s)
        np.rint(q, out=q)
        q += zp
        clamp(q, lo, hi, out=q)
        q -= zp
        q *= s
    return q


def quantize_fixed(x: np.ndarray, bits: int, frac: int, rounding: str = "half_even") -> np.ndarray:
    """Signed integers q with q * 2**-frac ~ x, saturated to fixed_bounds(bits).

    Stored as int8 / int16 / int32 for bits <= 8 / 16 / 32. The scaling by 2**frac is exact;
    'trunc' rounds toward zero (nnabla-c-runtime), 'half_even' to nearest even (nnabla's
    converter). NaN has no defined result, as in the runtime.
    """
    if rounding not in ROUNDINGS:
        raise UsageError(f"rounding must be one of {ROUNDINGS}, not {rounding!r}")
    lo, hi = fixed_bounds(bits)
    x = np.asarray(x)
    work = np.float64 if bits > 24 or x.dtype == np.float64 else np.float32
    t = np.ldexp(np.asarray(x, dtype=work), frac)
    q = np.asarray(np.rint(t) if rounding == "half_even" else np.trunc(t))  # 0-d: an array, not a scalar
    np.clip(q, lo, hi, out=q)
    return q.astype(_fixed_storage(bits))


def dequantize_fixed(q: np.ndarray, frac: int) -> np.ndarray:
    """q * 2**-frac in float32 (exact for |q| < 2**24)."""
    return np.ldexp(np.asarray(q, dtype=np.float32), -frac)
