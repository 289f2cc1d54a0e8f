"""ONNX importers of detection, segmentation, OCR and transformer layers: PRelu, the
normalizations, Resize/Upsample, DepthToSpace/SpaceToDepth, ArgMax, TopK and Gather on
computed tensors. Registered in `qcc.frontends.onnx.IMPORTERS` (which loads this module).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qcc.errors import UnsupportedError
from qcc.frontends.onnx import _Ctx, importer
from qcc.ir.ops._common import norm_axis
from qcc.ir.types import Dim

F32 = np.float32


def text(attrs: dict[str, Any], key: str, default: str) -> str:
    value = attrs.get(key, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def refuse(ctx: _Ctx, node: Any, why: str) -> UnsupportedError:
    return UnsupportedError(f"{ctx.source}: node {node.name!r} ({node.op_type}): {why}")


def only_first_output(ctx: _Ctx, node: Any, what: str) -> None:
    if any(name for name in node.output[1:]):
        raise refuse(ctx, node, f"its {what} output(s) are not supported (only Y)")


def _input(ctx: _Ctx, node: Any, index: int) -> Any:
    value = ctx.value(node.input[index])
    assert value is not None
    return value


# ----------------------------------------------------------------------------- activations
@importer("PRelu", emits=("PRelu",))
def _prelu(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ctx.emit(node, "PRelu", [_input(ctx, node, 0), _input(ctx, node, 1)])


# ----------------------------------------------------------------------------- normalization
@importer("LayerNormalization", emits=("LayerNorm",))
def _layer_norm(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    only_first_output(ctx, node, "Mean/InvStdDev")
    ins = [ctx.value(n) for n in node.input[:3]]
    ctx.emit(node, "LayerNorm", ins, {"axis": int(attrs.get("axis", -1)), "epsilon": float(attrs.get("epsilon", 1e-5))})


@importer("InstanceNormalization", emits=("InstanceNorm",))
def _instance_norm(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ins = [ctx.value(n) for n in node.input[:3]]
    ctx.emit(node, "InstanceNorm", ins, {"epsilon": float(attrs.get("epsilon", 1e-5))})


@importer("GroupNormalization", emits=("GroupNorm",))
def _group_norm(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    """Opset 18 gives one scale and bias per group: repeated over the group's channels (opset 21's form)."""
    x = _input(ctx, node, 0)
    groups = int(attrs["num_groups"])
    channels = x.type.shape[1]
    params = []
    for name in node.input[1:3]:
        data = ctx.const(name, node).astype(F32)
        if data.shape == (groups,) and isinstance(channels, int) and channels != groups:
            data = np.repeat(data, channels // groups)
            params.append(ctx.graph.add_constant(ctx.graph.unique_name(f"{name}_per_channel"), data))
        else:
            value = ctx.value(name)
            assert value is not None
            params.append(value)
    ctx.emit(node, "GroupNorm", [x, *params], {"num_groups": groups, "epsilon": float(attrs.get("epsilon", 1e-5))})


# ----------------------------------------------------------------------------- resize
def _float_list(ctx: _Ctx, node: Any, index: int) -> list[float] | None:
    if len(node.input) <= index or not node.input[index]:
        return None
    data = ctx.const(node.input[index], node).reshape(-1)
    return None if data.size == 0 else [float(F32(v)) for v in data]


def _legacy_nearest(ctx: _Ctx, node: Any, scales: list[float]) -> str:
    """Upsample and opset-10 Resize: ONNX Runtime truncates (floor) when upsampling, rounds up
    when downsampling."""
    if all(s >= 1 for s in scales):
        return "floor"
    if all(s <= 1 for s in scales):
        return "ceil"
    raise refuse(ctx, node, f"scales {scales} both up- and downsample (no single nearest rule)")


@importer("Resize", "Upsample", emits=("Resize",))
def _resize(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = _input(ctx, node, 0)
    rank = x.type.rank
    mode = text(attrs, "mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise refuse(ctx, node, f"mode {mode!r} (qcc resizes with nearest and linear)")
    legacy = node.op_type == "Upsample" or ctx.opset < 11
    sizes_given: list[int] | None = None
    if legacy:
        scales = [float(F32(s)) for s in attrs["scales"]] if "scales" in attrs else _float_list(ctx, node, 1)
        if scales is None:
            raise refuse(ctx, node, "no scales")
        coordinates, nearest = "asymmetric", _legacy_nearest(ctx, node, scales) if mode == "nearest" else "floor"
    else:
        coordinates = text(attrs, "coordinate_transformation_mode", "half_pixel")
        nearest = text(attrs, "nearest_mode", "round_prefer_floor")
        if coordinates == "tf_crop_and_resize":
            raise refuse(ctx, node, "coordinate_transformation_mode tf_crop_and_resize (a crop, not a resize)")
        if text(attrs, "keep_aspect_ratio_policy", "stretch") != "stretch":
            raise refuse(ctx, node, "keep_aspect_ratio_policy other than 'stretch'")
        scales = _float_list(ctx, node, 2)
        sizes_given = [int(v) for v in ctx.const(node.input[3], node).reshape(-1)] if len(node.input) > 3 and \
            node.input[3] else None
        axes = [norm_axis(int(a), rank) for a in attrs.get("axes", range(rank))]
        scales, sizes_given = _full_rank(scales, sizes_given, axes, rank, x.type.shape)
    sizes, scales = _sizes_and_scales(ctx, node, x.type.shape, scales, sizes_given)
    if attrs.get("antialias", 0) and mode != "nearest" and any(s < 1 for s in scales):
        raise refuse(ctx, node, "antialiased downsampling")
    ctx.emit(node, "Resize", [x], {"sizes": sizes, "scales": scales, "mode": "nearest" if mode == "nearest" else "linear",
                                   "coordinate_transformation_mode": coordinates, "nearest_mode": nearest})


def _full_rank(scales: list[float] | None, sizes: list[int] | None, axes: list[int], rank: int,
               shape: tuple[Dim, ...]) -> tuple[list[float] | None, list[int] | None]:
    """Opset 18's `axes`: the values given for those axes, the other axes unchanged."""
    if axes == list(range(rank)):
        return scales, sizes
    full_scales, full_sizes = None, None
    if scales is not None:
        full_scales = [1.0] * rank
        for axis, s in zip(axes, scales):
            full_scales[axis] = s
    if sizes is not None:
        full_sizes = [int(d) if isinstance(d, int) else 0 for d in shape]
        for axis, s in zip(axes, sizes):
            full_sizes[axis] = s
    return full_scales, full_sizes


def _sizes_and_scales(ctx: _Ctx, node: Any, shape: tuple[Dim, ...], scales: list[float] | None,
                      sizes: list[int] | None) -> tuple[list[int], list[float]]:
    """Output sizes and the scales of the coordinate transform, as ONNX Runtime derives them:
    sizes = trunc(scale * size) in float32, scales = size_out / size_in in float32."""
    if sizes is None and scales is None:
        raise refuse(ctx, node, "neither scales nor sizes")
    if any(given is not None and len(given) != len(shape) for given in (sizes, scales)):
        raise refuse(ctx, node, f"needs {len(shape)} scales or sizes")
    out_sizes, out_scales = [], []
    for i, d in enumerate(shape):
        if not isinstance(d, int):
            same = (sizes is None or sizes[i] in (0,)) and (scales is None or scales[i] == 1.0)
            if not same:
                raise refuse(ctx, node, f"resizes the symbolic dimension {d!r} (bind it with the input's shape)")
            out_sizes.append(0)
            out_scales.append(1.0)
        elif sizes is not None:
            out_sizes.append(sizes[i])
            out_scales.append(float(F32(sizes[i]) / F32(d)) if d else 1.0)
        else:
            assert scales is not None
            out_sizes.append(math.floor(F32(scales[i]) * F32(d)))
            out_scales.append(scales[i])
    return out_sizes, out_scales


# ----------------------------------------------------------------------------- data movement
@importer("DepthToSpace", "SpaceToDepth", emits={"DepthToSpace": "DepthToSpace", "SpaceToDepth": "SpaceToDepth"})
def _depth_space(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ir: dict[str, Any] = {"blocksize": int(attrs["blocksize"])}
    if node.op_type == "DepthToSpace":
        ir["mode"] = text(attrs, "mode", "DCR")
    ctx.emit(node, node.op_type, [_input(ctx, node, 0)], ir)


@importer("Gather", emits=("Gather",))
def _gather(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    """Constant indices into a computed tensor (all-constant Gathers are folded before this)."""
    x = _input(ctx, node, 0)
    if not ctx.is_const(node.input[1]):
        raise refuse(ctx, node, "indices computed at run time (qcc gathers with constant indices)")
    axis = norm_axis(int(attrs.get("axis", 0)), x.type.rank)
    size = x.type.shape[axis]
    indices = ctx.const(node.input[1], node).astype(np.int64)
    if not isinstance(size, int):
        raise refuse(ctx, node, f"gathers along the symbolic dimension {size!r}")
    if np.any((indices < -size) | (indices >= size)):
        raise refuse(ctx, node, f"indices out of [{-size}, {size})")
    indices = np.where(indices < 0, indices + size, indices)
    ctx.emit(node, "Gather", [x], {"axis": axis, "indices": [int(i) for i in indices.reshape(-1)],
                                   "indices_shape": list(indices.shape)})


@importer("ArgMax", emits=("ArgMax",))
def _argmax(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ctx.emit(node, "ArgMax", [_input(ctx, node, 0)], {
        "axis": int(attrs.get("axis", 0)), "keepdims": bool(attrs.get("keepdims", 1)),
        "select_last_index": bool(attrs.get("select_last_index", 0))})


@importer("TopK", emits=("TopK",))
def _topk(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = _input(ctx, node, 0)
    k = int(attrs["k"]) if ctx.opset < 10 else int(ctx.const(node.input[1], node).reshape(-1)[0])
    ir_node = ctx.graph.add_node("TopK", [x], {"k": k, "axis": int(attrs.get("axis", -1)),
                                                "largest": bool(attrs.get("largest", 1))}, name=node.name)
    for onnx_name, value in zip(node.output, ir_node.outputs):
        if onnx_name:
            ctx.bind(onnx_name, value)
