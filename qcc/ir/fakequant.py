"""Applying a quantization annotation to a float tensor (simulation of storage).

Part of the IR because the `Quantize` op's reference kernel is exactly this; the numerics it
uses (`qcc.quant.numerics`) are plain numpy and know nothing of the IR.
"""

from __future__ import annotations

import numpy as np

from qcc.ir.types import Affine, FixedPoint, Float32, QuantType, Sign


def apply_annotation(x: np.ndarray, quant: QuantType | None, rounding: str | None = None) -> np.ndarray:
    """x as it reads back after being stored in `quant` (float in, float out).

    Fixed point rounds as the annotation says (`FixedPoint.rounding`: how its producer stores
    values) unless `rounding` overrides it (parameters are always rounded half to even).
    """
    from qcc.quant import numerics

    if quant is None or isinstance(quant, Float32):
        return x
    if isinstance(quant, FixedPoint):
        q = numerics.quantize_fixed(x, quant.bits, quant.frac, rounding=rounding or quant.rounding)
        return numerics.dequantize_fixed(q, quant.frac).astype(x.dtype)
    if isinstance(quant, Affine):
        scale = np.asarray(quant.scale, dtype=np.float32)
        zp = np.asarray(quant.zero_point, dtype=np.int64)
        axis = quant.axis
        if axis is None:
            scale, zp = scale[0], zp[0]
        return numerics.fake_quant_affine(x, scale, zp, quant.dtype, axis=axis).astype(x.dtype, copy=False)
    if isinstance(quant, Sign):
        return np.where(x >= 0, 1.0, -1.0).astype(x.dtype)
    raise TypeError(f"unknown annotation {quant!r}")
