"""nnabla functions of issue 17 read from .nnp: PReLU, the layer/instance/group normalizations,
Interpolate and Norm (p = 2). Registered in `qcc.frontends.nnp.IMPORTERS` (which loads this module).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.formats import nnabla_functions as nf
from qcc.frontends.nnp import _Ctx, _need, importer
from qcc.ir.core import Value
from qcc.ir.types import Dim

F32 = np.float32


def _param(ctx: _Ctx, f: Any, name: str | None, shape: tuple[int, ...], fill: float, role: str) -> Value:
    """A parameter broadcast to `shape` (nnabla keeps them broadcastable to x); None: `fill`."""
    if name is None:
        return ctx.internal_const(f"{f.name}/{role}", np.full(shape, fill, F32))
    _need(ctx.is_param(name), ctx, f, f"{role} {name!r} must be a parameter")
    data = ctx.array(name, f)
    if data.size == int(np.prod(shape)):
        data = data.reshape(shape)
    else:
        extra = data.ndim - len(shape)
        fits = extra >= 0 and all(d == 1 for d in data.shape[:extra]) and all(
            d in (1, s) for d, s in zip(data.shape[extra:], shape))
        _need(fits, ctx, f, f"{role} {name!r} of shape {data.shape} does not broadcast to {shape}")
        data = np.ascontiguousarray(np.broadcast_to(data.reshape(data.shape[extra:]), shape))
    return ctx.const(name, f, data, "x".join(map(str, shape)))


def _beta_gamma(ctx: _Ctx, f: Any, p: Any) -> tuple[str | None, str | None]:
    names = list(f.input[1:])
    beta = None if p.no_bias else (names.pop(0) if names else None)
    gamma = None if p.no_scale else (names.pop(0) if names else None)
    return beta, gamma


def _static(ctx: _Ctx, f: Any, dims: tuple[Dim, ...]) -> tuple[int, ...]:
    _need(all(isinstance(d, int) for d in dims), ctx, f, f"normalized axes of symbolic size {dims}")
    return tuple(int(d) for d in dims)


@importer("PReLU", emits=nf.FUNCTION_OPS)
def _prelu(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    axis = int(p.base_axis)
    slope = ctx.array(f.input[1], f)
    _need(ctx.is_param(f.input[1]), ctx, f, "the slope must be a parameter")
    if slope.size == 1:
        shape: tuple[int, ...] = (1,)
    else:
        channels = x.type.shape[axis] if axis < x.type.rank else None
        _need(slope.size == channels, ctx, f, f"{slope.size} slopes for axis {axis} of {x.type.shape}")
        shape = (slope.size,) + (1,) * (x.type.rank - axis - 1)
    ctx.emit(f, "PRelu", [x, ctx.const(f.input[1], f, slope.reshape(shape), "prelu")])


@importer("LayerNormalization", emits=nf.FUNCTION_OPS)
def _layer_norm(ctx: _Ctx, f: Any, p: Any) -> None:
    """nnabla normalizes over every axis but the batch axes: those must lead (IR axis = their count)."""
    x = ctx.value(f.input[0], f)
    batch = sorted(int(a) for a in p.batch_axis) or [0]
    _need(batch == list(range(len(batch))), ctx, f, f"batch_axis {batch} (only leading axes)")
    shape = _static(ctx, f, x.type.shape[len(batch):])
    beta, gamma = _beta_gamma(ctx, f, p)
    ctx.emit(f, "LayerNorm", [x, _param(ctx, f, gamma, shape, 1.0, "gamma"), _param(ctx, f, beta, shape, 0.0, "beta")],
             {"axis": len(batch), "epsilon": float(p.eps)})


@importer("InstanceNormalization", "GroupNormalization", emits=nf.FUNCTION_OPS)
def _channel_norm(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    _need(int(p.channel_axis) == 1 and [int(a) for a in p.batch_axis] in ([0], []), ctx, f,
          f"channel_axis {p.channel_axis}, batch_axis {list(p.batch_axis)} (only 1 and [0]: NCHW)")
    channels = _static(ctx, f, x.type.shape[1:2])
    beta, gamma = _beta_gamma(ctx, f, p)
    params = [_param(ctx, f, gamma, channels, 1.0, "gamma"), _param(ctx, f, beta, channels, 0.0, "beta")]
    attrs: dict[str, Any] = {"epsilon": float(p.eps)}
    if f.type == "GroupNormalization":
        attrs["num_groups"] = int(p.num_groups)
    ctx.emit(f, nf.FUNCTION_OPS[f.type], [x, *params], attrs)


@importer("Interpolate", emits=nf.FUNCTION_OPS)
def _interpolate(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    _need(not p.channel_last, ctx, f, "channel_last is not supported")
    mode = p.mode or "linear"
    coordinates = nf.interpolate_coordinates(mode, p.align_corners, p.half_pixel, p.half_pixel_for_nn)
    _need(coordinates is not None, ctx, f, f"mode {mode!r} with align_corners={p.align_corners}, "
          f"half_pixel={p.half_pixel} (nnabla does not define it)")
    out = [int(d) for d in p.output_size]
    lead = x.type.rank - len(out)
    spatial = _static(ctx, f, x.type.shape[lead:])
    sizes = [d if isinstance(d, int) else 0 for d in x.type.shape[:lead]] + out
    scales = [1.0] * lead + [float(F32(o) / F32(i)) for o, i in zip(out, spatial)]
    ctx.emit(f, "Resize", [x], {"sizes": sizes, "scales": scales, "mode": mode,
                                "coordinate_transformation_mode": coordinates, "nearest_mode": "floor"})


@importer("Norm", emits=nf.FUNCTION_OPS)
def _norm(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    _need(float(p.p) == 2.0, ctx, f, f"p = {p.p} (qcc's ReduceL2 is the 2-norm)")
    axes = [int(a) for a in p.axes] or list(range(x.type.rank))
    ctx.emit(f, "ReduceL2", [x], {"axes": axes, "keepdims": bool(p.keep_dims)})
