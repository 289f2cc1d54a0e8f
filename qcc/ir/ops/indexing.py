"""Indexing ops: Gather (constant indices into a computed tensor), ArgMax and TopK.

ArgMax's output and TopK's second output are int64 element indices: no quantization annotation
ever applies to them, and the targets store them as integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.ops._common import norm_axis
from qcc.ir.registry import AttrSpec, OpDef, register
from qcc.ir.types import Dim, TensorType


def gather_indices(node: Any) -> np.ndarray:
    """The constant indices of a Gather, in their shape (non-negative)."""
    return np.asarray(node.attrs["indices"], dtype=np.int64).reshape(node.attrs["indices_shape"])


@register
class Gather(OpDef):
    """x.take(indices, axis): indices are constants (attributes), x any tensor."""

    attrs = {"axis": AttrSpec("int", 0), "indices": AttrSpec("ints"), "indices_shape": AttrSpec("ints")}
    traits = frozenset({"keeps_annotation", "rearranges"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axis = norm_axis(attrs["axis"], x.rank)
        size = x.shape[axis]
        count = int(np.prod(attrs["indices_shape"], dtype=np.int64))
        if count != len(attrs["indices"]):
            raise ValueError(f"{len(attrs['indices'])} indices for shape {attrs['indices_shape']}")
        if not isinstance(size, int):
            raise ValueError(f"cannot gather along the symbolic dimension {size!r}")
        if any(not 0 <= i < size for i in attrs["indices"]):
            raise ValueError(f"indices must lie in [0, {size})")
        shape: tuple[Dim, ...] = (*x.shape[:axis], *attrs["indices_shape"], *x.shape[axis + 1:])
        return [TensorType(x.dtype, shape)]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        axis = norm_axis(node.attrs["axis"], xs[0].ndim)
        return [np.ascontiguousarray(np.take(xs[0], gather_indices(node), axis=axis))]


def _reduced_shape(x: TensorType, axis: int, keepdims: bool, size: Dim = 1) -> tuple[Dim, ...]:
    axis = norm_axis(axis, x.rank)
    if keepdims:
        return (*x.shape[:axis], size, *x.shape[axis + 1:])
    return (*x.shape[:axis], *x.shape[axis + 1:])


@register
class ArgMax(OpDef):
    """Index of the largest element along axis (int64; the first one on ties unless select_last_index)."""

    attrs = {"axis": AttrSpec("int", 0), "keepdims": AttrSpec("bool", True),
             "select_last_index": AttrSpec("bool", False)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return [TensorType("int64", _reduced_shape(types[0], attrs["axis"], attrs["keepdims"]))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        axis = norm_axis(node.attrs["axis"], x.ndim)
        if node.attrs["select_last_index"]:
            index = x.shape[axis] - 1 - np.argmax(np.flip(x, axis=axis), axis=axis)
        else:
            index = np.argmax(x, axis=axis)
        if node.attrs["keepdims"]:
            index = np.expand_dims(index, axis)
        return [np.ascontiguousarray(index.astype(np.int64))]


def topk_order(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    """Indices of the k largest (smallest) elements along axis, ties broken by the lower index."""
    keys = -x if largest else x
    return np.take(np.argsort(keys, axis=axis, kind="stable"), np.arange(k), axis=axis)


@register
class TopK(OpDef):
    """The k largest (or smallest) elements along axis, sorted, and their int64 indices."""

    outputs = ("values", "indices")
    attrs = {"k": AttrSpec("int"), "axis": AttrSpec("int", -1), "largest": AttrSpec("bool", True)}
    traits = frozenset({"keeps_annotation"})  # the values are input values

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axis = norm_axis(attrs["axis"], x.rank)
        size = x.shape[axis]
        if not isinstance(size, int) or not 1 <= attrs["k"] <= size:
            raise ValueError(f"k = {attrs['k']} must lie in [1, {size}] (a static axis)")
        shape = _reduced_shape(x, axis, True, attrs["k"])
        return [TensorType(x.dtype, shape), TensorType("int64", shape)]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        axis = norm_axis(node.attrs["axis"], x.ndim)
        order = topk_order(x, node.attrs["k"], axis, node.attrs["largest"])
        return [np.ascontiguousarray(np.take_along_axis(x, order, axis=axis)), np.ascontiguousarray(order)]
