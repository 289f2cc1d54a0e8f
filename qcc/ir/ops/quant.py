"""Quantization ops: explicit quantize points in the graph."""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.registry import AttrSpec, OpDef, register


@register
class Quantize(OpDef):
    """Fake-quantize x to its output's annotation (identity while the annotation is unset).

    The seed's MinMaxQuantize layers become Quantize nodes; `calibrate` and
    `assign-fixed-point` fill the output value's annotation, which this kernel then applies.
    """

    attrs = {"label": AttrSpec("str", "")}
    traits = frozenset({"elementwise", "inplace", "quantize", "quantizes_constants"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        from qcc.ir.fakequant import apply_annotation

        return [apply_annotation(xs[0], node.outputs[0].quant)]
