"""ATen converters of issue 17: interpolate/upsample, scaled_dot_product_attention, the layer,
group and instance normalizations, prelu, mish, argmax, topk, vector norm, pixel_shuffle and
constant-index selection. Each is kept whole by `run_decompositions` (its IR op is better than
its parts). Registered with `converts` (torch_fx loads this module).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qcc.frontends.torch_aten import _axis, _reduce_axes
from qcc.frontends.torch_fx import TorchCtx, converts
from qcc.ir.core import Value

F32 = np.float32


# ----------------------------------------------------------------------------- resize
def _resize(ctx: TorchCtx, x: Value, sizes: Any, factors: Any, mode: str, coordinates: str, nearest: str) -> Value:
    """torch's scale is 1 / scale_factor when a factor is given, else in / out: ONNX's scales
    are the factor (or out / in)."""
    shape = ctx.static_shape(x)
    spatial = shape[2:]
    if sizes is not None:
        out = [int(s) for s in sizes]
        scales = [float(F32(o) / F32(i)) for o, i in zip(out, spatial)]
    elif factors is not None:
        scales = [float(f) for f in factors]
        out = [math.floor(F32(s) * F32(i)) for s, i in zip(scales, spatial)]
    else:
        raise ctx.fail("neither output_size nor scale_factors")
    if len(out) != len(spatial):
        raise ctx.fail(f"{len(out)} sizes for the {len(spatial)} spatial axes of {shape}")
    sizes_all = [0 if not isinstance(d, int) else d for d in x.type.shape[:2]] + out
    return ctx.emit("Resize", x, sizes=sizes_all, scales=[1.0, 1.0, *scales], mode=mode,
                    coordinate_transformation_mode=coordinates, nearest_mode=nearest)


@converts("aten.upsample_nearest2d.vec", "aten.upsample_nearest1d.vec", "aten._upsample_nearest_exact2d.vec",
          "aten._upsample_nearest_exact1d.vec", emits=("Resize",), keep_whole=True)
def _upsample_nearest(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    """nearest: floor(dst * scale) (ONNX asymmetric, floor); nearest-exact: floor((dst + 0.5) * scale)."""
    exact = "exact" in ctx.op
    return _resize(ctx, ctx.value(a["input"]), a.get("output_size"), a.get("scale_factors"), "nearest",
                   "tf_half_pixel_for_nn" if exact else "asymmetric", "floor")


@converts("aten.upsample_bilinear2d.vec", "aten.upsample_linear1d.vec", emits=("Resize",), keep_whole=True)
def _upsample_linear(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    """align_corners=False is ONNX's half_pixel (torch clamps negative coordinates, as Resize does)."""
    coordinates = "align_corners" if a["align_corners"] else "half_pixel"
    return _resize(ctx, ctx.value(a["input"]), a.get("output_size"), a.get("scale_factors"), "linear", coordinates,
                   "floor")


# ----------------------------------------------------------------------------- attention
@converts("aten.scaled_dot_product_attention.default", emits=("Transpose", "MatMul", "Mul", "Add", "Softmax"),
          keep_whole=True)
def _attention(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    """softmax(q @ k^T * scale + mask) @ v, scale 1 / sqrt(depth) unless given."""
    if float(a.get("dropout_p") or 0.0) != 0.0 or a.get("is_causal") or a.get("enable_gqa"):
        raise ctx.fail("dropout, is_causal and enable_gqa are not supported (give a float attn_mask instead of "
                       "is_causal)")
    q, k, v = (ctx.value(a[n]) for n in ("query", "key", "value"))
    rank = k.type.rank
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    depth = int(q.type.shape[-1])
    scale = float(a["scale"]) if a.get("scale") is not None else 1.0 / math.sqrt(depth)
    scores = ctx.emit("MatMul", q, ctx.emit("Transpose", k, perm=perm, part="key_t"), part="scores")
    scores = ctx.emit("Mul", scores, ctx.value(scale, "scale"), part="scaled")
    mask = a.get("attn_mask")
    if mask is not None:
        if ctx.is_const(mask) and ctx.array(mask).dtype == np.bool_:
            raise ctx.fail("a boolean attn_mask (give an additive float mask)")
        scores = ctx.emit("Add", scores, ctx.value(mask, "mask"), part="masked")
    probs = ctx.emit("Softmax", scores, axis=-1, part="probs")
    return ctx.emit("MatMul", probs, v, main=True)


# ----------------------------------------------------------------------------- normalization
@converts("aten.layer_norm.default", "aten.native_layer_norm.default", emits=("LayerNorm",), keep_whole=True)
def _layer_norm(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    x = ctx.value(a["input"])
    axis = x.type.rank - len(a["normalized_shape"])
    params = [ctx.value(a[k], k) if a.get(k) is not None else None for k in ("weight", "bias")]
    y = ctx.emit("LayerNorm", x, *params, axis=axis, epsilon=float(a["eps"]))
    return y if ctx.op == "aten.layer_norm.default" else (y, None, None)


def _channel_params(ctx: TorchCtx, a: dict[str, Any], x: Value) -> list[Value]:
    channels = int(ctx.static_shape(x)[1])
    defaults = {"weight": np.ones(channels, F32), "bias": np.zeros(channels, F32)}
    return [ctx.value(a[k] if a.get(k) is not None else defaults[k], k) for k in ("weight", "bias")]


@converts("aten.group_norm.default", emits=("GroupNorm",), keep_whole=True)
def _group_norm(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["input"])
    return ctx.emit("GroupNorm", x, *_channel_params(ctx, a, x), num_groups=int(a["num_groups"]), epsilon=float(a["eps"]))


@converts("aten.native_group_norm.default", emits=("GroupNorm",))
def _native_group_norm(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    x = ctx.value(a["input"])
    y = ctx.emit("GroupNorm", x, *_channel_params(ctx, a, x), num_groups=int(a["group"]), epsilon=float(a["eps"]))
    return y, None, None


@converts("aten.instance_norm.default", emits=("InstanceNorm",), keep_whole=True)
def _instance_norm(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    if not a["use_input_stats"]:
        raise ctx.fail("instance norm with running statistics (track_running_stats in eval mode)")
    x = ctx.value(a["input"])
    return ctx.emit("InstanceNorm", x, *_channel_params(ctx, a, x), epsilon=float(a["eps"]))


# ----------------------------------------------------------------------------- activations
@converts("aten.prelu.default", "aten._prelu_kernel.default", emits=("PRelu",), keep_whole=True)
def _prelu(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    """torch's weight runs along axis 1 (one slope per channel) or is a single slope."""
    x = ctx.value(a["self"])
    weight = ctx.array(a["weight"]).reshape(-1)
    shape = (1,) if weight.size == 1 else (weight.size,) + (1,) * (x.type.rank - 2)
    return ctx.emit("PRelu", x, ctx.constant(weight.reshape(shape), f"{ctx.const_name(a['weight']) or ctx.site.name}"))


@converts("aten.mish.default", "aten.mish_.default", emits=("Mish",), keep_whole=True)
def _mish(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    return ctx.emit("Mish", ctx.value(a["self"]))


# ----------------------------------------------------------------------------- indexing and reductions
@converts("aten.argmax.default", emits=("ArgMax",))
def _argmax(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    if a.get("dim") is None:
        raise ctx.fail("argmax over all elements (give dim)")
    return ctx.emit("ArgMax", x, axis=_axis(int(a["dim"]), x.type.rank), keepdims=bool(a.get("keepdim", False)))


@converts("aten.topk.default", emits=("TopK",))
def _topk(ctx: TorchCtx, a: dict[str, Any]) -> tuple[Value, Value]:
    x = ctx.value(a["self"])
    node = ctx.emit_node("TopK", [x], {"k": int(a["k"]), "axis": _axis(int(a["dim"]), x.type.rank),
                                       "largest": bool(a["largest"])}, main=True)
    return node.outputs[0], node.outputs[1]


@converts("aten.linalg_vector_norm.default", emits=("ReduceL2",), keep_whole=True)
def _vector_norm(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    if float(a.get("ord", 2)) != 2.0 or a.get("dtype") is not None:
        raise ctx.fail(f"vector norm of order {a.get('ord')} (qcc's ReduceL2 is the 2-norm)")
    return ctx.emit("ReduceL2", x, axes=_reduce_axes(x, a.get("dim")), keepdims=bool(a.get("keepdim", False)))


@converts("aten.pixel_shuffle.default", emits=("DepthToSpace",), keep_whole=True)
def _pixel_shuffle(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    """pixel_shuffle is ONNX DepthToSpace in CRD mode."""
    return ctx.emit("DepthToSpace", ctx.value(a["self"]), blocksize=int(a["upscale_factor"]), mode="CRD")


@converts("aten.index_select.default", emits=("Gather",))
def _index_select(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    if not ctx.is_const(a["index"]):
        raise ctx.fail("index_select with indices computed at run time")
    axis = _axis(int(a["dim"]), x.type.rank)
    size = x.type.shape[axis]
    index = ctx.array(a["index"]).astype(np.int64).reshape(-1)
    if not isinstance(size, int) or np.any((index < -size) | (index >= size)):
        raise ctx.fail(f"indices {index.tolist()} outside the axis of size {size}")
    index = np.where(index < 0, index + size, index)
    return ctx.emit("Gather", x, axis=axis, indices=[int(i) for i in index], indices_shape=[len(index)])
