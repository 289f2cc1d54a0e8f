"""Normalizations over groups of elements: LayerNorm, GroupNorm, InstanceNorm.

Each normalizes x by the mean and variance of a group of its elements, then applies a per-element
(LayerNorm) or per-channel (GroupNorm, InstanceNorm) scale and bias. The reference kernels
compute the statistics in float64; the targets' float32 kernels (qcc.sim.f32) fix an
operation order of their own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.ops._common import norm_axis
from qcc.ir.registry import AttrSpec, OpDef, register
from qcc.ir.types import TensorType


def normalized(x: np.ndarray, axes: tuple[int, ...], epsilon: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over `axes`, in float64."""
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = np.square(x - mean).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon)


def _check_param(t: TensorType | None, shape: tuple[Any, ...], what: str) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what} of shape {t.shape} must have shape {tuple(shape)}")


@register
class LayerNorm(OpDef):
    """Normalize over the axes from `axis` on, then * scale + bias (shaped like those axes)."""

    inputs = ("x", "scale?", "bias?")
    attrs = {"axis": AttrSpec("int", -1), "epsilon": AttrSpec("float", 1e-5)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x = types[0]
        axis = norm_axis(attrs["axis"], x.rank)
        for t, what in zip(types[1:], ("scale", "bias")):
            _check_param(t, x.shape[axis:], what)
        return [x]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        axis = norm_axis(node.attrs["axis"], x.ndim)
        y = normalized(x, tuple(range(axis, x.ndim)), node.attrs["epsilon"])
        if len(xs) > 1 and xs[1] is not None:
            y = y * xs[1]
        if len(xs) > 2 and xs[2] is not None:
            y = y + xs[2]
        return [y.astype(x.dtype)]


def _channel_params_infer(types: list[TensorType]) -> list[TensorType]:
    x = types[0]
    if x.rank < 3:
        raise ValueError(f"needs (N, C, ...) with at least one spatial axis, got {x.shape}")
    for t, what in zip(types[1:], ("scale", "bias")):
        _check_param(t, (x.shape[1],), what)
    return [x]


def group_normalized(x: np.ndarray, groups: int, epsilon: float, scale: np.ndarray,
                     bias: np.ndarray) -> np.ndarray:
    n, c = x.shape[:2]
    y = normalized(x.reshape(n, groups, -1), (2,), epsilon).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@register
class GroupNorm(OpDef):
    """Normalize each of `num_groups` channel groups of a sample, then * scale[c] + bias[c]."""

    inputs = ("x", "scale", "bias")
    attrs = {"num_groups": AttrSpec("int"), "epsilon": AttrSpec("float", 1e-5)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        out = _channel_params_infer(types)
        channels, groups = types[0].shape[1], attrs["num_groups"]
        if not isinstance(channels, int) or groups < 1 or channels % groups:
            raise ValueError(f"{channels} channels do not split into {groups} groups")
        return out

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [group_normalized(xs[0], node.attrs["num_groups"], node.attrs["epsilon"], xs[1], xs[2])]


@register
class InstanceNorm(OpDef):
    """Normalize each channel of a sample over its spatial axes, then * scale[c] + bias[c]."""

    inputs = ("x", "scale", "bias")
    attrs = {"epsilon": AttrSpec("float", 1e-5)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        return _channel_params_infer(types)

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [group_normalized(xs[0], xs[0].shape[1], node.attrs["epsilon"], xs[1], xs[2])]


def groups_of(node: Any) -> int:
    """How many groups of channels a GroupNorm or InstanceNorm normalizes separately."""
    return int(node.attrs["num_groups"]) if node.op == "GroupNorm" else int(node.inputs[0].type.shape[1])
