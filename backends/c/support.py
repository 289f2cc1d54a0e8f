"""Target c's columns of the support matrix (docs/ops.md), read from its lowering tables.

- c-float: every op `lower.LOWERINGS` lowers.
- c-fixed: the same minus what the fixed-point lowering refuses for want of a bit-exact kernel
  (one-input ops other than Relu and `lower.FIXED_GENERIC_UNARY`, two-input ops other than
  `FIXED_BINARY`, `FLOAT_ONLY`).
- c-affine: `affine_lower.AFFINE_LOWERINGS` plus every registered one-input elementwise op,
  which runs as a lookup table (`qcc.sim.affine_int.is_table_op`).

"float" marks ops computed in float32 between integer tensors (the runtime's generic path in
fixed point, dequantize-compute-quantize in affine), "int" integer kernels, tables and copies.
When the numeric modes become objects, each reports its own column here.
"""

from __future__ import annotations

from qcc.backends.c import kernels as K
from qcc.backends.c import lower as L
from qcc.backends.c.affine_lower import AFFINE_LOWERINGS

from qcc.ir.registry import all_ops
from qcc.sim.affine_int import is_table_op

FIXED_BINARY = ("Add", "Sub", "Mul")
"""Two-input ops with a bit-exact fixed-point kernel (`lower._binary`)."""

FLOAT_ONLY = ("LRN",)
"""Ops lowered in float mode only (`lower._lrn`)."""

FLOAT_BETWEEN = ("Softmax", "BatchNorm")
"""Ops computed in float32 between integer tensors in both integer modes."""


def op_support() -> dict[str, dict[str, str]]:
    float_ops = set(L.LOWERINGS)
    refused = {op for op in K.UNARY if op not in ("Relu", *L.FIXED_GENERIC_UNARY)}
    refused |= {op for op in K.BINARY_F32 if op not in FIXED_BINARY} | set(FLOAT_ONLY)
    generic = {*L.FIXED_GENERIC_UNARY, *FLOAT_BETWEEN}
    affine = set(AFFINE_LOWERINGS) | {op for op in all_ops() if is_table_op(op)}
    return {
        "c-float": dict.fromkeys(float_ops, "yes"),
        "c-fixed": {op: "float" if op in generic else "int" for op in float_ops - refused},
        "c-affine": {op: "float" if op in FLOAT_BETWEEN else "int" for op in affine},
    }
