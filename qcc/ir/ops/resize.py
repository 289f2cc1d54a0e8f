"""Resize: nearest and linear interpolation with ONNX's coordinate transformations.

The coordinate plan of one axis (which input elements and weights make each output element) is
computed once by `axis_plan`, in float32 one operation at a time as ONNX Runtime computes it,
and shared by the reference kernel, the simulators and the C kernels, so every target picks the
same neighbours.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from qcc.ir.registry import AttrSpec, OpDef, register
from qcc.ir.types import Dim, TensorType

F32 = np.float32
MODES = ("nearest", "linear")
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                    "half_pixel_symmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@attrs.frozen
class AxisPlan:
    """Output element i reads input elements lo[i] and hi[i] with weights w_lo[i], w_hi[i]
    (float32; nearest: lo == hi, weights 1 and 0)."""

    lo: np.ndarray
    hi: np.ndarray
    w_lo: np.ndarray
    w_hi: np.ndarray

    @property
    def identity(self) -> bool:
        return len(self.lo) == len(self.hi) and bool(np.array_equal(self.lo, np.arange(len(self.lo)))) and \
            bool(np.array_equal(self.lo, self.hi))


def source_coordinates(size_in: int, size_out: int, scale: float, mode: str) -> np.ndarray:
    """Where each output element lies in the input (float32, ONNX Runtime's formulas)."""
    x = np.arange(size_out, dtype=F32)
    s = F32(scale)
    if mode == "asymmetric":
        return x / s
    if mode == "align_corners":
        if size_out == 1:
            return np.zeros(1, F32)
        return x * F32(size_in - 1) / F32(size_out - 1)
    if mode == "pytorch_half_pixel":
        return (x + F32(0.5)) / s - F32(0.5) if size_out > 1 else np.zeros(size_out, F32)
    if mode == "tf_half_pixel_for_nn":
        return (x + F32(0.5)) / s
    if mode == "half_pixel_symmetric":
        adjustment = F32(size_out) / (F32(size_in) * s)
        center = F32(size_in) / F32(2)
        offset = center * (F32(1) - adjustment)
        return offset + (x + F32(0.5)) / s - F32(0.5)
    if mode == "half_pixel":
        return (x + F32(0.5)) / s - F32(0.5)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest(x: np.ndarray, mode: str) -> np.ndarray:
    floor = np.floor(x)
    if mode == "floor":
        return floor
    if mode == "ceil":
        return np.ceil(x)
    frac = x - floor  # exact in float32
    if mode not in ("round_prefer_floor", "round_prefer_ceil"):
        raise ValueError(f"unknown nearest_mode {mode!r}")
    tie = floor if mode == "round_prefer_floor" else floor + 1
    return np.where(frac < F32(0.5), floor, np.where(frac > F32(0.5), floor + 1, tie))


def axis_plan(size_in: int, size_out: int, scale: float, attrs: dict[str, Any]) -> AxisPlan:
    coords = source_coordinates(size_in, size_out, scale, attrs["coordinate_transformation_mode"])
    last = size_in - 1
    if attrs["mode"] == "nearest":
        index = np.clip(_nearest(coords, attrs["nearest_mode"]), 0, last).astype(np.int64)
        return AxisPlan(index, index, np.ones(size_out, F32), np.zeros(size_out, F32))
    coords = np.clip(coords, F32(0), F32(last))
    lo = np.floor(coords).astype(np.int64)
    hi = np.minimum(lo + 1, last)
    w_hi = (coords - lo.astype(F32)).astype(F32)
    return AxisPlan(lo, hi, (F32(1) - w_hi).astype(F32), w_hi)


def plans(node: Any) -> list[AxisPlan | None]:
    """Per axis, its plan (None for an axis the node leaves as it is: same size, scale 1)."""
    x, y = node.inputs[0].type.shape, node.outputs[0].type.shape
    out: list[AxisPlan | None] = []
    for size_in, size_out, scale in zip(x, y, node.attrs["scales"]):
        if not isinstance(size_in, int) or not isinstance(size_out, int) or (size_in == size_out and scale == 1.0):
            out.append(None)  # unchanged (ONNX Runtime copies such an axis whatever the coordinate mode)
            continue
        plan = axis_plan(size_in, size_out, scale, node.attrs)
        out.append(None if plan.identity and size_in == size_out else plan)
    return out


@register
class Resize(OpDef):
    """Nearest or linear interpolation of every axis to `sizes` (ONNX Resize semantics).

    `scales` are the factors of the coordinate transformation (ONNX's scales, or sizes / input
    sizes when the source gave sizes); a size 0 keeps the input's size (a symbolic batch).
    """

    attrs = {
        "sizes": AttrSpec("ints"),
        "scales": AttrSpec("floats"),
        "mode": AttrSpec("str", "nearest"),
        "coordinate_transformation_mode": AttrSpec("str", "half_pixel"),
        "nearest_mode": AttrSpec("str", "round_prefer_floor"),
    }
    traits = frozenset({"keeps_annotation"})  # nearest copies, linear mixes two neighbours: in range

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        if attrs["mode"] not in MODES or attrs["coordinate_transformation_mode"] not in COORDINATE_MODES or \
                attrs["nearest_mode"] not in NEAREST_MODES:
            raise ValueError(f"mode {attrs['mode']!r}, coordinate_transformation_mode "
                             f"{attrs['coordinate_transformation_mode']!r}, nearest_mode {attrs['nearest_mode']!r}: "
                             f"choose from {MODES}, {COORDINATE_MODES}, {NEAREST_MODES}")
        if len(attrs["sizes"]) != x.rank or len(attrs["scales"]) != x.rank:
            raise ValueError(f"sizes {attrs['sizes']} and scales {attrs['scales']} need {x.rank} values")
        shape: list[Dim] = []
        for d, size, scale in zip(x.shape, attrs["sizes"], attrs["scales"]):
            if size < 0 or scale <= 0 or (size == 0 and scale != 1.0):
                raise ValueError(f"size {size} with scale {scale}: sizes must be >= 0 (0 with scale 1 keeps "
                                 "the input's size) and scales > 0")
            if not isinstance(d, int) and size not in (0, 1) and scale != 1.0:
                raise ValueError(f"cannot resize the symbolic dimension {d!r}")
            shape.append(d if size == 0 else size)
        return [TensorType(x.dtype, tuple(shape))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        y: np.ndarray = x.astype(np.float64)
        for axis, plan in enumerate(plans(node)):
            if plan is None:
                continue
            lo = np.take(y, plan.lo, axis=axis)
            if node.attrs["mode"] == "nearest":
                y = lo
                continue
            shape = [1] * y.ndim
            shape[axis] = -1
            hi = np.take(y, plan.hi, axis=axis)
            y = lo * plan.w_lo.astype(np.float64).reshape(shape) + hi * plan.w_hi.astype(np.float64).reshape(shape)
        return [np.ascontiguousarray(y.astype(x.dtype))]
