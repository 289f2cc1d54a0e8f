"""Float32 kernels with a fixed operation order: what target c computes for ops without integer
kernels (normalizations, linear resize, reductions), in every numeric mode.

The C kernels (backends/c/kernels/) read each element through the mode's getter, run exactly
these float32 operations in this order (sums sequential in index order, one operation per
statement, sqrt correctly rounded) and store through the setter. `qcc.sim.affine_int` runs
them between dequantization and quantization, so affine C output is bit-identical to it.
Sequential float32 sums are `np.cumsum` (an accumulation, never numpy's pairwise reduction).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.ops._common import norm_axis
from qcc.ir.ops.normalization import groups_of
from qcc.ir.ops.resize import AxisPlan, plans

F32 = np.float32


def sequential_sum(rows: np.ndarray) -> np.ndarray:
    """Sum along axis 1, left to right in float32: (outer, n, inner) -> (outer, inner)."""
    if rows.shape[1] == 0:
        return np.zeros((rows.shape[0], rows.shape[2]), F32)
    return np.cumsum(rows.astype(F32, copy=False), axis=1, dtype=F32)[:, -1]


def _moments(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sqrt(var + eps) is the caller's) of (outer, n, inner) rows along axis 1:
    mean = sum / n, var = sum((v - mean)^2) / n."""
    n = F32(rows.shape[1])
    mean = sequential_sum(rows) / n
    d = rows - mean[:, None, :]
    var = sequential_sum(d * d) / n
    return mean, var


def layernorm(node: Any, x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
    """Per row of the normalized axes: d = (v - mean) / sqrtf(var + eps), then d * scale[k], + bias[k]."""
    axis = norm_axis(node.attrs["axis"], x.ndim)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    rows = np.asarray(x, F32).reshape(outer, -1, 1)
    mean, var = _moments(rows)
    std = np.sqrt(var + F32(node.attrs["epsilon"]))
    y = (rows - mean[:, None, :]) / std[:, None, :]
    if scale is not None:
        y = y * np.asarray(scale, F32).reshape(1, -1, 1)
    if bias is not None:
        y = y + np.asarray(bias, F32).reshape(1, -1, 1)
    return y.reshape(x.shape)


def groupnorm(node: Any, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """GroupNorm and InstanceNorm: moments per (sample, group), then (v - mean) / std * scale[c] + bias[c]."""
    n, c = x.shape[:2]
    groups = groups_of(node)
    rows = np.asarray(x, F32).reshape(n * groups, -1, 1)
    mean, var = _moments(rows)
    std = np.sqrt(var + F32(node.attrs["epsilon"]))
    y = ((rows - mean[:, None, :]) / std[:, None, :]).reshape(n, c, -1)
    y = y * np.asarray(scale, F32).reshape(1, c, 1)
    y = y + np.asarray(bias, F32).reshape(1, c, 1)
    return y.reshape(x.shape)


def resize_axes(node: Any) -> tuple[AxisPlan, AxisPlan]:
    """The (height, width) plans of a Resize that changes at most its last two axes (the C
    kernel's form; an unchanged axis gets the identity plan)."""
    shape = node.inputs[0].type.shape
    found = plans(node)
    if any(p is not None for p in found[:-2]) or len(shape) < 2:
        raise ValueError("only the last two axes may be resized")
    out: list[AxisPlan] = []
    for plan, size in zip(found[-2:], shape[-2:]):
        if plan is None:
            index = np.arange(int(size), dtype=np.int64)
            plan = AxisPlan(index, index, np.ones(len(index), F32), np.zeros(len(index), F32))
        out.append(plan)
    return out[0], out[1]


def resize_linear(node: Any, x: np.ndarray) -> np.ndarray:
    """top = x[y0][x0] * wl_x + x[y0][x1] * wh_x (same for the bottom row y1), then
    top * wl_y + bottom * wh_y, each product and sum rounded to float32."""
    py, px = resize_axes(node)
    v = np.asarray(x, F32).reshape(-1, x.shape[-2], x.shape[-1])

    def row(index: np.ndarray) -> np.ndarray:
        r = v[:, index]
        return r[:, :, px.lo] * px.w_lo + r[:, :, px.hi] * px.w_hi

    top, bottom = row(py.lo), row(py.hi)
    y = top * py.w_lo[:, None] + bottom * py.w_hi[:, None]
    return y.reshape(*x.shape[:-2], len(py.lo), len(px.lo))


def reduce_geometry(node: Any, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(outer, reduced, inner) of a reduction over consecutive axes (the C kernel's form)."""
    axes = sorted(norm_axis(a, len(shape)) for a in node.attrs["axes"])
    if axes != list(range(axes[0], axes[-1] + 1)):
        raise ValueError(f"reduction over axes {axes}: only consecutive axes")
    prod = lambda dims: int(np.prod(dims, dtype=np.int64))  # noqa: E731
    return prod(shape[:axes[0]]), prod(shape[axes[0]:axes[-1] + 1]), prod(shape[axes[-1] + 1:])


def reduce(node: Any, x: np.ndarray) -> np.ndarray:
    """Sequential float32 sum (ReduceSum), / count (ReduceMean), of squares then sqrtf
    (ReduceL2), or the maximum (ReduceMax)."""
    outer, red, inner = reduce_geometry(node, x.shape)
    rows = np.asarray(x, F32).reshape(outer, red, inner)
    if node.op == "ReduceMax":
        out = rows.max(axis=1)
    elif node.op == "ReduceL2":
        out = np.sqrt(sequential_sum(rows * rows))
    else:
        out = sequential_sum(rows)
        if node.op == "ReduceMean":
            out = out / F32(red)
    return out.reshape(_shape_like(node, x.shape))


def _shape_like(node: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    axes = {norm_axis(a, len(shape)) for a in node.attrs["axes"]}
    if node.attrs["keepdims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _kernel(op: str, attrs: dict[str, Any], xs: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    """One reference kernel on float32 arrays, for a node that exists only here."""
    from types import SimpleNamespace

    from qcc.ir.registry import get_schema
    from qcc.ir.types import TensorType

    schema = get_schema(op)
    node = SimpleNamespace(op=op, attrs=schema.complete_attrs(attrs, op),
                           outputs=[SimpleNamespace(type=TensorType("float32", out_shape))])
    return np.asarray(schema.kernel(node, xs)[0], dtype=F32)


def lrn(node: Any, x: np.ndarray) -> np.ndarray:
    """LRN as the .nnb functions compute it (backends/nnb/lower_layers.py): x * x, the channel
    window sum (a SumPooling of the (N, 1, C, H*W) view), * alpha / size, + bias, ** beta, then
    x / that: each step the reference kernel of its op in float32."""
    a = node.attrs
    n, c, h, w = x.shape
    size = int(a["size"])
    lo = (size - 1) // 2
    x = np.asarray(x, F32)
    planes = (x * x).reshape(n, 1, c, h * w)
    sums = _kernel("SumPool", {"kernel": [size, 1], "strides": [1, 1], "pads": [lo, 0, size - 1 - lo, 0]}, [planes],
                   (n, 1, c, h * w)).reshape(x.shape)
    d = sums * F32(a["alpha"] / size)
    d = d + F32(a["bias"])
    d = np.power(d, np.full((1, 1, 1, 1), a["beta"], F32))
    return np.asarray(x / d, dtype=F32)
