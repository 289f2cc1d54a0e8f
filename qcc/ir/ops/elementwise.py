"""Elementwise ops: activations (unary) and broadcasting arithmetic (binary)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qcc.ir.ops._common import broadcast_shapes, norm_axis
from qcc.ir.registry import AttrSpec, OpDef, register
from qcc.ir.types import TensorType
from qcc.quant.numerics import clamp

F32 = np.float32


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


class _Unary(OpDef):
    traits = frozenset({"elementwise", "inplace"})


@register
class Relu(_Unary):
    """max(x, 0)."""

    traits = frozenset({"elementwise", "inplace", "keeps_annotation", "clamp"})

    @staticmethod
    def bounds(attrs: dict[str, Any]) -> tuple[float | None, float | None]:
        return 0.0, None

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        if xs[0].dtype.kind == "f":
            return [clamp(xs[0], 0.0, None)]
        return [np.maximum(xs[0], 0).astype(xs[0].dtype, copy=False)]


@register
class LeakyRelu(_Unary):
    """x if x >= 0 else alpha * x."""

    attrs = {"alpha": AttrSpec("float", 0.01)}

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        return [np.where(x >= 0, x, x * F32(node.attrs["alpha"])).astype(x.dtype, copy=False)]


@register
class Clip(_Unary):
    """clamp(x, min, max); None means unbounded (Relu6 is Clip(0, 6))."""

    attrs = {"min": AttrSpec("float?", None), "max": AttrSpec("float?", None)}
    traits = frozenset({"elementwise", "inplace", "clamp"})

    @staticmethod
    def bounds(attrs: dict[str, Any]) -> tuple[float | None, float | None]:
        lo, hi = attrs.get("min"), attrs.get("max")
        return (None if lo is None else float(lo)), (None if hi is None else float(hi))

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        lo, hi = node.attrs["min"], node.attrs["max"]
        x = xs[0]
        if x.dtype == np.float32:  # the bounds as float32, as below: clamp compares in x's dtype
            return [clamp(x, None if lo is None else F32(lo), None if hi is None else F32(hi))]
        if lo is not None:
            x = np.maximum(x, F32(lo))
        if hi is not None:  # in place on the new array: one pass less over a large activation
            x = np.minimum(x, F32(hi), out=x if x is not xs[0] and x.dtype.kind == "f" else None)
        return [x if x is not xs[0] and x.dtype == xs[0].dtype else x.astype(xs[0].dtype)]


@register
class Sigmoid(_Unary):
    """1 / (1 + exp(-x))."""

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0].astype(np.float64)
        return [(0.5 * (1.0 + np.tanh(0.5 * x))).astype(xs[0].dtype, copy=False)]


@register
class Tanh(_Unary):
    """tanh(x)."""

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.tanh(xs[0])]


@register
class HardSigmoid(_Unary):
    """clamp(alpha * x + beta, 0, 1) (ONNX defaults; torch uses alpha=1/6)."""

    attrs = {"alpha": AttrSpec("float", 0.2), "beta": AttrSpec("float", 0.5)}

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        a, b = F32(node.attrs["alpha"]), F32(node.attrs["beta"])
        return [np.clip(xs[0] * a + b, 0, 1).astype(xs[0].dtype, copy=False)]


@register
class HardSwish(_Unary):
    """x * clamp(x / 6 + 1/2, 0, 1) (torch's x * relu6(x + 3) / 6)."""

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        # ONNX's definition, x * max(0, min(1, alpha * x + beta)) with alpha = 1/6: one float32
        # operation at a time, as the .nnb functions it becomes compute it (MulScalar, AddScalar...)
        x = xs[0]
        return [(x * np.clip(x * F32(1 / 6) + F32(0.5), 0, 1)).astype(x.dtype, copy=False)]


@register
class Silu(_Unary):
    """x * sigmoid(x) (nnabla Swish)."""

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0].astype(np.float64)
        return [(x * 0.5 * (1.0 + np.tanh(0.5 * x))).astype(xs[0].dtype, copy=False)]


@register
class Gelu(_Unary):
    """x * Phi(x); approximate='tanh' uses the tanh formula."""

    attrs = {"approximate": AttrSpec("str", "none")}

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0].astype(np.float64)
        if node.attrs["approximate"] == "tanh":
            y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        else:
            y = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
        return [y.astype(xs[0].dtype, copy=False)]


@register
class Elu(_Unary):
    """x if x > 0 else alpha * (exp(x) - 1)."""

    attrs = {"alpha": AttrSpec("float", 1.0)}

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        return [np.where(x > 0, x, F32(node.attrs["alpha"]) * np.expm1(x)).astype(x.dtype, copy=False)]


def _simple(name: str, fn: Any, doc: str) -> None:
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(fn(xs[0])).astype(xs[0].dtype, copy=False)]

    register(type(name, (_Unary,), {"name": name, "__doc__": doc, "kernel": staticmethod(kernel)}))


_simple("Exp", np.exp, "exp(x).")
_simple("Log", np.log, "log(x).")
_simple("Sqrt", np.sqrt, "sqrt(x).")
_simple("Neg", np.negative, "-x.")
_simple("Abs", np.abs, "|x|.")
_simple("Reciprocal", np.reciprocal, "1 / x.")
_simple("Erf", lambda x: _erf(x), "erf(x).")
_simple("Softplus", lambda x: np.logaddexp(0.0, x.astype(np.float64)), "log(1 + exp(x)).")
_simple("Mish", lambda x: x * np.tanh(np.logaddexp(0.0, x.astype(np.float64))), "x * tanh(log(1 + exp(x))).")


@register
class PRelu(OpDef):
    """x if x >= 0 else slope * x; slope broadcasts to x (one per channel, or one for all)."""

    inputs = ("x", "slope")
    traits = frozenset({"elementwise", "inplace", "broadcast"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        x, slope = types
        if broadcast_shapes(x.shape, slope.shape) != tuple(x.shape):
            raise ValueError(f"slope of shape {slope.shape} does not broadcast to x {x.shape}")
        return [x]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        return [np.where(x < 0, x * xs[1].astype(x.dtype), x).astype(x.dtype, copy=False)]


@register
class Identity(OpDef):
    """y = x (a view: shares its input's storage)."""

    traits = frozenset({"view", "keeps_annotation", "rearranges"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0]]


@register
class Dropout(OpDef):
    """Inference form: identity (a view)."""

    attrs = {"ratio": AttrSpec("float", 0.5)}
    traits = frozenset({"view", "keeps_annotation", "rearranges"})

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0]]


def _shifted_exp_sum(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """x - max(x) in float64 and the sum of its exponentials: the overflow-free softmax core."""
    shifted = x.astype(np.float64) - x.max(axis=axis, keepdims=True)
    return shifted, np.exp(shifted).sum(axis=axis, keepdims=True)


@register
class Softmax(OpDef):
    """exp(x) / sum(exp(x)) along axis."""

    attrs = {"axis": AttrSpec("int", -1)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        norm_axis(attrs["axis"], types[0].rank)
        return [types[0]]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        shifted, total = _shifted_exp_sum(xs[0], node.attrs["axis"])
        return [(np.exp(shifted) / total).astype(xs[0].dtype, copy=False)]


@register
class LogSoftmax(OpDef):
    """log(softmax(x)) along axis, computed as x - max - log(sum(exp(x - max))) to stay finite."""

    attrs = {"axis": AttrSpec("int", -1)}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        norm_axis(attrs["axis"], types[0].rank)
        return [types[0]]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        shifted, total = _shifted_exp_sum(xs[0], node.attrs["axis"])
        log_sum = np.log(total)
        return [(shifted - log_sum).astype(xs[0].dtype, copy=False)]


class _Binary(OpDef):
    inputs = ("a", "b")
    traits = frozenset({"elementwise", "inplace", "broadcast"})

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[np.ndarray | None]) -> list[TensorType]:
        a, b = types
        if a.dtype != b.dtype:
            raise ValueError(f"input dtypes differ: {a.dtype} vs {b.dtype}")
        return [TensorType(a.dtype, broadcast_shapes(a.shape, b.shape))]


def _binary(name: str, fn: Any, doc: str, extra: frozenset[str] = frozenset({"quantizes_constants"})) -> None:
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(fn(xs[0], xs[1])).astype(xs[0].dtype, copy=False)]

    register(type(name, (_Binary,), {"name": name, "__doc__": doc, "kernel": staticmethod(kernel),
                                     "traits": _Binary.traits | extra}))


_binary("Add", np.add, "a + b with broadcasting.")
_binary("Sub", np.subtract, "a - b with broadcasting.")
_binary("Mul", np.multiply, "a * b with broadcasting.", frozenset({"quantizes_constants", "product"}))
_binary("Div", np.divide, "a / b with broadcasting.")
_binary("Pow", np.power, "a ** b with broadcasting.", frozenset())
_binary("Max", np.maximum, "max(a, b) with broadcasting.")
_binary("Min", np.minimum, "min(a, b) with broadcasting.")
