"""NNabla frontend: one network of an .nnp (or .nntxt) into qcc's IR.

Variable names become IR value names and function names become node names, so the names of a
settings.yaml (`nnabla_cli nnb_template`) address the same tensors in qcc. Values and nodes qcc
has to add (the Flatten before a Dense, the constant of an AddScalar) carry
`meta['nnp.internal'] = True`; the .nnp writer and the settings export leave them out.
Every variable's shape is checked against the shape the file declares.
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
from qcc.errors import MALFORMED_ERRORS, InvalidInputError, QccError, UnsupportedError, UsageError
from qcc.formats import nnabla_functions as nf
from qcc.formats.nnp import INTERNAL, NnpSource, pool_geometry
from qcc.formats.nnp_archive import NnpContents, function_args, param_field, read_nnp
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.fusion import FUSED_OPS, fuse_gated_activations
from qcc.ir.types import Affine, Dim, FixedPoint, QuantType, Sign, TensorType
from qcc.ir.verify import verify_model
from qcc.tables import check_emitted, emitted_ops, importer_registrar

AFFINE_LEVELS = {(0, 255): "uint8", (-128, 127): "int8", (0, 65535): "uint16", (-32768, 32767): "int16"}


class _Ctx:
    """Import state for one network: nnabla variable names -> IR values."""

    def __init__(self, graph: Graph, network: Any, contents: NnpContents, source: str, batch: Dim) -> None:
        self.graph = graph
        self.network = network
        self.params = contents.params
        self.source = source
        self.batch = batch
        self.declared = {v.name: v for v in network.variable}
        self.values: dict[str, Value] = {}
        self.notes: list[str] = []
        self._consts: dict[tuple[str, str], Value] = {}
        graph._names.update(self.declared)

    # ------------------------------------------------------------------ values
    def where(self, f: Any) -> str:
        return f"{self.source}: function {f.name!r} ({f.type})"

    def is_param(self, name: str) -> bool:
        var = self.declared.get(name)
        return name not in self.values and (name in self.params or (var is not None and var.type == "Parameter"))

    def array(self, name: str, f: Any) -> np.ndarray:
        if name not in self.params:
            raise InvalidInputError(
                f"{self.where(f)}: parameter {name!r} has no data in the file (missing parameter .h5/.protobuf?)")
        return np.ascontiguousarray(self.params[name], dtype=np.float32)

    def const(self, name: str, f: Any, data: np.ndarray | None = None, form: str = "") -> Value:
        """IR constant for parameter `name` (optionally transformed; one constant per form)."""
        key = (name, form)
        if key not in self._consts:
            array = self.array(name, f) if data is None else np.ascontiguousarray(data, dtype=np.float32)
            taken = any(k[0] == name for k in self._consts)
            value = self.graph.add_constant(self.graph.unique_name(f"{name}/{form}") if taken else name, array)
            self._consts[key] = value
        return self._consts[key]

    def internal_const(self, base: str, data: np.ndarray) -> Value:
        value = self.graph.add_constant(self.graph.unique_name(base), np.asarray(data, dtype=np.float32))
        value.meta[INTERNAL] = True
        return value

    def value(self, name: str, f: Any) -> Value:
        if name in self.values:
            return self.values[name]
        if self.is_param(name):
            return self.const(name, f)
        raise InvalidInputError(f"{self.where(f)}: input {name!r} is not computed before it is used")

    def inputs(self, f: Any) -> list[Value]:
        return [self.value(n, f) for n in f.input]

    # ------------------------------------------------------------------ nodes
    def emit(self, f: Any, op: str, inputs: list[Value | None], attrs: dict[str, Any] | None = None,
             out: int = 0) -> Node:
        """The node that computes nnabla output `out` of `f` (named like the function and variable)."""
        name = f.output[out]
        node = self.graph.add_node(op, inputs, attrs, name=f.name, output_names=[name])
        node.meta["nnp.type"] = f.type
        self.values[name] = node.outputs[0]
        return node

    def helper(self, f: Any, op: str, inputs: list[Value | None], attrs: dict[str, Any] | None = None,
               suffix: str = "") -> Value:
        """An extra node qcc needs for `f` (not an nnabla function of its own)."""
        node = self.graph.add_node(op, inputs, attrs, name=f"{f.name}/{suffix or op.lower()}")
        node.meta[INTERNAL] = True
        node.outputs[0].meta[INTERNAL] = True
        return node.outputs[0]

    def dims(self, name: str) -> tuple[Dim, ...]:
        var = self.declared[name]
        return tuple(self.batch if d == -1 else int(d) for d in var.shape.dim)


Importer = Callable[[_Ctx, Any, Any], None]
IMPORTERS: dict[str, Importer] = {}
EMITS: dict[str, frozenset[str]] = {}
"""nnabla function -> the IR ops its importer may create (checked on every import)."""


importer = importer_registrar(IMPORTERS, EMITS)


def _need(cond: bool, ctx: _Ctx, f: Any, what: str) -> None:
    if not cond:
        raise UnsupportedError(f"{ctx.where(f)}: {what}")


def _dims(shape: Any, default: list[int]) -> list[int]:
    values = [int(d) for d in shape.dim]
    return values or default


def _spatial(ctx: _Ctx, f: Any, p: Any, x: Value) -> dict[str, Any]:
    _need(x.type.rank == 4 and int(getattr(p, "base_axis", 1) or 1) == 1, ctx, f,
          f"only 2-D NCHW inputs with base_axis 1 are supported (input shape {x.type.shape})")
    _need(not getattr(p, "channel_last", False), ctx, f, "channel_last is not supported")
    pad = _dims(p.pad, [0, 0])
    return {"strides": _dims(p.stride, [1, 1]), "pads": pad + pad, "dilations": _dims(p.dilation, [1, 1])}


# ------------------------------------------------------------------------- convolutions
@importer("Convolution", "Deconvolution", emits=nf.FUNCTION_OPS)
def _conv(ctx: _Ctx, f: Any, p: Any) -> None:
    ins = ctx.inputs(f)
    attrs = _spatial(ctx, f, p, ins[0])
    attrs["group"] = int(p.group) or 1
    if f.type == "Deconvolution":
        attrs["output_padding"] = _dims(p.output_padding, [0, 0])
    ctx.emit(f, nf.FUNCTION_OPS[f.type], list(ins), attrs)


@importer("DepthwiseConvolution", emits=("Conv",))
def _depthwise(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    attrs = _spatial(ctx, f, p, x)
    w = ctx.array(f.input[1], f)
    _need(w.ndim == 3, ctx, f, f"weight must be (C*multiplier, KH, KW), got {w.shape}")
    weight = ctx.const(f.input[1], f, w.reshape(w.shape[0], 1, *w.shape[1:]), "oihw")
    bias = ctx.value(f.input[2], f) if len(f.input) > 2 else None
    attrs["group"] = int(x.type.shape[1])
    ctx.emit(f, "Conv", [x, weight, bias], attrs)


def _affine_tail(ctx: _Ctx, f: Any, p: Any, x: Value, weight: np.ndarray) -> tuple[Value, np.ndarray, tuple[int, ...]]:
    """x flattened at base_axis, weight as (K, M) and nnabla's output dims after the batch axes."""
    base = int(p.base_axis) or 1
    _need(base == 1, ctx, f, f"base_axis {base} is not supported (only 1)")
    k = int(weight.shape[0])
    if x.type.rank != 2:
        x = ctx.helper(f, "Flatten", [x], {"axis": 1}, "flatten")
    _need(x.type.shape[1] == k, ctx, f, f"input features {x.type.shape[1]} != weight rows {k}")
    return x, weight.reshape(k, -1), tuple(int(d) for d in weight.shape[1:])


def _dense(ctx: _Ctx, f: Any, x: Value, w: Value, out_dims: tuple[int, ...], bias: Value | None,
           scale: Value | None = None) -> None:
    """Dense (x per-output scale) (+ bias) (reshaped to multi-dim outputs); the last step is f's output."""
    steps: list[tuple[str, list[Value], dict[str, Any]]] = [
        ("Dense", [w] if bias is None or scale is not None else [w, bias], {})]
    if scale is not None:
        steps.append(("Mul", [scale], {}))
        if bias is not None:
            steps.append(("Add", [bias], {}))
    if len(out_dims) > 1:
        steps.append(("Reshape", [], {"shape": [0, *out_dims]}))
    y = x
    for i, (op, extra, attrs) in enumerate(steps):
        if i == len(steps) - 1:
            ctx.emit(f, op, [y, *extra], attrs)
        else:
            y = ctx.helper(f, op, [y, *extra], attrs, op.lower())


@importer("Affine", emits=("Flatten", "Dense", "Reshape"))
def _affine(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    _need(ctx.is_param(f.input[1]), ctx, f, "the weight must be a parameter")
    w_arr = ctx.array(f.input[1], f)
    x, w2, out_dims = _affine_tail(ctx, f, p, x, w_arr)
    w = ctx.const(f.input[1], f, w2, "km") if w2.shape != w_arr.shape else ctx.const(f.input[1], f)
    bias = ctx.const(f.input[2], f, ctx.array(f.input[2], f).reshape(-1), "m") if len(f.input) > 2 else None
    _dense(ctx, f, x, w, out_dims, bias)


def _binarize(ctx: _Ctx, f: Any, p: Any) -> tuple[np.ndarray, Value]:
    """nnabla recomputes the binary weight from the float one on every forward; so does qcc."""
    w = ctx.array(f.input[1], f)
    zero_to = float(p.quantize_zero_to)
    wb = np.where(w > 0, 1.0, np.where(w < 0, -1.0, zero_to)).astype(np.float32)
    return w, _binary_const(ctx, f, wb, zero_to)


def _binary_const(ctx: _Ctx, f: Any, wb: np.ndarray, zero_to: float) -> Value:
    if f.type.endswith("Affine"):
        wb = wb.reshape(wb.shape[0], -1)
    value = ctx.const(f.input[2], f, wb, "binary")
    if zero_to == 1.0:
        value.quant = Sign()
    return value


@importer("BinaryConnectAffine", "BinaryWeightAffine", emits=("Flatten", "Dense", "Mul", "Add", "Reshape"))
def _binary_affine(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    w, wb = _binarize(ctx, f, p)
    x, _, out_dims = _affine_tail(ctx, f, p, x, w)
    scale = None
    rest = list(f.input[3:])
    if f.type == "BinaryWeightAffine":
        alpha = np.abs(w.reshape(w.shape[0], -1)).mean(axis=0)
        scale = ctx.const(f.input[3], f, alpha, "alpha")
        rest = rest[1:]
    bias = ctx.const(rest[0], f, ctx.array(rest[0], f).reshape(-1), "m") if rest else None
    _dense(ctx, f, x, wb, out_dims, bias, scale)


@importer("BinaryConnectConvolution", "BinaryWeightConvolution", emits=("Conv", "Mul", "Add"))
def _binary_conv(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    attrs = _spatial(ctx, f, p, x)
    attrs["group"] = int(p.group) or 1
    w, wb = _binarize(ctx, f, p)
    if f.type == "BinaryConnectConvolution":
        bias = ctx.value(f.input[3], f) if len(f.input) > 3 else None
        ctx.emit(f, "Conv", [x, wb, bias], attrs)
        return
    out_c = w.shape[0]
    alpha = np.abs(w.reshape(out_c, -1)).mean(axis=1).reshape(1, out_c, 1, 1)
    y = ctx.helper(f, "Conv", [x, wb, None], attrs, "conv")
    scale = ctx.const(f.input[3], f, alpha, "alpha")
    if len(f.input) > 4:
        y = ctx.helper(f, "Mul", [y, scale], {}, "alpha")
        ctx.emit(f, "Add", [y, ctx.const(f.input[4], f, ctx.array(f.input[4], f).reshape(1, out_c, 1, 1), "bias4d")])
    else:
        ctx.emit(f, "Mul", [y, scale])


# ------------------------------------------------------------------------- normalization, pooling
@importer("BatchNormalization", emits=nf.FUNCTION_OPS)
def _bn(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    _need(list(p.axes) in ([1], []), ctx, f, f"axes {list(p.axes)} (only the channel axis 1 is supported)")
    names = list(f.input[1:])
    if len(names) == 4:
        beta, gamma, mean, var = names
    else:
        beta = None if p.no_bias else names.pop(0)
        gamma = None if p.no_scale else names.pop(0)
        _need(len(names) == 2, ctx, f, f"unexpected inputs {list(f.input)}")
        mean, var = names
    channels = int(x.type.shape[1])
    if p.batch_stat:
        ctx.notes.append(f"{f.name}: batch_stat is true in the file; qcc uses the running mean/variance")

    def param(name: str | None, fill: float, role: str) -> Value:
        if name is None:
            return ctx.internal_const(f"{f.name}/{role}", np.full(channels, fill, np.float32))
        _need(ctx.is_param(name), ctx, f, f"{role} {name!r} must be a parameter")
        return ctx.const(name, f, ctx.array(name, f).reshape(-1), "c")

    ctx.emit(f, "BatchNorm", [x, param(gamma, 1.0, "gamma"), param(beta, 0.0, "beta"), param(mean, 0.0, "mean"),
                              param(var, 1.0, "var")], {"epsilon": float(p.eps)})


@importer("MaxPooling", "AveragePooling", "SumPooling", emits=nf.FUNCTION_OPS)
def _pool(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    kernel = _dims(p.kernel, [])
    _need(x.type.rank == 4 and len(kernel) == 2, ctx, f, f"only 2-D pooling of NCHW inputs (kernel {kernel})")
    _need(not p.channel_last, ctx, f, "channel_last is not supported")
    op = nf.FUNCTION_OPS[f.type]
    attrs: dict[str, Any] = {"kernel": kernel, "strides": _dims(p.stride, kernel)}
    if op == "AvgPool":
        attrs["count_include_pad"] = bool(p.including_pad)
    hw = (int(x.type.shape[2]), int(x.type.shape[3]))
    geometry = pool_geometry(op, attrs, hw, bool(p.ignore_border), _dims(p.pad, [0, 0]))
    _need(geometry is not None, ctx, f, "ignore_border=false with including_pad windows past the padding")
    assert geometry is not None
    ctx.emit(f, op, [x], {**attrs, **geometry})


# ------------------------------------------------------------------------- elementwise
def _direct(ctx: _Ctx, f: Any, p: Any) -> None:
    """A function that is an attribute-free IR op (qcc.formats.nnabla_functions.DIRECT)."""
    direct = nf.DIRECT_BY_FUNCTION[f.type]
    args = {field.name: getattr(p, field.name) for field in p.DESCRIPTOR.fields} if p is not None else {}
    problem = nf.direct_mismatch(direct, args)
    _need(problem is None, ctx, f, str(problem))
    ctx.emit(f, direct.op, ctx.inputs(f))  # type: ignore[arg-type]


for _direct_function in nf.DIRECT_BY_FUNCTION:
    importer(_direct_function, emits=nf.FUNCTION_OPS)(_direct)

_UNARY_ATTRS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "LeakyReLU": lambda p: {"alpha": float(p.alpha)},
    "ELU": lambda p: {"alpha": float(p.alpha)},
    "HardSigmoid": lambda p: {"alpha": 0.2, "beta": 0.5},
    "GELU": lambda p: {"approximate": "tanh"},
}
_CLIPS = {"ReLU6": {"min": 0.0, "max": 6.0}, "HardTanh": {"min": -1.0, "max": 1.0}}


@importer(*_UNARY_ATTRS, emits=nf.FUNCTION_OPS)
def _unary_attr(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, nf.FUNCTION_OPS[f.type], ctx.inputs(f), _UNARY_ATTRS[f.type](p))  # type: ignore[arg-type]


@importer(*_CLIPS, emits=("Clip",))
def _clip(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, "Clip", ctx.inputs(f), _CLIPS[f.type])  # type: ignore[arg-type]


@importer("Add2", "Sub2", "Mul2", "Div2", "Pow2", "Maximum2", "Minimum2", emits=nf.FUNCTION_OPS)
def _binary(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, nf.FUNCTION_OPS[f.type], ctx.inputs(f))  # type: ignore[arg-type]


@importer(*nf.SCALARS, emits={fn: op for fn, (op, _) in nf.SCALARS.items()})
def _scalar(ctx: _Ctx, f: Any, p: Any) -> None:
    op, reverse = nf.SCALARS[f.type]
    x = ctx.value(f.input[0], f)
    c = ctx.internal_const(f"{f.name}/val", np.array(p.val, np.float32))
    ctx.emit(f, op, [c, x] if reverse else [x, c])


@importer("Softmax", emits=nf.FUNCTION_OPS)
def _softmax(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, "Softmax", ctx.inputs(f), {"axis": int(p.axis)})  # type: ignore[arg-type]


@importer("Dropout", emits=nf.FUNCTION_OPS)
def _dropout(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, "Dropout", ctx.inputs(f)[:1], {"ratio": float(p.p)})  # type: ignore[arg-type]


@importer("ImageAugmentation", emits=("Identity",))
def _image_aug(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    shape = [int(d) for d in p.shape.dim]
    _need(not shape or shape[-3:] == [int(d) for d in x.type.shape[-3:]], ctx, f,
          f"cropping to shape {shape} is not supported (inference treats ImageAugmentation as identity)")
    node = ctx.emit(f, "Identity", [x])
    node.meta["nnp.function"] = f.SerializeToString()


# ------------------------------------------------------------------------- tensor ops
@importer("Concatenate", emits=nf.FUNCTION_OPS)
def _concat(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, nf.FUNCTION_OPS[f.type], ctx.inputs(f), {"axis": int(p.axis)})  # type: ignore[arg-type]


@importer("Split", emits=("Split", "Squeeze"))
def _split(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    axis = int(p.axis) % x.type.rank
    count = x.type.shape[axis]
    _need(isinstance(count, int) and count == len(f.output), ctx, f, f"{len(f.output)} outputs along axis {axis}")
    node = ctx.graph.add_node("Split", [x], {"axis": axis, "split": [1] * len(f.output)}, name=f"{f.name}/split")
    node.meta[INTERNAL] = True
    for i, part in enumerate(node.outputs):
        part.meta[INTERNAL] = True
        ctx.emit(f, "Squeeze", [part], {"axes": [axis]}, out=i)


@importer("Stack", emits=("Unsqueeze", "Concat"))
def _stack(ctx: _Ctx, f: Any, p: Any) -> None:
    axis = int(p.axis)
    parts: list[Value | None] = [ctx.helper(f, "Unsqueeze", [v], {"axes": [axis]}, f"unsqueeze{i}")
                                 for i, v in enumerate(ctx.inputs(f))]
    ctx.emit(f, "Concat", parts, {"axis": axis})


@importer("Reshape", emits=nf.FUNCTION_OPS)
def _reshape(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    target = [int(d) for d in p.shape.dim]
    out_decl = [int(d) for d in ctx.declared[f.output[0]].shape.dim] if f.output[0] in ctx.declared else []
    in_decl = [int(d) for d in ctx.declared[f.input[0]].shape.dim] if f.input[0] in ctx.declared else []
    if target and out_decl[:1] == [-1] and in_decl[:1] == [-1]:
        target[0] = 0  # the batch: copied from the input, whatever it is bound to
    ctx.emit(f, "Reshape", [x], {"shape": target})


@importer("Transpose", emits=nf.FUNCTION_OPS)
def _transpose(ctx: _Ctx, f: Any, p: Any) -> None:
    ctx.emit(f, "Transpose", ctx.inputs(f), {"perm": [int(a) for a in p.axes]})  # type: ignore[arg-type]


@importer("Mean", "Sum", "Max", emits=nf.FUNCTION_OPS)
def _reduce(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    _need(not getattr(p, "with_index", False) and not getattr(p, "only_index", False), ctx, f,
          "with_index/only_index are not supported")
    axes = [int(a) for a in p.axes] or list(range(x.type.rank))
    op = nf.FUNCTION_OPS[f.type]
    ctx.emit(f, op, [x], {"axes": axes, "keepdims": bool(p.keep_dims)})


@importer("Pad", emits=nf.FUNCTION_OPS)
def _pad(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    width = [int(w) for w in p.pad_width]
    mode = {"constant": "constant", "reflect": "reflect", "repeat": "edge"}.get(p.mode or "constant")
    _need(mode is not None and len(width) % 2 == 0 and len(width) // 2 <= x.type.rank, ctx, f,
          f"mode {p.mode!r} / pad_width {width}")
    lead = x.type.rank - len(width) // 2
    begins = [0] * lead + width[0::2]
    ends = [0] * lead + width[1::2]
    ctx.emit(f, "Pad", [x], {"pads": begins + ends, "mode": mode, "value": float(p.constant_value)})


@importer("Slice", emits=nf.FUNCTION_OPS)
def _slice(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    start, stop, step = ([int(v) for v in p.start], [int(v) for v in p.stop], [int(v) for v in p.step])
    rank = x.type.rank
    _need(len(start) == len(stop) == len(step) and len(start) <= rank, ctx, f, "start/stop/step lengths")
    lead = rank - len(start)
    axes = list(range(lead, rank))
    keep = [i for i, axis in enumerate(axes)
            if not (start[i] == 0 and step[i] == 1 and (x.type.shape[axis] == stop[i] or
                                                         (axis == 0 and not isinstance(x.type.shape[0], int))))]
    ctx.emit(f, "Slice", [x], {"starts": [start[i] for i in keep], "ends": [stop[i] for i in keep],
                               "axes": [axes[i] for i in keep], "steps": [step[i] for i in keep]})


# ------------------------------------------------------------------------- quantization
def _affine_levels(ctx: _Ctx, f: Any, arrays: list[np.ndarray], eps: float) -> QuantType | None:
    """MinMaxQuantize's static range as an Affine annotation (nnabla's zero-point nudge), if it is one."""
    qr_min, qr_max, ql_min, ql_max = arrays
    if np.ptp(ql_min) != 0 or np.ptp(ql_max) != 0 or qr_min.shape != qr_max.shape:
        return None
    levels = (round(float(ql_min.reshape(-1)[0])), round(float(ql_max.reshape(-1)[0])))
    dtype = AFFINE_LEVELS.get(levels)
    if dtype is None:
        return None
    lo = qr_min.astype(np.float64).reshape(-1)
    hi = np.maximum(qr_max.astype(np.float64).reshape(-1), lo + eps)
    scale = (hi - lo) / (levels[1] - levels[0])
    zp_f = levels[0] - lo / scale
    zp = np.clip(np.sign(zp_f) * np.floor(np.abs(zp_f) + 0.5), *levels).astype(np.int64)
    axis = None
    if qr_min.size > 1:
        big = [i for i, d in enumerate(qr_min.shape) if d != 1]
        if len(big) != 1:
            return None
        axis = big[0]
    return Affine(tuple(float(s) for s in scale), tuple(int(z) for z in zp), dtype, axis)


def _fixed_levels(p: Any) -> QuantType | None:
    n, delta = int(p.n), float(p.delta)
    frac = -math.log2(delta) if delta > 0 else math.nan
    if p.sign and n in (4, 8, 16, 32) and frac == int(frac):
        return FixedPoint(n, int(frac))
    dtype = {(True, 8): "int8", (True, 16): "int16", (False, 8): "uint8", (False, 16): "uint16"}.get((bool(p.sign), n))
    if dtype is None or delta <= 0:
        return None
    return Affine((delta,), (0,), dtype)


@importer("MinMaxQuantize", "FixedPointQuantize", "Pow2Quantize", emits=("Quantize",))
def _quantize(ctx: _Ctx, f: Any, p: Any) -> None:
    x = ctx.value(f.input[0], f)
    saved = {name: ctx.array(name, f) for name in f.input[1:]}
    quant: QuantType | None = None
    if f.type == "MinMaxQuantize":
        if not p.x_min_max:
            quant = _affine_levels(ctx, f, [saved[n] for n in f.input[1:5]], float(p.eps))
    elif f.type == "FixedPointQuantize":
        quant = _fixed_levels(p)
    node = ctx.emit(f, "Quantize", [x], {"label": f.type})
    node.outputs[0].quant = quant
    node.meta["nnp.quant"] = quant
    node.meta["nnp.function"] = f.SerializeToString()
    node.meta["nnp.params"] = saved
    if quant is None:
        ctx.notes.append(f"{f.name}: {f.type} kept as a Quantize without a static annotation "
                         "(dynamic range or no qcc equivalent); qcc simulates it as identity")


# ------------------------------------------------------------------------- network selection
def _pick(contents: NnpContents, source: str, network: str | None, executor: str | None) -> tuple[Any, Any]:
    proto = contents.proto
    nets = {n.name: n for n in proto.network}
    exes = {e.name: e for e in proto.executor}
    listing = f"networks: {', '.join(repr(n) for n in nets) or 'none'}; executors: {', '.join(repr(e) for e in exes) or 'none'}"
    if executor is not None:
        if executor not in exes:
            raise UsageError(f"{source}: no executor {executor!r} ({listing})")
        exe = exes[executor]
        if network is not None and network != exe.network_name:
            raise UsageError(f"{source}: executor {executor!r} runs network {exe.network_name!r}, not {network!r}")
        if exe.network_name not in nets:
            raise InvalidInputError(f"{source}: executor {executor!r} names a missing network {exe.network_name!r}")
        return nets[exe.network_name], exe
    if network is not None:
        if network not in nets:
            raise UsageError(f"{source}: no network {network!r} ({listing})")
        runs = [e for e in proto.executor if e.network_name == network]
        runs.sort(key=lambda e: e.name.lower() != "runtime")
        return nets[network], (runs[0] if runs else None)
    for exe in sorted(proto.executor, key=lambda e: e.name.lower() != "runtime"):
        if exe.network_name in nets:
            return nets[exe.network_name], exe
    return proto.network[0], None


def _io(ctx: _Ctx, network: Any, exe: Any) -> tuple[list[str], list[str]]:
    if exe is not None:
        for gen in exe.generator_variable:
            if gen.type != "Constant":
                raise UnsupportedError(f"{ctx.source}: executor {exe.name!r} generates {gen.variable_name!r} "
                                       f"with {gen.type!r}; only Constant generators are supported")
        return [d.variable_name for d in exe.data_variable], [o.variable_name for o in exe.output_variable]
    produced = {o for f in network.function for o in f.output}
    consumed = {i for f in network.function for i in f.input}
    buffers = [v.name for v in network.variable if v.type == "Buffer"]
    return ([n for n in buffers if n not in produced and n in consumed],
            [n for n in buffers if n in produced and n not in consumed])


def _check_supported(ctx: _Ctx, network: Any) -> None:
    if len(network.repeat_info):
        raise UnsupportedError(f"{ctx.source}: network {network.name!r} uses repeat/recurrent blocks")
    missing: dict[str, list[str]] = {}
    for f in network.function:
        if f.type not in IMPORTERS:
            missing.setdefault(f.type, []).append(f.name)
    if missing:
        listed = "; ".join(f"{t} ({', '.join(repr(n) for n in names[:3])}{'...' if len(names) > 3 else ''})"
                           for t, names in sorted(missing.items()))
        raise UnsupportedError(f"{ctx.source}: unsupported nnabla function(s): {listed}. "
                               f"Supported: {', '.join(supported_functions())}")


def _ordered(ctx: _Ctx, network: Any, inputs: list[str]) -> list[Any]:
    """The functions in an executable order (files normally are; a DAG sort otherwise)."""
    ready = set(inputs) | {v.name for v in network.variable if v.type == "Parameter"} | set(ctx.params)
    pending = list(network.function)
    order: list[Any] = []
    while pending:
        index = next((i for i, f in enumerate(pending) if all(n in ready for n in f.input)), None)
        if index is None:
            f = pending[0]
            raise InvalidInputError(f"{ctx.where(f)}: inputs {[n for n in f.input if n not in ready]} are never "
                                    "computed (or the network has a cycle)")
        f = pending.pop(index)
        ready.update(f.output)
        order.append(f)
    return order


def _check_shapes(ctx: _Ctx) -> None:
    for name, value in ctx.values.items():
        if name not in ctx.declared:
            continue
        want = ctx.dims(name)
        got = value.type.shape
        if len(want) != len(got) or any(isinstance(w, int) and isinstance(g, int) and w != g for w, g in zip(want, got)):
            producer = value.producer()
            by = f"function {producer.name!r}" if producer is not None else "the input"
            raise UnsupportedError(f"{ctx.source}: {by} gives variable {name!r} shape {got}, the file declares "
                                   f"{want}; qcc does not reproduce this function's semantics")


def _check_declared(ctx: _Ctx, network: Any) -> None:
    """Declared shapes are checked against the limits before anything is built from them."""
    for var in network.variable:
        dims = [int(d) for d in var.shape.dim]
        if any(d < -1 for d in dims):
            raise InvalidInputError(f"{ctx.source}: variable {var.name!r} declares shape {dims}")
        count = int(np.prod([1 if d == -1 else d for d in dims], dtype=np.float64))
        limits.check_elements(count, f"variable {var.name!r}", ctx.source)


def _import_function(ctx: _Ctx, f: Any) -> None:
    carried = f.WhichOneof("parameter")
    expected = param_field(f.type)
    if carried is not None and carried != expected:
        raise InvalidInputError(f"{ctx.where(f)}: carries {carried}, not the arguments of {f.type}")
    before = len(ctx.graph.nodes)
    try:
        IMPORTERS[f.type](ctx, f, function_args(f))
    except QccError:
        raise
    except MALFORMED_ERRORS as exc:
        raise InvalidInputError(f"{ctx.where(f)}: malformed function: {type(exc).__name__}: {str(exc)[:300]}") from None
    check_emitted(EMITS, f.type, (n.op for n in ctx.graph.nodes[before:]), ctx.where(f))


def supported_functions() -> list[str]:
    return sorted(IMPORTERS)


def import_contents(contents: NnpContents, source: str = "<nnp>", network: str | None = None,
                    executor: str | None = None, batch_size: int | None = None) -> Model:
    """Build the IR of the chosen network (see module doc)."""
    net, exe = _pick(contents, source, network, executor)
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")
    batch: Dim = batch_size if batch_size is not None else "N"
    graph = Graph(name=net.name or Path(source).stem)
    ctx = _Ctx(graph, net, contents, source, batch)
    _check_supported(ctx, net)
    if not contents.params and any(v.type == "Parameter" for v in net.variable):
        raise InvalidInputError(f"{source}: network {net.name!r} has parameters but the file holds none "
                                f"(no parameter .h5/.protobuf among {contents.members})")
    _check_declared(ctx, net)
    input_names, output_names = _io(ctx, net, exe)
    for name in input_names:
        if name not in ctx.declared:
            raise InvalidInputError(f"{source}: input variable {name!r} is not declared in network {net.name!r}")
        ctx.values[name] = graph.add_input(name, TensorType("float32", ctx.dims(name)))
    if exe is not None:
        for gen in exe.generator_variable:
            const = graph.add_constant(gen.variable_name, np.full(
                [d if isinstance(d, int) else 1 for d in ctx.dims(gen.variable_name)], gen.multiplier, np.float32))
            ctx.values[gen.variable_name] = const
    for f in _ordered(ctx, net, input_names):
        _import_function(ctx, f)
    for name in output_names:
        if name not in ctx.values:
            raise InvalidInputError(f"{source}: output variable {name!r} is never computed in network {net.name!r}")
        graph.outputs.append(ctx.values[name])
    _check_shapes(ctx)
    for value in graph.values():
        limits.check_elements(value.type.numel(), f"variable {value.name!r}", source)
    graph.cleanup()
    fuse_gated_activations(graph)
    used = {id(v) for n in graph.nodes for v in n.inputs if v is not None} | {id(v) for v in graph.outputs}
    dropped = [v.name for v in graph.inputs if id(v) not in used]
    graph.inputs = [v for v in graph.inputs if id(v) in used]
    if dropped:
        ctx.notes.append(f"inputs {dropped} do not reach the outputs and were dropped")
    model = Model(graph, metadata={
        "source": source, "source_format": "nnp", "nnp.network": net.name,
        "nnp.executor": exe.name if exe is not None else None, "nnp.batch_size": int(net.batch_size or 1),
        "nnp.variables": [v.name for v in net.variable], "nnp.functions": [f.name for f in net.function],
        "nnp.notes": ctx.notes})
    model.products.put(NnpSource(contents, net.name, exe.name if exe is not None else None))
    problems = verify_model(model)
    if problems:
        raise InvalidInputError(f"{source}: imported graph is invalid: " + "; ".join(problems[:10]))
    return model


def load_nnp(path: str | os.PathLike[str], network: str | None = None, executor: str | None = None,
             batch_size: int | None = None, **_: Any) -> Model:
    """Import one network of an .nnp/.nntxt file (default: the 'runtime' executor's, else the first)."""
    source = str(path)
    return import_contents(read_nnp(path), source, network, executor, batch_size)


class NnpFrontend:
    name = "nnp"
    extensions = (".nnp", ".nntxt")
    load_options = ("network", "executor", "batch_size")

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: every IR op an nnabla function imports as."""
        return {"nnp import": {op: "yes" for op in emitted_ops(EMITS) | FUSED_OPS}}

    def load(self, path: str | os.PathLike[str], **options: Any) -> Model:
        return load_nnp(path, **options)


FRONTEND = NnpFrontend()

importlib.import_module("qcc.frontends.nnp_layers")  # it adds its importers to IMPORTERS
