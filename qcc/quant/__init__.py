"""Calibration statistics, range choice and quantization arithmetic (numpy only, IR-free)."""

from __future__ import annotations

from qcc.quant.affine import affine_params, qrange, weight_affine_params
from qcc.quant.fixedpoint import (
    fixed_point_position,
    nnabla_int_bits,
    param_fixed_point_position,
)
from qcc.quant.numerics import (
    AFFINE_DTYPES,
    dequantize_affine,
    dequantize_fixed,
    fake_quant_affine,
    fixed_bounds,
    quantize_affine,
    quantize_fixed,
)
from qcc.quant.ranges import (
    RANGE_METHODS,
    ZERO_TENSOR_RANGE,
    choose_range,
    entropy,
    minmax,
    mse,
    percentile,
)
from qcc.quant.stats import TensorStats

__all__ = [
    "AFFINE_DTYPES",
    "RANGE_METHODS",
    "ZERO_TENSOR_RANGE",
    "TensorStats",
    "affine_params",
    "choose_range",
    "dequantize_affine",
    "dequantize_fixed",
    "entropy",
    "fake_quant_affine",
    "fixed_bounds",
    "fixed_point_position",
    "minmax",
    "mse",
    "nnabla_int_bits",
    "param_fixed_point_position",
    "percentile",
    "qrange",
    "quantize_affine",
    "quantize_fixed",
    "weight_affine_params",
]
