"""SumPool: nnabla's SumPooling (and nnabla-c-runtime has a fixed-point kernel for it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.ops.nn import _POOL_ATTRS, _pool_infer, pool_windows
from qcc.ir.registry import OpDef, register
from qcc.ir.types import TensorType


@register
class SumPool(OpDef):
    """Sum over KHxKW windows (padding adds zeros; ceil-mode overhang adds nothing)."""

    attrs = _POOL_ATTRS

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return _pool_infer(types, attrs)

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        out = node.outputs[0].type.shape
        win = pool_windows(xs[0], node.attrs, 0.0, (int(out[2]), int(out[3])))
        return [np.nansum(win, axis=(4, 5)).astype(xs[0].dtype)]
