"""SumPool: nnabla's SumPooling (nnabla-c-runtime has a fixed-point kernel for it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.ops.nn import MaxPool, pool_windows
from qcc.ir.registry import register


@register
class SumPool(MaxPool):
    """Sum over KHxKW windows (padding adds zeros; ceil-mode overhang adds nothing).

    Same attributes and shape rule as MaxPool, whose schema it reuses.
    """

    name = "SumPool"
    traits = frozenset()  # sums: unlike MaxPool, a new range

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        out = node.outputs[0].type.shape
        win = pool_windows(xs[0], node.attrs, 0.0, (int(out[2]), int(out[3])))
        return [np.nansum(win, axis=(4, 5)).astype(xs[0].dtype)]
