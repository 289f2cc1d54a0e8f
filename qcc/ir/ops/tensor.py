"""Data-movement ops: concat/split, reshapes (views), transpose, pad, slice, reductions."""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.ops._common import norm_axis, prod
from qcc.ir.registry import AttrSpec, OpDef, register
from qcc.ir.types import Dim, TensorType


@register
class Concat(OpDef):
    """Join tensors along axis."""

    inputs = ("xs*",)
    attrs = {"axis": AttrSpec("int")}
    traits = frozenset({"keeps_annotation", "rearranges", "quantizes_constants"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        first = types[0]
        axis = norm_axis(attrs["axis"], first.rank)
        total = 0
        for t in types:
            if t.rank != first.rank or t.dtype != first.dtype:
                raise ValueError(f"Concat inputs differ in rank/dtype: {first} vs {t}")
            for i, (a, b) in enumerate(zip(t.shape, first.shape)):
                if i != axis and a != b:
                    raise ValueError(f"Concat inputs differ off the axis: {first.shape} vs {t.shape}")
            if not isinstance(t.shape[axis], int):
                raise ValueError("Concat axis dimension must be static")
            total += int(t.shape[axis])
        shape = list(first.shape)
        shape[axis] = total
        return [TensorType(first.dtype, tuple(shape))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate(xs, axis=node.attrs["axis"])]


@register
class Split(OpDef):
    """Split along axis into parts of the given sizes."""

    outputs = ("ys*",)
    attrs = {"axis": AttrSpec("int"), "split": AttrSpec("ints")}
    traits = frozenset({"keeps_annotation"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axis = norm_axis(attrs["axis"], x.rank)
        if sum(attrs["split"]) != x.shape[axis] or min(attrs["split"], default=0) < 0:
            raise ValueError(f"split sizes {attrs['split']} do not add up to {x.shape[axis]}")
        out = []
        for size in attrs["split"]:
            shape = list(x.shape)
            shape[axis] = size
            out.append(TensorType(x.dtype, tuple(shape)))
        return out

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        bounds = np.cumsum(node.attrs["split"])[:-1]
        return [np.ascontiguousarray(p) for p in np.split(xs[0], bounds, axis=node.attrs["axis"])]


def _reshape_target(shape: tuple[Dim, ...], target: list[int]) -> tuple[Dim, ...]:
    out: list[Dim] = [shape[i] if d == 0 else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise ValueError(f"Reshape target {target} has more than one -1")
    if -1 in out:
        static_in = [d for d in shape if isinstance(d, int)]
        sym_in = sorted(str(d) for d in shape if not isinstance(d, int))
        sym_out = sorted(str(d) for d in out if not isinstance(d, int))
        if sym_in != sym_out:
            raise ValueError(f"cannot infer -1 in Reshape {target} of symbolic shape {shape}")
        known = prod([d for d in out if isinstance(d, int) and d != -1])
        total = prod(static_in)
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {shape} to {target}")
        out[out.index(-1)] = total // known
    elif all(isinstance(d, int) for d in shape) and prod([int(d) for d in shape]) != prod([int(d) for d in out]):
        raise ValueError(f"cannot reshape {shape} to {target}")
    return tuple(out)


@register
class Reshape(OpDef):
    """View with a new shape (0 copies the input dim, -1 is inferred)."""

    attrs = {"shape": AttrSpec("ints")}
    traits = frozenset({"view", "keeps_annotation", "rearranges"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return [TensorType(types[0].dtype, _reshape_target(types[0].shape, attrs["shape"]))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        return [x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(node.attrs["shape"])])]


@register
class Flatten(OpDef):
    """View as 2-D: dims before axis, dims from axis on."""

    attrs = {"axis": AttrSpec("int", 1)}
    traits = frozenset({"view", "keeps_annotation", "rearranges"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axis = attrs["axis"] % (x.rank + 1) if attrs["axis"] < 0 else attrs["axis"]
        head, tail = x.shape[:axis], x.shape[axis:]
        if not all(isinstance(d, int) for d in tail):
            raise ValueError("Flatten: dims after axis must be static")
        first: Dim = head[0] if len(head) == 1 else (prod([int(d) for d in head]) if all(isinstance(d, int) for d in head) else "N")
        return [TensorType(x.dtype, (first, prod([int(d) for d in tail])))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        axis = node.attrs["axis"] % (x.ndim + 1) if node.attrs["axis"] < 0 else node.attrs["axis"]
        return [x.reshape(prod(x.shape[:axis]), -1)]


@register
class Squeeze(OpDef):
    """Drop size-1 axes (a view)."""

    attrs = {"axes": AttrSpec("ints")}
    traits = frozenset({"view", "keeps_annotation", "rearranges"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axes = {norm_axis(a, x.rank) for a in attrs["axes"]}
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(f"cannot squeeze axis {a} of size {x.shape[a]}")
        return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0].reshape([d for d in node.outputs[0].type.shape]) if node.outputs[0].type.is_static
                else np.squeeze(xs[0], axis=tuple(node.attrs["axes"]))]


@register
class Unsqueeze(OpDef):
    """Insert size-1 axes (a view)."""

    attrs = {"axes": AttrSpec("ints")}
    traits = frozenset({"view", "keeps_annotation", "rearranges"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        rank = x.rank + len(attrs["axes"])
        axes = sorted(norm_axis(a, rank) for a in attrs["axes"])
        shape = list(x.shape)
        for a in axes:
            shape.insert(a, 1)
        return [TensorType(x.dtype, tuple(shape))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        rank = xs[0].ndim + len(node.attrs["axes"])
        return [np.expand_dims(xs[0], tuple(sorted(a % rank for a in node.attrs["axes"])))]


@register
class Transpose(OpDef):
    """Permute axes."""

    attrs = {"perm": AttrSpec("ints")}
    traits = frozenset({"keeps_annotation", "rearranges"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        perm = attrs["perm"]
        if sorted(perm) != list(range(x.rank)):
            raise ValueError(f"perm {perm} is not a permutation of rank {x.rank}")
        return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(np.transpose(xs[0], node.attrs["perm"]))]


@register
class Pad(OpDef):
    """Pad with pads = all begins then all ends (ONNX order)."""

    attrs = {"pads": AttrSpec("ints"), "mode": AttrSpec("str", "constant"), "value": AttrSpec("float", 0.0)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        pads = attrs["pads"]
        if len(pads) != 2 * x.rank:
            raise ValueError(f"pads needs {2 * x.rank} values, got {len(pads)}")
        if attrs["mode"] not in ("constant", "reflect", "edge"):
            raise ValueError(f"unknown pad mode {attrs['mode']!r}")
        shape = [d if isinstance(d, str) else d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape)]
        return [TensorType(x.dtype, tuple(shape))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        pads = node.attrs["pads"]
        width = [(pads[i], pads[i + x.ndim]) for i in range(x.ndim)]
        mode = node.attrs["mode"]
        if mode == "constant":
            return [np.pad(x, width, constant_values=node.attrs["value"])]
        return [np.pad(x, width, mode=mode)]


@register
class Slice(OpDef):
    """x[starts:ends:steps] on the given axes (ONNX clamping semantics)."""

    attrs = {"starts": AttrSpec("ints"), "ends": AttrSpec("ints"), "axes": AttrSpec("ints"),
             "steps": AttrSpec("ints", [])}
    traits = frozenset({"keeps_annotation"})

    @staticmethod
    def _slices(shape: tuple[Dim, ...], attrs: dict[str, Any]) -> list[slice]:
        slices = [slice(None)] * len(shape)
        steps = attrs["steps"] or [1] * len(attrs["axes"])
        for start, end, axis, step in zip(attrs["starts"], attrs["ends"], attrs["axes"], steps):
            slices[norm_axis(axis, len(shape))] = slice(start, end, step)
        return slices

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        slices = Slice._slices(x.shape, attrs)
        shape: list[Dim] = []
        for d, s in zip(x.shape, slices):
            if s == slice(None):
                shape.append(d)
            elif not isinstance(d, int):
                raise ValueError("cannot slice a symbolic dimension")
            else:
                shape.append(len(range(*s.indices(d))))
        return [TensorType(x.dtype, tuple(shape))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(xs[0][tuple(Slice._slices(xs[0].shape, node.attrs))])]


class _Reduce(OpDef):
    attrs = {"axes": AttrSpec("ints"), "keepdims": AttrSpec("bool", True)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axes = {norm_axis(a, x.rank) for a in attrs["axes"]}
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if attrs["keepdims"] else [
            d for i, d in enumerate(x.shape) if i not in axes]
        return [TensorType(x.dtype, tuple(shape))]


def _reduction(name: str, reduce: Any, doc: str) -> None:
    """Register a reduction computed in float64 (sums of many float32 terms) and cast back."""

    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        out = reduce(x.astype(np.float64), axis=tuple(node.attrs["axes"]), keepdims=node.attrs["keepdims"])
        return [np.asarray(out).astype(x.dtype)]

    register(type(name, (_Reduce,), {"name": name, "__doc__": doc, "kernel": staticmethod(kernel)}))


_reduction("ReduceMean", np.mean, "Mean over axes.")
_reduction("ReduceSum", np.sum, "Sum over axes.")
_reduction("ReduceMax", np.max, "Max over axes.")
_reduction("ReduceL2", lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
           "Euclidean norm over axes: sqrt(sum(x * x)).")


def block_transpose(node: Any) -> tuple[tuple[int, ...], list[int]]:
    """DepthToSpace/SpaceToDepth as one transpose of a 6-D view of x: (view shape, perm).

    The output is that transpose read in the output's shape (ONNX's reshape-transpose-reshape)."""
    n, c, h, w = (int(d) if isinstance(d, int) else 1 for d in node.inputs[0].type.shape)
    b = int(node.attrs["blocksize"])
    if node.op == "SpaceToDepth":
        return (n, c, h // b, b, w // b, b), [0, 3, 5, 1, 2, 4]
    if node.attrs["mode"] == "CRD":
        return (n, c // (b * b), b, b, h, w), [0, 1, 4, 2, 5, 3]
    return (n, b, b, c // (b * b), h, w), [0, 3, 4, 1, 5, 2]


class _BlockMove(OpDef):
    traits = frozenset({"keeps_annotation", "rearranges"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        view, perm = block_transpose(node)
        moved = np.transpose(x.reshape((x.shape[0], *view[1:])), perm)
        return [np.ascontiguousarray(moved).reshape((x.shape[0], *node.outputs[0].type.shape[1:]))]


def _block_infer(types: list[TensorType], attrs: dict[str, Any], to_space: bool) -> list[TensorType]:
    x = types[0]
    b = attrs["blocksize"]
    if x.rank != 4 or b < 1 or not all(isinstance(d, int) for d in x.shape[1:]):
        raise ValueError(f"needs a (N, C, H, W) input with static C, H, W and blocksize >= 1, got {x.shape}")
    n, c, h, w = x.shape
    if to_space:
        if int(c) % (b * b):
            raise ValueError(f"{c} channels are not a multiple of blocksize^2 = {b * b}")
        return [TensorType(x.dtype, (n, int(c) // (b * b), int(h) * b, int(w) * b))]
    if int(h) % b or int(w) % b:
        raise ValueError(f"spatial size {h}x{w} is not a multiple of blocksize {b}")
    return [TensorType(x.dtype, (n, int(c) * b * b, int(h) // b, int(w) // b))]


@register
class DepthToSpace(_BlockMove):
    """Channel blocks to spatial blocks (ONNX DepthToSpace; mode DCR or CRD)."""

    attrs = {"blocksize": AttrSpec("int"), "mode": AttrSpec("str", "DCR")}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        if attrs["mode"] not in ("DCR", "CRD"):
            raise ValueError(f"mode {attrs['mode']!r}: DCR or CRD")
        return _block_infer(types, attrs, to_space=True)


@register
class SpaceToDepth(_BlockMove):
    """Spatial blocks to channel blocks (ONNX SpaceToDepth)."""

    attrs = {"blocksize": AttrSpec("int")}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return _block_infer(types, attrs, to_space=False)
