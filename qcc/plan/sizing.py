"""Bytes per tensor for memory planning: the IR's annotations, or a quantization scheme's widths.

`qcc inspect --quantize SCHEME` sizes a float model as the scheme would store it without running
the scheme's pipeline, so planning and reporting can answer "does it fit" before calibration.
Annotations already present in the IR always win (a compiled or .nnb model is sized as stored).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from qcc.errors import UsageError
from qcc.ir.core import Value
from qcc.ir.registry import get_schema
from qcc.ir.types import DTYPES, storage_bytes

Sizer = Callable[[Value], int]



@attrs.frozen
class SchemeWidths:
    """Bytes per element of float tensors under a scheme, by role."""

    activation: float
    parameter: float
    weight: float
    bias: float


SCHEME_WIDTHS: dict[str, SchemeWidths] = {
    "none": SchemeWidths(4, 4, 4, 4),
    "fixed8": SchemeWidths(1, 1, 1, 1),
    "fixed16": SchemeWidths(2, 2, 2, 2),
    "fixed8-16": SchemeWidths(2, 1, 1, 1),
    "fixed4": SchemeWidths(1, 1, 1 / 2, 1),  # 4-bit fixed-point weights, two a byte (target c)
    "int8": SchemeWidths(1, 1, 1, 4),
    "uint8": SchemeWidths(1, 1, 1, 4),
    "int4": SchemeWidths(1, 1, 1 / 2, 4),  # W4A8: two 4-bit weights a byte
    "uint4": SchemeWidths(1, 1, 1 / 2, 4),
    "binary-weight": SchemeWidths(4, 4, 1 / 8, 4),
    "binary-connect": SchemeWidths(4, 4, 1 / 8, 4),
}


def ir_size(value: Value) -> int:
    """Storage of a value as the IR declares it (annotation, else dtype; symbolic dims = 1)."""
    return storage_bytes(value.type, value.quant)


def scheme_sizer(scheme: str) -> Sizer:
    """A sizer for `scheme` ("" or "ir": the IR as it is)."""
    if scheme in ("", "ir"):
        return ir_size
    widths = SCHEME_WIDTHS.get(scheme)
    if widths is None:
        known = ", ".join(["ir", *SCHEME_WIDTHS])
        raise UsageError(f"unknown sizing scheme {scheme!r}; known: {known}")

    def size(value: Value) -> int:
        if value.quant is not None or DTYPES[value.type.dtype].kind != "f":
            return ir_size(value)
        return math.ceil(value.type.numel() * _role_width(value, widths))

    return size


def _role_width(value: Value, widths: SchemeWidths) -> float:
    if not value.is_const:
        return widths.activation
    # the registry's input roles: a weight (binary schemes store one bit per element), a bias
    # (int8/uint8 schemes keep it in int32, as ONNX QDQ does), else an ordinary parameter
    kinds = {get_schema(node.op).role(index).kind for node, index in value.uses()}
    if "weight" in kinds:
        return widths.weight
    if "bias" in kinds:
        return widths.bias
    return widths.parameter
