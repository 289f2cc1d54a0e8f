"""ONNX frontend: opsets 9..21 into qcc's IR, folding constant and shape computations at import.

Each supported ONNX op has one importer in `IMPORTERS`; everything computable from constants is
folded (ConstantOfShape weights, Shape->Gather->Concat chains, Unsqueeze of parameters), so the
IR only holds real computation.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qcc import limits
from qcc.errors import MALFORMED_ERRORS, InvalidInputError, QccError, UnsupportedError
from qcc.frontends import onnx_quant
from qcc.frontends.input_shapes import BoundShapes, ShapeSpec, bind_inputs
from qcc.frontends.onnx_fold_size import folded_elements, folded_itemsize, folding_work
from qcc.frontends.onnx_tensors import (
    TYPE_NAMES,
    declared_bytes,
    decode_array,
    resolve_external_data,
    to_array,
)
from qcc.io import quiet_native_stderr, read_regular_file
from qcc.ir.core import Graph, Model, Value
from qcc.ir.fusion import FUSED_OPS, fuse_gated_activations
from qcc.ir.types import DTYPES, TensorType
from qcc.ir.verify import verify_model
from qcc.tables import check_emitted, emitted_ops, importer_registrar

MIN_OPSET, MAX_OPSET = 9, 21


class _Ctx:
    """Import state: ONNX names -> IR values or folded numpy constants."""

    def __init__(self, graph: Graph, opset: int, source: str) -> None:
        self.graph = graph
        self.opset = opset
        self.source = source
        self.values: dict[str, Value] = {}
        self.consts: dict[str, np.ndarray] = {}
        self._const_values: dict[str, Value] = {}
        self.param_bytes = 0
        self.const_quant: dict[str, Any] = {}  # constant -> its annotation (qcc.frontends.onnx_quant)
        self.int_names: set[str] = set()  # ONNX tensors that hold integers of an annotated IR value
        self.graph_outputs: set[str] = set()
        self.importers = IMPORTERS
        self._readers: dict[str, list[Any]] = {}

    def index_readers(self, nodes: Any) -> None:
        for node in nodes:
            for name in node.input:
                self._readers.setdefault(name, []).append(node)

    def readers(self, name: str) -> list[Any]:
        """The ONNX nodes that read tensor `name`."""
        return self._readers.get(name, [])

    def reserve(self, count: int, itemsize: int, what: str) -> None:
        """Account for a constant about to be materialized: limits are checked before allocating."""
        limits.check_tensor(count, itemsize, what, self.source)
        self.param_bytes += count * itemsize
        limits.check_count("bytes of parameters and folded constants", self.param_bytes,
                           limits.current().max_parameter_bytes, self.source)

    def is_const(self, name: str) -> bool:
        return name == "" or name in self.consts

    def const(self, name: str, node: Any) -> np.ndarray:
        if name not in self.consts:
            raise UnsupportedError(
                f"{self.source}: node {node.name!r} ({node.op_type}) needs input {name!r} to be a constant")
        return self.consts[name]

    def value(self, name: str) -> Value | None:
        """IR value for an ONNX name (constants become IR constants on first use)."""
        if name == "":
            return None
        if name in self.values:
            return self.values[name]
        if name in self.consts:
            if name not in self._const_values:
                data = self.consts[name]
                if data.dtype == np.float64:
                    data = data.astype(np.float32)
                if data.dtype.name not in DTYPES:
                    raise UnsupportedError(f"{self.source}: constant {name!r} of element type {data.dtype.name} "
                                           "is used by computation; qcc handles " + ", ".join(DTYPES))
                const = self.graph.add_constant(self.graph.unique_name(name), data)
                const.quant = self.const_quant.get(name)
                self._const_values[name] = const
            return self._const_values[name]
        raise InvalidInputError(f"{self.source}: tensor {name!r} is used but never defined")

    def static_shape(self, name: str, node: Any) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        ttype = self.value(name).type  # type: ignore[union-attr]
        if not ttype.is_static:
            raise UnsupportedError(
                f"{self.source}: node {node.name!r} ({node.op_type}) needs the static shape of {name!r}, got {ttype.shape}")
        return tuple(int(d) for d in ttype.shape)

    def emit(self, node: Any, op: str, inputs: list[Value | None], attrs: dict[str, Any] | None = None,
             out_index: int = 0, name: str | None = None) -> Value:
        """Add an IR node whose output is ONNX output `out_index` (named like it when possible)."""
        out_name = node.output[out_index] if out_index < len(node.output) else None
        ir_node = self.graph.add_node(op, inputs, attrs, name=name or node.name or op.lower())
        value = ir_node.outputs[0]
        if out_name is not None and name is None:
            self._rename(value, out_name)
            self.values[out_name] = value
        return value

    def _rename(self, value: Value, name: str) -> None:
        if value.name != name and name not in self.graph._names:
            self.graph._names.discard(value.name)
            value.name = name
            self.graph._names.add(name)

    def bind(self, onnx_name: str, value: Value) -> None:
        self._rename(value, onnx_name)
        self.values[onnx_name] = value


Importer = Callable[[_Ctx, Any, dict[str, Any]], None]
IMPORTERS: dict[str, Importer] = {}


EMITS: dict[str, frozenset[str]] = {}
"""ONNX op type -> the IR ops its importer may create (checked on every import)."""
importer = importer_registrar(IMPORTERS, EMITS)


# ----------------------------------------------------------------------------- helpers
def _spatial_pads(ctx: _Ctx, node: Any, attrs: dict[str, Any], kernel: list[int], strides: list[int],
                  dilations: list[int]) -> list[int]:
    auto = attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("NOTSET", ""):
        pads = list(attrs.get("pads", [0] * 4))
        return pads
    if auto == "VALID":
        return [0, 0, 0, 0]
    shape = ctx.static_shape(node.input[0], node)
    begins, ends = [], []
    for i in range(2):
        size = shape[2 + i]
        out = -(-size // strides[i])
        total = max(0, (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def _need_rank4(ctx: _Ctx, node: Any) -> None:
    value = ctx.value(node.input[0])
    if value is not None and value.type.rank != 4:
        raise UnsupportedError(
            f"{ctx.source}: node {node.name!r} ({node.op_type}) on rank-{value.type.rank} input: only 2-D (NCHW) is supported")


# ----------------------------------------------------------------------------- importers
@importer("Conv", "ConvTranspose", emits=("Conv", "ConvTranspose", "Reshape"))
def _conv(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    if x is not None and x.type.rank == 3:
        _conv1d(ctx, node, attrs, x)
        return
    _need_rank4(ctx, node)
    w_shape = ctx.static_shape(node.input[1], node)
    kernel = list(attrs.get("kernel_shape", w_shape[2:]))
    strides = list(attrs.get("strides", [1, 1]))
    dil = list(attrs.get("dilations", [1, 1]))
    ir_attrs: dict[str, Any] = {"strides": strides, "dilations": dil, "group": attrs.get("group", 1)}
    if node.op_type == "ConvTranspose":
        if "output_shape" in attrs:
            raise UnsupportedError(f"{ctx.source}: node {node.name!r} (ConvTranspose): output_shape is not supported; give pads")
        ir_attrs["pads"] = list(attrs.get("pads", [0, 0, 0, 0]))
        ir_attrs["output_padding"] = list(attrs.get("output_padding", [0, 0]))
    else:
        ir_attrs["pads"] = _spatial_pads(ctx, node, attrs, kernel, strides, dil)
    inputs = [ctx.value(n) for n in node.input]
    ctx.emit(node, "ConvTranspose" if node.op_type == "ConvTranspose" else "Conv", inputs, ir_attrs)


def _conv1d(ctx: _Ctx, node: Any, attrs: dict[str, Any], x: Value) -> None:
    """A 1-D (N, C, L) convolution is the 2-D one on (N, C, 1, L): Reshape, Conv with a (.., 1, K)
    weight and height-1 geometry, Reshape back (Silero VAD's STFT and encoder)."""
    auto = attrs.get("auto_pad", "NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) not in ("NOTSET", "", "VALID"):
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} ({node.op_type}): auto_pad {auto!r} on a 1-D "
                               "convolution; give pads")
    if "output_shape" in attrs:
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} (ConvTranspose): output_shape is not supported; give pads")
    w = ctx.const(node.input[1], node)
    weight = ctx.graph.add_constant(ctx.graph.unique_name(node.input[1] + "_2d"),
                                    np.ascontiguousarray(w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])))
    pads = list(attrs.get("pads", [0, 0])) if (auto.decode() if isinstance(auto, bytes) else auto) != "VALID" else [0, 0]
    ir_attrs: dict[str, Any] = {"strides": [1, *attrs.get("strides", [1])], "dilations": [1, *attrs.get("dilations", [1])],
                                "group": attrs.get("group", 1), "pads": [0, pads[0], 0, pads[1]]}
    if node.op_type == "ConvTranspose":
        ir_attrs["output_padding"] = [0, *attrs.get("output_padding", [0])]
    name = node.name or node.op_type.lower()
    x2 = ctx.graph.add("Reshape", x, shape=[0, 0, 1, -1], name=f"{name}_2d")
    bias = [ctx.value(node.input[2])] if len(node.input) > 2 and node.input[2] else []
    y2 = ctx.graph.add_node(node.op_type, [x2, weight, *bias], ir_attrs, name=name).outputs[0]
    ctx.emit(node, "Reshape", [y2], {"shape": [0, 0, -1]}, name=None)


_ROWS = 16
"""Rows of the source a transposed copy moves at a time: their columns stay in cache."""


def contiguous(w: np.ndarray) -> np.ndarray:
    """`np.ascontiguousarray(w)`, the same values: a transposed matrix (Gemm's transB weight) is copied
    in blocks of its source's rows. numpy copies a transposed view element by element across the
    whole source, a cache miss per element: 8 ms warm, 26 ms in a compile for ResNet-50's 1000 x 2048
    classifier, against 2 ms in blocks."""
    source = w.T
    if w.ndim != 2 or w.flags.c_contiguous or not source.flags.c_contiguous or w.size < 1 << 12:
        return np.ascontiguousarray(w)
    out = np.empty(w.shape, dtype=w.dtype)
    for start in range(0, source.shape[0], _ROWS):
        out[:, start:start + _ROWS] = source[start:start + _ROWS].T
    return out


@importer("Gemm", emits=("Transpose", "Dense", "Add", "MatMul", "Mul"))
def _gemm(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
    x = ctx.value(node.input[0])
    assert x is not None
    if trans_a:
        x = ctx.graph.add("Transpose", x, perm=[1, 0], name=f"{node.name}_transA")
    if ctx.is_const(node.input[1]):
        w = ctx.const(node.input[1], node)
        w = w.T if trans_b else w
        if alpha != 1.0 or w.dtype != np.float32:  # else the same values: one copy below, not three
            w = (w * np.float32(alpha)).astype(np.float32)
        b = None
        if len(node.input) > 2 and node.input[2] and ctx.is_const(node.input[2]):
            c = ctx.const(node.input[2], node) * np.float32(beta)
            if c.size in (1, w.shape[1]) and c.ndim <= 2:
                b = np.broadcast_to(c.reshape(-1), (w.shape[1],)).astype(np.float32)
            else:
                raise UnsupportedError(f"{ctx.source}: node {node.name!r} (Gemm): bias of shape {c.shape} is not per output")
        wv = ctx.graph.add_constant(ctx.graph.unique_name(node.input[1] + ("_t" if trans_b else "")), contiguous(w))
        bv = ctx.graph.add_constant(ctx.graph.unique_name(node.input[2]), b) if b is not None else None
        onnx_quant.carry_gemm_annotations(ctx, node, wv, bv, bool(trans_b), alpha == 1.0 and beta == 1.0)
        if len(node.input) > 2 and node.input[2] and b is None:
            y = ctx.graph.add("Dense", x, wv, name=node.name)
            c_val = ctx.value(node.input[2])
            ctx.emit(node, "Add", [y, c_val])
        else:
            ctx.emit(node, "Dense", [x, wv, bv])
        return
    w_val = ctx.value(node.input[1])
    assert w_val is not None
    if trans_b:
        w_val = ctx.graph.add("Transpose", w_val, perm=[1, 0], name=f"{node.name}_transB")
    y = ctx.graph.add("MatMul", x, w_val, name=node.name)
    if alpha != 1.0:
        y = ctx.graph.add("Mul", y, ctx.graph.add_constant(ctx.graph.unique_name("alpha"), np.array(alpha, np.float32)))
    if len(node.input) > 2 and node.input[2]:
        c_val = ctx.value(node.input[2])
        if beta != 1.0:
            c_val = ctx.graph.add("Mul", c_val, ctx.graph.add_constant(ctx.graph.unique_name("beta"), np.array(beta, np.float32)))
        y = ctx.graph.add("Add", y, c_val)
    ctx.bind(node.output[0], y)


@importer("BatchNormalization", emits=("BatchNorm",))
def _bn(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    if attrs.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} (BatchNormalization) in training mode")
    ctx.emit(node, "BatchNorm", [ctx.value(n) for n in node.input[:5]], {"epsilon": attrs.get("epsilon", 1e-5)})


_UNARY = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
          "Neg": "Neg", "Abs": "Abs", "Erf": "Erf", "Reciprocal": "Reciprocal", "HardSwish": "HardSwish",
          "Identity": "Identity", "Softplus": "Softplus", "Mish": "Mish"}


@importer(*_UNARY, emits=_UNARY)
def _unary(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ctx.emit(node, _UNARY[node.op_type], [ctx.value(node.input[0])])


_UNARY_DEFAULTS: dict[str, dict[str, Any]] = {
    "LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Gelu": {"approximate": "none"}}


@importer(*_UNARY_DEFAULTS, emits=_UNARY_DEFAULTS.keys())
def _unary_attr(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    defaults: dict[str, Any] = _UNARY_DEFAULTS[node.op_type]
    ir = {k: (attrs.get(k, v).decode() if isinstance(attrs.get(k, v), bytes) else attrs.get(k, v)) for k, v in defaults.items()}
    ctx.emit(node, node.op_type, [ctx.value(node.input[0])], ir)


@importer("Clip", emits=("Clip",))
def _clip(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    if ctx.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo = float(ctx.const(node.input[1], node)) if len(node.input) > 1 and node.input[1] else None
        hi = float(ctx.const(node.input[2], node)) if len(node.input) > 2 and node.input[2] else None
    ctx.emit(node, "Clip", [ctx.value(node.input[0])], {"min": lo, "max": hi})


@importer("Softmax", emits=("Softmax", "Flatten", "Reshape"))
def _softmax(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    rank = x.type.rank
    if ctx.opset >= 13:
        ctx.emit(node, "Softmax", [x], {"axis": attrs.get("axis", -1)})
        return
    axis = attrs.get("axis", 1)
    if not -rank <= axis < max(rank, 1):
        raise InvalidInputError(f"{ctx.source}: node {node.name!r} (Softmax): axis {axis} out of range for rank {rank}")
    axis %= max(rank, 1)
    if axis == rank - 1:
        ctx.emit(node, "Softmax", [x], {"axis": -1})
        return
    flat = ctx.graph.add("Flatten", x, axis=axis, name=f"{node.name}_flatten")
    soft = ctx.graph.add("Softmax", flat, axis=-1, name=node.name or "softmax")
    shape = [int(d) if isinstance(d, int) else 0 for d in x.type.shape]
    ctx.emit(node, "Reshape", [soft], {"shape": shape}, name=None)


@importer("Dropout", emits=("Dropout",))
def _dropout(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ratio = attrs.get("ratio", 0.5)
    if ctx.opset >= 12 and len(node.input) > 1 and node.input[1]:
        ratio = float(ctx.const(node.input[1], node))
    ctx.emit(node, "Dropout", [ctx.value(node.input[0])], {"ratio": float(ratio)})


_BINARY = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Pow": "Pow"}


@importer(*_BINARY, emits=_BINARY)
def _binary(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    if ctx.opset < 7 and attrs.get("broadcast"):
        raise UnsupportedError(f"{ctx.source}: legacy broadcast attribute on {node.name!r}")
    a, b = ctx.value(node.input[0]), ctx.value(node.input[1])
    assert a is not None and b is not None
    if b.is_const and b.type.dtype != a.type.dtype and b.const is not None:
        b = ctx.graph.add_constant(ctx.graph.unique_name(b.name), b.const.astype(np.float32))
    ctx.emit(node, _BINARY[node.op_type], [a, b])


@importer("Sum", emits=("Add", "Identity"))
@importer("Max", emits=("Max", "Identity"))
@importer("Min", emits=("Min", "Identity"))
def _variadic(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    op = {"Sum": "Add", "Max": "Max", "Min": "Min"}[node.op_type]
    values = [ctx.value(n) for n in node.input]
    if len(values) == 1:
        ctx.emit(node, "Identity", values)
        return
    acc = values[0]
    for i, v in enumerate(values[1:-1]):
        acc = ctx.graph.add(op, acc, v, name=f"{node.name or op.lower()}_{i}")
    ctx.emit(node, op, [acc, values[-1]])


@importer("Concat", emits=("Concat",))
def _concat(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ctx.emit(node, "Concat", [ctx.value(n) for n in node.input], {"axis": attrs.get("axis", 1)})


@importer("Split", emits=("Split",))
def _split(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    axis = attrs.get("axis", 0)
    size = x.type.shape[axis]
    if ctx.opset >= 13 and len(node.input) > 1 and node.input[1]:
        split = [int(s) for s in ctx.const(node.input[1], node)]
    elif "split" in attrs:
        split = list(attrs["split"])
    else:
        if not isinstance(size, int):
            raise UnsupportedError(f"{ctx.source}: node {node.name!r} (Split) on a symbolic axis")
        parts = attrs.get("num_outputs", len(node.output))
        chunk = -(-size // parts)
        split = [min(chunk, size - i * chunk) for i in range(parts)]
    ir_node = ctx.graph.add_node("Split", [x], {"axis": axis, "split": split}, name=node.name or "split")
    for onnx_name, value in zip(node.output, ir_node.outputs):
        ctx.bind(onnx_name, value)


@importer("Reshape", emits=("Reshape",))
def _reshape(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    shape = [int(s) for s in ctx.const(node.input[1], node)]
    if attrs.get("allowzero", 0) and 0 in shape:
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} (Reshape) with allowzero and a 0 dim")
    x = ctx.value(node.input[0])
    assert x is not None
    ctx.emit(node, "Reshape", [x], {"shape": shape})


@importer("Flatten", emits=("Flatten",))
def _flatten(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ctx.emit(node, "Flatten", [ctx.value(node.input[0])], {"axis": attrs.get("axis", 1)})


@importer("Transpose", emits=("Transpose",))
def _transpose(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    perm = list(attrs.get("perm", range(x.type.rank - 1, -1, -1)))
    ctx.emit(node, "Transpose", [x], {"perm": perm})


@importer("Squeeze", "Unsqueeze", emits={"Squeeze": "Squeeze", "Unsqueeze": "Unsqueeze"})
def _squeeze(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    if ctx.opset >= 13 and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.const(node.input[1], node)]
    elif "axes" in attrs:
        axes = list(attrs["axes"])
    elif node.op_type == "Squeeze":
        axes = [i for i, d in enumerate(x.type.shape) if d == 1]
    else:
        raise InvalidInputError(f"{ctx.source}: node {node.name!r} (Unsqueeze) has no axes")
    ctx.emit(node, node.op_type, [x], {"axes": axes})


@importer("Pad", emits=("Pad",))
def _pad(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if ctx.opset < 11:
        pads, value = list(attrs.get("pads", [])), float(attrs.get("value", 0.0))
    else:
        pads = [int(p) for p in ctx.const(node.input[1], node)]
        value = float(ctx.const(node.input[2], node)) if len(node.input) > 2 and node.input[2] else 0.0
        if len(node.input) > 3 and node.input[3]:
            axes = [int(a) % x.type.rank for a in ctx.const(node.input[3], node)]
            full = [0] * (2 * x.type.rank)
            for i, a in enumerate(axes):
                full[a], full[a + x.type.rank] = pads[i], pads[i + len(axes)]
            pads = full
    if min(pads, default=0) < 0:
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} (Pad) with negative pads")
    ctx.emit(node, "Pad", [x], {"pads": pads, "mode": mode, "value": value})


@importer("MaxPool", "AveragePool", emits={"MaxPool": "MaxPool", "AveragePool": "AvgPool"})
def _pool(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    _need_rank4(ctx, node)
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1, 1]))
    if any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} ({node.op_type}) with dilations")
    pads = _spatial_pads(ctx, node, attrs, kernel, strides, [1, 1])
    ir: dict[str, Any] = {"kernel": kernel, "strides": strides, "pads": pads, "ceil_mode": bool(attrs.get("ceil_mode", 0))}
    if node.op_type == "AveragePool":
        ir["count_include_pad"] = bool(attrs.get("count_include_pad", 0))
    ctx.emit(node, "MaxPool" if node.op_type == "MaxPool" else "AvgPool", [ctx.value(node.input[0])], ir)


@importer("GlobalAveragePool", "GlobalMaxPool",
          emits={"GlobalAveragePool": "GlobalAvgPool", "GlobalMaxPool": "GlobalMaxPool"})
def _global_pool(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    op = "GlobalAvgPool" if node.op_type == "GlobalAveragePool" else "GlobalMaxPool"
    ctx.emit(node, op, [ctx.value(node.input[0])])


@importer("LRN", emits=("LRN",))
def _lrn(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    ir = {"size": attrs["size"], "alpha": attrs.get("alpha", 1e-4), "beta": attrs.get("beta", 0.75), "bias": attrs.get("bias", 1.0)}
    ctx.emit(node, "LRN", [ctx.value(node.input[0])], ir)


@importer("ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2",
          emits={"ReduceMean": "ReduceMean", "ReduceSum": "ReduceSum", "ReduceMax": "ReduceMax", "ReduceL2": "ReduceL2"})
def _reduce(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    if len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.const(node.input[1], node)]
    else:
        axes = list(attrs.get("axes", range(x.type.rank)))
    ctx.emit(node, node.op_type, [x], {"axes": axes, "keepdims": bool(attrs.get("keepdims", 1))})


@importer("Slice", emits=("Slice",))
def _slice(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    if ctx.opset < 10:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps: list[int] = []
    else:
        starts = [int(v) for v in ctx.const(node.input[1], node)]
        ends = [int(v) for v in ctx.const(node.input[2], node)]
        axes = [int(v) for v in ctx.const(node.input[3], node)] if len(node.input) > 3 and node.input[3] else list(range(len(starts)))
        steps = [int(v) for v in ctx.const(node.input[4], node)] if len(node.input) > 4 and node.input[4] else []
    big = 2**62
    ends = [min(max(e, -big), big) for e in ends]
    ctx.emit(node, "Slice", [x], {"starts": starts, "ends": ends, "axes": axes, "steps": steps})


@importer("Cast", emits=("Identity",))
def _cast(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    x = ctx.value(node.input[0])
    assert x is not None
    target = TYPE_NAMES.get(attrs["to"], f"element type {attrs['to']}")
    if target != x.type.dtype:
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} (Cast) of a computed {x.type.dtype} tensor to {target}")
    ctx.emit(node, "Identity", [x])


@importer("Shape", emits=())  # a constant: no IR node
def _shape(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    shape = np.array(ctx.static_shape(node.input[0], node), dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", None)
    ctx.consts[node.output[0]] = shape[start:end]


# ----------------------------------------------------------------------------- folding
def _fold(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> bool:
    """Evaluate a node whose inputs are all constants; True when folded.

    The result's size is predicted from the inputs' shapes and reserved against the limits (and
    the model's running total) before anything computes it (qcc.frontends.onnx_fold_size).
    """
    op = node.op_type
    if op == "Constant":
        where = f"node {node.name!r} (Constant)"
        if "value" in attrs:
            tensor = attrs["value"]
            count = math.prod(int(d) for d in tensor.dims)
            ctx.reserve(count, max(1, declared_bytes(tensor) // max(count, 1)), where)
            ctx.consts[node.output[0]] = to_array(tensor, where, ctx.source)
        else:
            key, val = next(iter(attrs.items()))
            dtype = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}.get(key)
            if dtype is None:
                raise UnsupportedError(f"{ctx.source}: node {node.name!r} (Constant) with {key}")
            ctx.reserve(len(val) if isinstance(val, list) else 1, np.dtype(dtype).itemsize, where)
            ctx.consts[node.output[0]] = np.array(val, dtype=dtype)
        return True
    if not all(ctx.is_const(n) for n in node.input) or op in onnx_quant.FOLD_FIRST:
        return False
    ins: list[Any] = [ctx.consts[n] if n else None for n in node.input]
    _reserve_result(ctx, node, op, ins, attrs)
    result: Any
    if op == "ConstantOfShape":
        where = f"node {node.name!r} (ConstantOfShape)"
        fill = to_array(attrs["value"], where, ctx.source) if "value" in attrs else np.zeros(1, np.float32)
        if fill.size != 1:
            raise InvalidInputError(f"{ctx.source}: {where}: value must hold one element, it holds {fill.size}")
        shape = [int(d) for d in np.asarray(ins[0]).reshape(-1)]
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"{ctx.source}: node {node.name!r} (ConstantOfShape) with shape {shape}")
        result = [np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)]
    elif op == "Identity":
        result = [ins[0]]
    elif op == "Cast" and TYPE_NAMES.get(attrs["to"]) in DTYPES:
        result = [np.asarray(ins[0]).astype(DTYPES[TYPE_NAMES[attrs["to"]]])]
    elif op == "Unsqueeze" and (unsqueezed := _unsqueezed(ctx.opset, ins, attrs)) is not None:
        result = [unsqueezed]
    else:
        result = _reference_eval(ctx, node, op, ins)
    for name, array in zip(node.output, result):
        if name:
            ctx.consts[name] = np.asarray(array)
    return True


def _unsqueezed(opset: int, ins: list[Any], attrs: dict[str, Any]) -> np.ndarray | None:
    """A constant Unsqueeze as onnx's reference evaluator computes it (None: let it, e.g. to refuse
    bad axes): a BatchNorm exported as Mul/Add unsqueezes every parameter (DenseNet: 242 nodes,
    each a reference-evaluator model of its own, plus that evaluator's 0.25 s import)."""
    data = np.asarray(ins[0])
    try:
        if opset >= 13:
            axes = ins[1] if len(ins) > 1 else None
            if axes is None or np.asarray(axes).ndim != 1 or np.asarray(axes).dtype.kind not in "iu":
                return None
            return np.expand_dims(data, axis=tuple(int(a) for a in np.asarray(axes)))
        if not attrs.get("axes"):
            return None
        for a in attrs["axes"]:  # one at a time, in the given order, as the reference's Unsqueeze_1
            data = np.expand_dims(data, axis=int(a))
        return data
    except (ValueError, TypeError, IndexError):  # numpy's AxisError is a ValueError and an IndexError
        return None


def _reserve_result(ctx: _Ctx, node: Any, op: str, ins: list[Any], attrs: dict[str, Any]) -> None:
    """Refuse a folded result over the limits before numpy or the reference evaluator allocates it."""
    try:
        count = folded_elements(op, ins, attrs)
        itemsize = folded_itemsize(op, ins, attrs, DTYPES.get(TYPE_NAMES.get(attrs.get("to", -1), "")))
        if op == "ConstantOfShape" and "value" in attrs:
            itemsize = max(1, declared_bytes(attrs["value"]))
    except (ValueError, TypeError, IndexError, OverflowError, ZeroDivisionError, AttributeError):
        raise InvalidInputError(f"{ctx.source}: node {node.name!r} ({op}) has malformed constant inputs") from None
    elements = int(count) if math.isfinite(count) and count < 2**62 else 2**62
    ctx.reserve(elements, itemsize, f"node {node.name!r} ({op})")
    work = folding_work(op, ins, attrs, elements)  # transient: checked, not added to the model's total
    if work > elements:
        limits.check_tensor(int(min(work, 2**62)), itemsize, f"folding node {node.name!r} ({op})", ctx.source)


def _reference_eval(ctx: _Ctx, node: Any, op: str, ins: list[Any]) -> Any:
    """Fold one node with onnx's reference evaluator (exact ONNX semantics for rare ops)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(f"i{i}", 0, None) for i in range(len(ins))]
    fn_node = helper.make_node(op, [f"i{i}" if n else "" for i, n in enumerate(node.input)],
                               [f"o{i}" for i in range(len(node.output))], domain=node.domain)
    fn_node.attribute.extend(node.attribute)
    outputs = [helper.make_tensor_value_info(f"o{i}", 0, None) for i in range(len(node.output))]
    graph = helper.make_graph([fn_node], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ctx.opset)])
    try:
        results = ReferenceEvaluator(model).run(None, {f"i{i}": a for i, a in enumerate(ins) if a is not None})
        return [decode_array(np.asarray(r)) for r in results]
    except QccError:
        raise
    except Exception as exc:
        raise InvalidInputError(f"{ctx.source}: cannot fold constant node {node.name!r} ({op}): {exc}") from None


_FOLD_ONLY = ("Constant", "ConstantOfShape", "Range", "Equal", "Where", "Expand", "Tile", "NonZero",
              "ReduceProd", "Floor", "Ceil")


def supported_ops() -> list[str]:
    return sorted(set(IMPORTERS) | set(_FOLD_ONLY))


# ----------------------------------------------------------------------------- entry
def read_proto(path: Path, max_bytes: int) -> Any:
    """The ModelProto of a regular file under `max_bytes`, its external data moved inside (only
    from the model's folder, within the limits); what is not readable is an InvalidInputError."""
    import onnx
    from google.protobuf.message import DecodeError

    data = read_regular_file(path, max_bytes, "model")
    import warnings

    try:
        with warnings.catch_warnings(), quiet_native_stderr():
            warnings.simplefilter("ignore")
            proto = onnx.load_from_string(data)
    except (DecodeError, Exception) as exc:  # protobuf raises several types for corrupt bytes
        raise InvalidInputError(f"{path}: not a valid ONNX model ({type(exc).__name__}: {exc})") from None
    if not proto.HasField("graph"):
        raise InvalidInputError(f"{path}: not a valid ONNX model (no graph)")
    resolve_external_data(proto, path, str(path))
    return proto


def _ttype(type_proto: Any, name: str, source: str) -> TensorType:
    tt = type_proto.tensor_type
    dtype = TYPE_NAMES.get(tt.elem_type)
    if dtype is None:
        raise InvalidInputError(f"{source}: input {name!r} has an unknown element type {tt.elem_type}")
    if dtype not in DTYPES:
        raise UnsupportedError(f"{source}: input {name!r} has element type {dtype}, which qcc does not handle")
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_value") and d.dim_value != -1:
            raise InvalidInputError(f"{source}: input {name!r} has dimension {d.dim_value} at axis {i}")
        elif d.dim_param and d.dim_param != "?":  # '?' (paddle2onnx) marks a dim unknown, not one shared symbol
            dims.append(d.dim_param)
        else:  # no dim at all, '?', or -1 (how several exporters write a dynamic dim)
            dims.append("N" if i == 0 else f"{name}_d{i}")
    return TensorType(dtype, tuple(dims))


def load_onnx(path: str | os.PathLike[str], batch_size: int | None = None,
              input_shapes: ShapeSpec | None = None, **_: Any) -> Model:
    """Import an ONNX file (see module doc); `input_shapes` and `batch_size` bind dynamic input dims
    (qcc.frontends.input_shapes) before any node is imported, so shape computations fold."""
    source = Path(path)
    proto = read_proto(source, limits.current().max_file_bytes)
    return import_proto(proto, str(source), batch_size, input_shapes, consume=True)


def import_proto(proto: Any, source: str = "<onnx>", batch_size: int | None = None,
                 input_shapes: ShapeSpec | None = None, consume: bool = False) -> Model:
    """Build the IR of an ONNX ModelProto; anything malformed is an InvalidInputError naming `source`.

    `consume=True` drops each initializer's bytes from `proto` once it is an array, so the file's
    parameters are not held twice at the peak (the proto is the caller's, so only on request).
    """
    try:
        return _import_proto(proto, source, batch_size, input_shapes, consume)
    except QccError:
        raise
    except MALFORMED_ERRORS as exc:
        raise InvalidInputError(f"{source}: malformed ONNX model: {type(exc).__name__}: {str(exc)[:300]}") from None


def _import_proto(proto: Any, source: str, batch_size: int | None, input_shapes: ShapeSpec | None,
                  consume: bool) -> Model:
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedError(f"{source}: ONNX opset {opset} is not supported (supported: {MIN_OPSET}..{MAX_OPSET})")
    g = proto.graph
    lim = limits.current()
    limits.check_count("nodes", len(g.node), lim.max_nodes, source)
    graph = Graph(name=g.name or Path(source).stem)
    ctx = _Ctx(graph, opset, source)
    resolve_external_data(proto, None, source)  # a file's references were resolved by read_proto; others are refused
    for tensor in g.initializer:
        where = f"initializer {tensor.name!r}"
        if tensor.data_type not in TYPE_NAMES:
            raise InvalidInputError(f"{source}: {where} has unknown element type {tensor.data_type}")
        count = int(np.prod([int(d) for d in tensor.dims], dtype=np.float64))
        ctx.reserve(count, max(1, declared_bytes(tensor) // max(count, 1)), where)
        ctx.consts[tensor.name] = to_array(tensor, where, source)
        if consume:
            tensor.ClearField("raw_data")
    declared = {vi.name: _ttype(vi.type, vi.name, source) for vi in g.input if vi.name not in ctx.consts}
    bound = bind_inputs({name: t.shape for name, t in declared.items()}, input_shapes, batch_size, source)
    for name, ttype in declared.items():
        ttype = TensorType(ttype.dtype, bound.shapes[name])
        limits.check_elements(ttype.numel(), f"input {name!r}", source)
        ctx.values[name] = graph.add_input(name, ttype)
    ctx.index_readers(g.node)
    ctx.graph_outputs = {vi.name for vi in g.output}
    unsupported: dict[str, list[str]] = {}
    for node in g.node:
        texts = [node.op_type, node.name, node.domain, *node.input, *node.output]
        if not all(isinstance(t, str) for t in texts):
            raise InvalidInputError(f"{source}: node {node.name!r} has names that are not valid UTF-8")
        if node.domain not in ("", "ai.onnx") and not (node.domain == onnx_quant.MS_DOMAIN
                                                         and node.op_type in onnx_quant.DOMAIN_OPS):
            unsupported.setdefault(f"{node.domain}.{node.op_type}", []).append(node.name)
            continue
        if node.op_type not in IMPORTERS and node.op_type not in _FOLD_ONLY:
            unsupported.setdefault(node.op_type, []).append(node.name)
    for index, node in enumerate(g.node):
        if not node.name:
            node.name = f"{node.op_type.lower()}_{index}"
    _check_graph_structure(g, source)
    if unsupported:
        listed = "; ".join(f"{op} (nodes {', '.join(repr(n) for n in names[:3])}{'...' if len(names) > 3 else ''})"
                           for op, names in sorted(unsupported.items()))
        raise UnsupportedError(f"{source}: unsupported ONNX op(s): {listed}. Supported: {', '.join(supported_ops())}")
    for node in g.node:
        try:
            _import_node(ctx, g, node, source)
        except (UnsupportedError, InvalidInputError) as exc:
            raise _with_shape_hint(exc, ctx, node, bound) from exc.__cause__
        except QccError:
            raise
        except MALFORMED_ERRORS as exc:
            # hostile or malformed attributes: name the node instead of crashing
            raise InvalidInputError(
                f"{source}: node {node.name!r} ({node.op_type}) is malformed: {type(exc).__name__}: {exc}") from None
    for vi in g.output:
        if vi.name in ctx.values:
            graph.outputs.append(ctx.values[vi.name])
        elif vi.name in ctx.consts:
            graph.outputs.append(ctx.value(vi.name))  # type: ignore[arg-type]
        else:
            raise InvalidInputError(f"{source}: graph output {vi.name!r} is never computed")
    for value in graph.values():
        limits.check_elements(value.type.numel(), f"tensor {value.name!r}", source)
    fuse_gated_activations(graph)
    model = Model(graph, metadata={"source": source, "source_format": "onnx", "onnx_opset": opset})
    problems = verify_model(model)
    if problems:
        raise InvalidInputError(f"{source}: imported graph is invalid: " + "; ".join(problems[:10]))
    return model


def _with_shape_hint(exc: QccError, ctx: _Ctx, node: Any, bound: BoundShapes) -> QccError:
    """`exc`, plus which input dim to bind when the node read a tensor with a dynamic dim."""
    hint = bound.hint((ctx.values[n].type.shape for n in node.input if n in ctx.values), str(exc))
    if not hint or hint in str(exc):
        return exc
    return type(exc)(f"{exc}; {hint}")


def _check_graph_structure(g: Any, source: str) -> None:
    """What ONNX's checker requires and the importer relies on: one producer per tensor (not a
    graph input or initializer), at least one output and one node. Linear in the graph's size."""
    if not len(g.output):
        raise InvalidInputError(f"{source}: the graph has no outputs: nothing to compile")
    if not len(g.node):
        raise InvalidInputError(f"{source}: the graph has no nodes: nothing to compile")
    defined = {t.name: "an initializer" for t in g.initializer}
    defined.update({vi.name: "a graph input" for vi in g.input if vi.name not in defined})
    for node in g.node:
        for name in node.output:
            if not name:
                continue
            if name in defined:
                raise InvalidInputError(f"{source}: node {node.name!r} ({node.op_type}) writes {name!r}, which "
                                        f"{defined[name]} already defines (each tensor has one producer)")
            defined[name] = f"node {node.name!r} ({node.op_type})"


_SCHEMAS: dict[tuple[str, int], Any] = {}


def _check_attributes(node: Any, opset: int, source: str) -> None:
    """Attributes by ONNX's own schema for the op and opset: known names, declared types.

    A string where ints are expected would otherwise be read as its bytes (Transpose perm="ab"
    is perm [97, 98]); an attribute the op does not have would be ignored.
    """
    from onnx import defs

    key = (node.op_type, opset)
    if key not in _SCHEMAS:
        try:
            _SCHEMAS[key] = defs.get_schema(node.op_type, opset, "")
        except defs.SchemaError:
            _SCHEMAS[key] = None
    schema = _SCHEMAS[key]
    if schema is None:
        return
    for attribute in node.attribute:
        spec = schema.attributes.get(attribute.name)
        where = f"{source}: node {node.name!r} ({node.op_type})"
        if spec is None:
            raise InvalidInputError(f"{where} has attribute {attribute.name!r}, which {node.op_type} (opset {opset}) "
                                    f"does not define (it has: {', '.join(sorted(schema.attributes)) or 'none'})")
        if attribute.type != int(spec.type.value):
            raise InvalidInputError(f"{where}: attribute {attribute.name!r} is {_attr_type(attribute.type)}, "
                                    f"{node.op_type} takes {_attr_type(int(spec.type.value))}")


def _attr_type(code: int) -> str:
    from onnx import AttributeProto

    try:
        return str(AttributeProto.AttributeType.Name(code)).lower()
    except ValueError:
        return f"type {code}"


def _import_node(ctx: _Ctx, g: Any, node: Any, source: str) -> None:
    from onnx import helper

    _check_attributes(node, ctx.opset, source)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if _fold(ctx, node, attrs):
        return
    if node.op_type not in IMPORTERS:
        raise UnsupportedError(f"{source}: node {node.name!r} ({node.op_type}) is only supported on constant inputs")
    for name in node.input:
        if name and name not in ctx.values and name not in ctx.consts:
            if any(name in other.output for other in g.node):
                raise UnsupportedError(f"{source}: node {node.name!r} ({node.op_type}) reads {name!r}, an output qcc "
                                       "does not compute (e.g. a Dropout mask or MaxPool indices) or that comes later (a cycle)")
            raise InvalidInputError(f"{source}: node {node.name!r} ({node.op_type}) reads {name!r}, which is not defined before it")
    before = len(ctx.graph.nodes)
    IMPORTERS[node.op_type](ctx, node, attrs)
    created = ctx.graph.nodes[before:]
    check_emitted(EMITS, node.op_type, (n.op for n in created), f"{source}: node {node.name!r}")
    onnx_quant.after_import(ctx, node, created)


onnx_quant.install(IMPORTERS, importer)


class OnnxFrontend:
    name = "onnx"
    extensions = (".onnx",)
    load_options = ("batch_size", "input_shapes")  # what `qcc compile` may pass; any other loading flag is a usage error

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: every IR op an ONNX op imports as."""
        return {"onnx import": {op: "yes" for op in emitted_ops(EMITS) | FUSED_OPS}}

    def load(self, path: str | os.PathLike[str], **options: Any) -> Model:
        return load_onnx(path, **options)


FRONTEND = OnnxFrontend()

for _module in ("qcc.frontends.onnx_layers", "qcc.frontends.onnx_matmul", "qcc.frontends.onnx_rnn"):
    importlib.import_module(_module)  # they add their importers to IMPORTERS
