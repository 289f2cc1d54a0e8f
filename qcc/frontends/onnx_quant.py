"""Already-quantized ONNX in: QuantizeLinear/DequantizeLinear and QLinear* as IR annotations.

A QDQ model (onnxruntime's quantize_static, qcc's own onnx-qdq output) or a QOperator model
(QLinearConv, QLinearMatMul, com.microsoft's QLinearAdd, ...) imports as the float IR it stands
for, its quantization carried by annotations (docs/quantized-ir.md):
- every integer tensor of the file is the IR value it dequantizes to, annotated
  `Affine(scale, zero_point, dtype, axis)`; a DequantizeLinear of it is that same value;
- `x -> QuantizeLinear -> DequantizeLinear` annotates x itself when nothing else reads x as a
  float (what a QDQ writer means), else becomes a `Quantize` node (x keeps its float readers);
- a quantized constant (weights, int32 biases) becomes the float constant DequantizeLinear gives
  (float32 (q - zp) * scale, as ONNX defines it) carrying its annotation, so annotating it again
  gives back the same integers, bit for bit;
- a QLinear* op is its float op between annotated inputs and an annotated output; value moves
  (MaxPool, Reshape, Transpose, ...) on an integer tensor keep its annotation.
Anything else that reads an integer tensor (ConvInteger, DynamicQuantizeLinear, QAttention ...)
is refused by name, like any op the frontend lacks.

This module only knows the ONNX quantization ops; the ONNX frontend (`qcc.frontends.onnx`) calls
`install` to add them to its table and `after_import` after every node.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np

from qcc.errors import UnsupportedError
from qcc.ir.core import Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.types import Affine
from qcc.quant.numerics import dequantize_affine

MS_DOMAIN = "com.microsoft"
INTEGER_DTYPES = {np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8", np.dtype(np.int16): "int16",
                  np.dtype(np.uint16): "uint16", np.dtype(np.int32): "int32"}

Handler = Callable[[Any, Any, dict[str, Any]], None]
HANDLERS: dict[str, tuple[Handler, tuple[str, ...]]] = {}
"""ONNX op -> (importer, IR ops it may create); `install` copies them into the ONNX frontend's table."""
DOMAIN_OPS = frozenset({"QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearAveragePool",
                        "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QGemm"})
"""Ops of the com.microsoft domain (onnxruntime's QOperator format) this module imports."""
FOLD_FIRST = frozenset({"DequantizeLinear"})
"""Ops the frontend must not fold as plain constants: their annotation would be lost."""


def _handles(*ops: str, emits: tuple[str, ...] = ()) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for op in ops:
            HANDLERS[op] = (fn, emits)
        return fn

    return deco


def install(table: dict[str, Any], register: Callable[..., Callable[[Handler], Handler]]) -> None:
    """Add every handler to the frontend's table through its registrar (emits recorded there)."""
    for op, (fn, emits) in HANDLERS.items():
        if op not in table:
            register(op, emits=emits)(fn)


# ----------------------------------------------------------------------------- parameters
def _where(ctx: Any, node: Any) -> str:
    return f"{ctx.source}: node {node.name!r} ({node.op_type})"


def affine_of(ctx: Any, node: Any, scale_name: str, zp_name: str | None, axis: int | None,
              rank: int | None = None, default_dtype: str = "uint8") -> Affine:
    """The annotation a (scale, zero point[, axis]) pair stands for; constants only."""
    scale = np.asarray(ctx.const(scale_name, node), dtype=np.float32).reshape(-1)
    zp_arr = np.asarray(ctx.const(zp_name, node)) if zp_name else np.zeros(scale.shape, np.dtype(default_dtype))
    dtype = INTEGER_DTYPES.get(zp_arr.dtype)
    if dtype is None:
        raise UnsupportedError(f"{_where(ctx, node)}: zero point of element type {zp_arr.dtype} (qcc's affine "
                               f"annotations are {', '.join(INTEGER_DTYPES.values())})")
    zp = zp_arr.reshape(-1).astype(np.int64)
    if zp.size == 1 and scale.size > 1:
        zp = np.repeat(zp, scale.size)
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise UnsupportedError(f"{_where(ctx, node)}: scale {scale_name!r} must be positive and finite")
    if scale.size == 1:
        return Affine((float(scale[0]),), (int(zp[0]),), dtype)
    axis = 1 if axis is None else axis
    if rank is not None:
        axis %= rank
    return Affine(tuple(float(s) for s in scale), tuple(int(z) for z in zp), dtype, axis)


def _check_attrs(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    if int(attrs.get("block_size", 0) or 0):
        raise UnsupportedError(f"{_where(ctx, node)}: blocked quantization (block_size) is not supported")
    if "output_dtype" in attrs and int(attrs["output_dtype"]) not in (0, 1):
        raise UnsupportedError(f"{_where(ctx, node)}: output_dtype {attrs['output_dtype']} (only float32 is handled)")


def dequantized_constant(ctx: Any, name: str, q: np.ndarray, quant: Affine) -> None:
    """Register ONNX constant `name` as the float32 values of `q` under `quant`, annotated."""
    scale = np.asarray(quant.scale, np.float32)
    zp = np.asarray(quant.zero_point, np.int64)
    if quant.axis is None:
        scale, zp = scale[0], zp[0]
    ctx.consts[name] = dequantize_affine(q, scale, zp, quant.axis)
    ctx.const_quant[name] = quant


def annotation(ctx: Any, name: str) -> Affine | None:
    """The annotation of an ONNX tensor that holds integers (None: a float tensor)."""
    if name in ctx.const_quant:
        return ctx.const_quant[name]  # type: ignore[no-any-return]
    if name in ctx.int_names:
        value = ctx.values[name]
        return value.quant if isinstance(value.quant, Affine) else None
    return None


def carry_gemm_annotations(ctx: Any, node: Any, weight: Value, bias: Value | None, transposed: bool,
                           unscaled: bool) -> None:
    """Gemm builds new constants from its B and C: they keep the annotations of the file's
    (B's channel axis follows the transposition; alpha/beta other than 1 change the values)."""
    wq = ctx.const_quant.get(node.input[1])
    if unscaled and isinstance(wq, Affine):
        axis = None if wq.axis is None else (1 - wq.axis if transposed else wq.axis)
        weight.quant = Affine(wq.scale, wq.zero_point, wq.dtype, axis)
    bq = ctx.const_quant.get(node.input[2]) if len(node.input) > 2 else None
    if unscaled and bias is not None and isinstance(bq, Affine):
        bias.quant = bq


# ----------------------------------------------------------------------------- Q / DQ
@_handles("DequantizeLinear", emits=())
def _dequantize(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    _check_attrs(ctx, node, attrs)
    x = node.input[0]
    zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if ctx.is_const(x):
        q = np.asarray(ctx.const(x, node))
        if q.dtype not in INTEGER_DTYPES:
            raise UnsupportedError(f"{_where(ctx, node)}: input {x!r} of element type {q.dtype}")
        quant = affine_of(ctx, node, node.input[1], zp, attrs.get("axis"), q.ndim, INTEGER_DTYPES[q.dtype])
        dequantized_constant(ctx, node.output[0], q, quant)
        return
    have = annotation(ctx, x)
    value = ctx.values[x]
    want = affine_of(ctx, node, node.input[1], zp, attrs.get("axis"), value.type.rank,
                     have.dtype if have is not None else "uint8")
    if have is None or not same_values(have, want):
        raise UnsupportedError(f"{_where(ctx, node)}: dequantizes {x!r} with other parameters than it was "
                               f"quantized with ({want} vs {have}); qcc reads each integer tensor one way")
    if value.producer() is not None and (value.name.startswith(node.output[0]) or value.meta.pop(RELU_META, False)):
        ctx.bind(node.output[0], value)  # qcc's writer: `<name>_float` -> Q -> DQ -> `<name>`
    ctx.values[node.output[0]] = value


@_handles("QuantizeLinear", emits=("Quantize", "Relu"))
def _quantize(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    _check_attrs(ctx, node, attrs)
    if not int(attrs.get("saturate", 1)):
        raise UnsupportedError(f"{_where(ctx, node)}: saturate=0")
    value: Value = ctx.value(node.input[0])
    zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
    quant = affine_of(ctx, node, node.input[1], zp, attrs.get("axis"), value.type.rank)
    if quant.axis is not None:
        raise UnsupportedError(f"{_where(ctx, node)}: per-axis quantization of an activation")
    if value.quant is None and not value.is_const and _only_quantized(ctx, node):
        value.quant = quant  # the value is stored quantized: what the file's Q -> DQ pair means
        if _relu_folded(value, quant):
            value = ctx.graph.add("Relu", value, name=ctx.graph.unique_name(f"{value.name}_relu"))
            value.quant = quant
            value.meta[RELU_META] = True
        ctx.values[node.output[0]] = value
    else:
        out = ctx.emit(node, "Quantize", [value])
        out.quant = quant
    ctx.int_names.add(node.output[0])


RELU_META = "qdq_relu"
NONNEGATIVE = frozenset({"Relu", "Sigmoid", "Softmax", "HardSigmoid", "Exp", "Abs", "Clip", "Quantize"})


def _relu_folded(value: Value, quant: Affine) -> bool:
    """The quantization clamps at zero (zero point = the type's minimum) after an op that can give
    negatives: the writer folded a Relu into it (onnxruntime and qcc both do). The Relu comes back,
    annotated like its input, so the float reading of the model is the float model again and
    the quantized one is unchanged (a Relu between equal annotations is exact)."""
    from qcc.quant import AFFINE_DTYPES

    def clamps(q: Any) -> bool:
        return isinstance(q, Affine) and q.axis is None and q.zero_point[0] == AFFINE_DTYPES[q.dtype][0]

    producer = value.producer()
    if producer is None or producer.op in NONNEGATIVE or get_schema(producer.op).has("keeps_annotation"):
        return False
    inputs = [v for v in producer.inputs if v is not None]
    if all(not v.is_const and clamps(v.quant) for v in inputs):
        return False  # averages and sums of values >= 0 (AvgPool, Add of two Relu outputs)
    return clamps(quant)


def _only_quantized(ctx: Any, node: Any) -> bool:
    """Every reader of the Q's input is a QuantizeLinear with the same parameters, and the input is
    no graph output: annotating it changes nothing a float reader would see."""
    name = node.input[0]
    if name in ctx.graph_outputs:
        return False
    params = list(node.input[1:])
    return all(user.op_type == "QuantizeLinear" and list(user.input[1:]) == params for user in ctx.readers(name))


def same_values(a: Affine, b: Affine) -> bool:
    """The two annotations read every stored integer as the same real value (int8 stored as uint8
    with zero point + 128 included)."""
    if a.axis != b.axis or len(a.scale) != len(b.scale) or any(
            np.float32(x) != np.float32(y) for x, y in zip(a.scale, b.scale)):
        return False
    from qcc.quant import AFFINE_DTYPES

    lo_a, lo_b = AFFINE_DTYPES[a.dtype][0], AFFINE_DTYPES[b.dtype][0]
    return all(za - lo_a == zb - lo_b for za, zb in zip(a.zero_point, b.zero_point)) and \
        AFFINE_DTYPES[a.dtype][1] - lo_a == AFFINE_DTYPES[b.dtype][1] - lo_b


# ----------------------------------------------------------------------------- QLinear*
def _int_input(ctx: Any, node: Any, name: str, scale: str, zp: str | None, axis: int | None = None) -> str:
    """The float ONNX name that stands for integer input `name` read with (scale, zp)."""
    if ctx.is_const(name):
        q = np.asarray(ctx.const(name, node))
        quant = affine_of(ctx, node, scale, zp, axis, q.ndim, INTEGER_DTYPES.get(q.dtype, "uint8"))
        alias = f"{name}__dequantized"
        dequantized_constant(ctx, alias, q, quant)
        return alias
    have = annotation(ctx, name)
    want = affine_of(ctx, node, scale, zp, None, None, have.dtype if have is not None else "uint8")
    if have is None or not same_values(have, want):
        raise UnsupportedError(f"{_where(ctx, node)}: reads {name!r} with other parameters than it was "
                               f"quantized with ({want} vs {have})")
    return name


def _bias(ctx: Any, node: Any, name: str, x_scale: str, w_scale: str) -> str:
    """An int32 bias at scale x_scale * w_scale, as a dequantized, annotated float constant."""
    q = np.asarray(ctx.const(name, node)).astype(np.int32)
    sx = np.asarray(ctx.const(x_scale, node), np.float32).reshape(-1)
    sw = np.asarray(ctx.const(w_scale, node), np.float32).reshape(-1)
    scale = (sx * sw).astype(np.float32)
    axis = 0 if scale.size > 1 else None
    quant = Affine(tuple(float(s) for s in scale), (0,) * scale.size, "int32", axis)
    alias = f"{name}__dequantized"
    dequantized_constant(ctx, alias, q, quant)
    return alias


def _delegate(ctx: Any, node: Any, op_type: str, inputs: list[str], attrs: dict[str, Any],
              out_quant: tuple[str, str | None] | None) -> None:
    """Import `node` as the float op `op_type` on `inputs`, its output annotated (scale, zp) names."""
    proxy = types.SimpleNamespace(name=node.name, op_type=op_type, input=inputs, output=list(node.output[:1]),
                                  domain="", attribute=[])
    ctx.importers[op_type](ctx, proxy, attrs)
    if out_quant is None:
        return
    value = ctx.values[node.output[0]]
    value.quant = affine_of(ctx, node, out_quant[0], out_quant[1], None, value.type.rank)
    if _relu_folded(value, value.quant):
        relu = ctx.graph.add("Relu", value, name=ctx.graph.unique_name(f"{node.name}_relu"))
        relu.quant = value.quant
        ctx.bind(node.output[0], relu)
    ctx.int_names.add(node.output[0])


def _opt(node: Any, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


@_handles("QLinearConv", emits=("Conv", "Relu"))
def _qlinear_conv(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    x = _int_input(ctx, node, node.input[0], node.input[1], node.input[2])
    w = _int_input(ctx, node, node.input[3], node.input[4], node.input[5], axis=0)
    inputs = [x, w]
    if _opt(node, 8):
        inputs.append(_bias(ctx, node, node.input[8], node.input[1], node.input[4]))
    _delegate(ctx, node, "Conv", inputs, attrs, (node.input[6], node.input[7]))


@_handles("QLinearMatMul", emits=("Dense", "MatMul", "Relu"))
def _qlinear_matmul(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    a = _int_input(ctx, node, node.input[0], node.input[1], node.input[2])
    b = _int_input(ctx, node, node.input[3], node.input[4], node.input[5], axis=-1)
    _delegate(ctx, node, "MatMul", [a, b], attrs, (node.input[6], node.input[7]))


@_handles("QGemm", emits=("Transpose", "Dense", "Add", "MatMul", "Mul", "Relu"))
def _qgemm(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    a = _int_input(ctx, node, node.input[0], node.input[1], node.input[2])
    b_axis = 0 if attrs.get("transB", 0) else -1
    b = _int_input(ctx, node, node.input[3], node.input[4], node.input[5], axis=b_axis)
    inputs = [a, b]
    if _opt(node, 6):
        inputs.append(_bias(ctx, node, node.input[6], node.input[1], node.input[4]))
    out = (node.input[7], _opt(node, 8)) if _opt(node, 7) else None
    _delegate(ctx, node, "Gemm", inputs, attrs, out)


@_handles("QLinearAdd", "QLinearMul", emits=("Add", "Mul", "Relu"))
def _qlinear_binary(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    a = _int_input(ctx, node, node.input[0], node.input[1], _opt(node, 2))
    b = _int_input(ctx, node, node.input[3], node.input[4], _opt(node, 5))
    _delegate(ctx, node, node.op_type[len("QLinear"):], [a, b], attrs, (node.input[6], _opt(node, 7)))


_UNARY = {"QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
          "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearSoftmax": "Softmax"}


@_handles(*_UNARY, emits=("GlobalAvgPool", "AvgPool", "Sigmoid", "LeakyRelu", "Softmax", "Flatten", "Reshape", "Relu"))
def _qlinear_unary(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    if int(attrs.pop("channels_last", 0) or 0):
        raise UnsupportedError(f"{_where(ctx, node)}: channels_last=1")
    attrs.pop("opset", None)
    x = _int_input(ctx, node, node.input[0], node.input[1], _opt(node, 2))
    _delegate(ctx, node, _UNARY[node.op_type], [x], attrs, (node.input[3], _opt(node, 4)))


@_handles("QLinearConcat", emits=("Concat", "Relu"))
def _qlinear_concat(ctx: Any, node: Any, attrs: dict[str, Any]) -> None:
    rest = list(node.input[2:])
    if len(rest) % 3:
        raise UnsupportedError(f"{_where(ctx, node)}: inputs must come in (tensor, scale, zero point) triples")
    inputs = [_int_input(ctx, node, rest[i], rest[i + 1], rest[i + 2] or None) for i in range(0, len(rest), 3)]
    _delegate(ctx, node, "Concat", inputs, attrs, (node.input[0], node.input[1]))


# ----------------------------------------------------------------------------- value moves
def after_import(ctx: Any, node: Any, created: list[Node]) -> None:
    """A plain ONNX op that read an integer tensor: value moves keep its annotation; anything that
    computes on the integers is refused (its float IR op would compute on dequantized values)."""
    if node.op_type in HANDLERS or not node.input or node.input[0] not in ctx.int_names:
        return
    quant = annotation(ctx, node.input[0])
    moves = all(get_schema(n.op).has("keeps_annotation") for n in created)
    if quant is None or not moves:
        raise UnsupportedError(f"{_where(ctx, node)}: computes on the integers of {node.input[0]!r}; qcc imports "
                               "integer tensors through DequantizeLinear and the QLinear* ops only")
    for name in node.output:
        if name and name in ctx.values:
            ctx.values[name].quant = quant
            ctx.int_names.add(name)
