"""ATen op converters: one function per op family, for both torch.export's own op set (conv2d,
batch_norm, linear, relu_...) and the core ATen set `run_decompositions` produces (convolution,
_native_batch_norm_legit_no_training, addmm...). Arguments arrive bound by schema name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from qcc.frontends.torch_fx import TorchCtx, converts
from qcc.ir.core import Value

INT_MAX = 2**62


def _keys(name: str, overloads: Sequence[str] = ("default",), inplace: bool = False) -> list[str]:
    names = [name, f"{name}_"] if inplace else [name]
    return [f"aten.{n}.{o}" for n in names for o in overloads]


def _pair(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value, value]
    items = [int(v) for v in value]
    return items * 2 if len(items) == 1 else items


def _axis(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


def _rank4(ctx: TorchCtx, value: Value) -> Value:
    if value.type.rank != 4:
        raise ctx.fail(f"only 2-D (NCHW) inputs are supported, got shape {value.type.shape}")
    return value


# ----------------------------------------------------------------------------- convolution
@converts(*_keys("conv2d", ("default", "padding")), "aten.convolution.default", "aten.conv_transpose2d.input",
          emits=("Conv", "ConvTranspose"))
def _conv(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = _rank4(ctx, ctx.value(a["input"]))
    w = ctx.value(a["weight"])
    bias = ctx.value(a["bias"]) if a.get("bias") is not None else None
    strides, dilations = _pair(a["stride"]), _pair(a["dilation"])
    transposed = bool(a.get("transposed", "output_padding" in a and "transposed" not in a))
    padding = a["padding"]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0, 0, 0, 0]
        else:  # 'same': torch puts the odd extra pixel at the end
            total = [d * (int(k) - 1) for d, k in zip(dilations, w.type.shape[2:])]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    else:
        ph, pw = _pair(padding)
        pads = [ph, pw, ph, pw]
    group = int(a["groups"])
    if transposed:
        return ctx.emit("ConvTranspose", x, w, bias, strides=strides, pads=pads, dilations=dilations, group=group,
                        output_padding=_pair(a["output_padding"]))
    return ctx.emit("Conv", x, w, bias, strides=strides, pads=pads, dilations=dilations, group=group)


@converts("aten.pad.default", "aten.reflection_pad2d.default", "aten.replication_pad2d.default", emits=("Pad",),
          keep_whole=True)
@converts("aten.constant_pad_nd.default", "aten.reflection_pad1d.default", "aten.replication_pad1d.default",
          emits=("Pad",))
def _pad(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    mode = a.get("mode") or ("reflect" if "reflection" in ctx.op else "replicate" if "replication" in ctx.op
                             else "constant")
    pad = [int(p) for p in (a["pad"] if a.get("pad") is not None else a["padding"])]
    if mode not in ("constant", "reflect", "replicate") or any(p < 0 for p in pad) or len(pad) % 2:
        raise ctx.fail(f"padding {pad} in mode {mode!r} is not supported (constant/reflect/replicate, no cropping)")
    rank = x.type.rank
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):  # torch lists the last dim first
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    value = float(a.get("value") or 0.0)
    return ctx.emit("Pad", x, pads=begins + ends, mode="edge" if mode == "replicate" else mode, value=value)


# ----------------------------------------------------------------------------- normalization
@converts("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
          "aten.native_batch_norm.default", "aten._native_batch_norm_legit.default", emits=("BatchNorm",))
def _batch_norm(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    if a.get("training", False) or a.get("running_mean") is None:
        raise ctx.fail("batch norm in training mode (export the module in eval mode)")
    x = ctx.value(a["input"])
    channels = x.type.shape[1]
    if not isinstance(channels, int):
        raise ctx.fail("batch norm over a symbolic channel dimension")
    ones, zeros = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    scale = ctx.value(a["weight"] if a["weight"] is not None else ones, "scale")
    bias = ctx.value(a["bias"] if a["bias"] is not None else zeros, "bias")
    y = ctx.emit("BatchNorm", x, scale, bias, ctx.value(a["running_mean"]), ctx.value(a["running_var"]),
                 epsilon=float(a["eps"]))
    return y if ctx.op == "aten.batch_norm.default" else (y, None, None)


# ----------------------------------------------------------------------------- dense layers
def dense(ctx: TorchCtx, x: Value, w: Value, bias: Value | None) -> Value:
    """x @ w + b with a (K, M) weight: Dense when w is a constant (reshaping rank != 2), else MatMul."""
    if not w.is_const or w.type.rank != 2:
        y = ctx.emit("MatMul", x, w, main=True)
        return ctx.emit("Add", y, bias, part="bias") if bias is not None else y
    k, m = (int(d) for d in w.type.shape)
    if bias is not None and (not bias.is_const or tuple(bias.type.shape) != (m,)):
        return ctx.emit("Add", dense(ctx, x, w, None), bias, part="bias")
    shape = ctx.shape(x)
    if len(shape) == 2:
        return ctx.emit("Dense", x, w, bias, main=True)
    flat = ctx.emit("Reshape", x, shape=[-1, k])
    y = ctx.emit("Dense", flat, w, bias, main=True)
    lead = [d if isinstance(d, int) else -1 for d in shape[:-1]]
    if lead.count(-1) > 1:
        raise ctx.fail(f"linear on an input with several symbolic dims {shape}")
    return ctx.emit("Reshape", y, shape=[*lead, m])


def _scaled(ctx: TorchCtx, arg: Any, factor: float, part: str) -> Value:
    if factor == 1.0:
        return ctx.value(arg, part)
    if isinstance(arg, Value):
        return ctx.emit("Mul", arg, ctx.value(factor, part), part=part)
    return ctx.constant(ctx.array(arg) * np.float32(factor), f"{ctx.const_name(arg) or ctx.site.name}_{part}")


@converts("aten.linear.default", emits=("Transpose", "Dense", "Reshape", "MatMul", "Add"), keep_whole=True)
def _linear(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x, w, b = ctx.value(a["input"]), a["weight"], a.get("bias")
    bias = ctx.value(b, "bias") if b is not None else None
    weight = ctx.weight_t(w) if ctx.is_const(w) else ctx.emit("Transpose", ctx.value(w), perm=[1, 0])
    return dense(ctx, x, weight, bias)


@converts("aten.addmm.default", emits=("Mul", "Dense", "Reshape", "MatMul", "Add"))
def _addmm(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["mat1"])
    alpha, beta = float(a.get("alpha", 1)), float(a.get("beta", 1))
    return dense(ctx, x, _scaled(ctx, a["mat2"], alpha, "alpha"), _scaled(ctx, a["self"], beta, "beta"))


@converts("aten.matmul.default", emits=("Dense", "Reshape", "MatMul"), keep_whole=True)
@converts("aten.mm.default", "aten.bmm.default", emits=("Dense", "Reshape", "MatMul"))
def _matmul(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x, w = ctx.value(a["self"]), a.get("mat2", a.get("other"))
    if ctx.is_const(w) and ctx.array(w).ndim == 2 and x.type.rank >= 2:
        return dense(ctx, x, ctx.value(w, "weight"), None)
    wv = ctx.value(w)
    if x.type.rank < 2 or wv.type.rank < 2:
        raise ctx.fail("matmul with a 1-D operand")
    return ctx.emit("MatMul", x, wv)


# ----------------------------------------------------------------------------- activations
_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "hardswish": "HardSwish", "silu": "Silu",
          "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "neg": "Neg", "abs": "Abs", "reciprocal": "Reciprocal",
          "erf": "Erf"}


_UNARY_KEYS = {key: op for name, op in _UNARY.items() for key in _keys(name, inplace=True)}
_WHOLE = ("aten.hardswish.default", "aten.silu.default")


@converts(*_WHOLE, emits=_UNARY_KEYS, keep_whole=True)
@converts(*(key for key in _UNARY_KEYS if key not in _WHOLE), emits=_UNARY_KEYS)
def _unary(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    name = ctx.op.split(".")[1].rstrip("_")
    return ctx.emit(_UNARY[name], ctx.value(a["self"]))


@converts("aten.softplus.default", emits=("Softplus",), keep_whole=True)
def _softplus(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    beta, threshold = float(a.get("beta", 1)), float(a.get("threshold", 20))
    if beta != 1.0 or threshold < 20.0:  # above 20 torch returns x, which is log(1 + exp(x)) in float32
        raise ctx.fail(f"softplus with beta={beta:g}, threshold={threshold:g} (qcc's Softplus: beta 1, threshold >= 20)")
    return ctx.emit("Softplus", ctx.value(a["self"]))


@converts(*_keys("rsqrt", inplace=True), emits=("Sqrt", "Reciprocal"))
def _rsqrt(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    root = ctx.emit("Sqrt", ctx.value(a["self"]), part="sqrt")
    return ctx.emit("Reciprocal", root)


@converts("aten.hardsigmoid.default", emits=("HardSigmoid",), keep_whole=True)
@converts("aten.hardsigmoid_.default", emits=("HardSigmoid",))
def _hardsigmoid(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    return ctx.emit("HardSigmoid", ctx.value(a["self"]), alpha=1.0 / 6.0, beta=0.5)


@converts(*_keys("gelu", inplace=True), emits=("Gelu",))
def _gelu(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    return ctx.emit("Gelu", ctx.value(a["self"]), approximate=str(a.get("approximate") or "none"))


@converts(*_keys("leaky_relu", inplace=True), emits=("LeakyRelu",))
def _leaky_relu(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    return ctx.emit("LeakyRelu", ctx.value(a["self"]), alpha=float(a["negative_slope"]))


@converts(*_keys("elu", inplace=True), emits=("Mul", "Elu"))
def _elu(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    """scale * elu(input_scale * x) (also what selu/celu decompose into)."""
    x = ctx.value(a["self"])
    scale, input_scale = float(a.get("scale", 1)), float(a.get("input_scale", 1))
    if input_scale != 1.0:
        x = ctx.emit("Mul", x, ctx.value(input_scale, "input_scale"), part="input_scale")
    y = ctx.emit("Elu", x, alpha=float(a["alpha"]), main=True)
    return ctx.emit("Mul", y, ctx.value(scale, "scale"), part="scale") if scale != 1.0 else y


@converts(*_keys("hardtanh", inplace=True), *_keys("relu6", inplace=True), *_keys("clamp", ("default",), True),
          *_keys("clamp_min", inplace=True), *_keys("clamp_max", inplace=True), emits=("Clip",))
def _clip(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    name = ctx.op.split(".")[1].rstrip("_")
    bounds = {"hardtanh": (a.get("min_val"), a.get("max_val")), "relu6": (0.0, 6.0),
              "clamp": (a.get("min"), a.get("max")), "clamp_min": (a.get("min"), None),
              "clamp_max": (None, a.get("max"))}[name]
    lo, hi = (None if b is None else float(ctx.array(b)) if ctx.is_const(b) else _bad(ctx, b) for b in bounds)
    return ctx.emit("Clip", ctx.value(a["self"]), min=lo, max=hi)


def _bad(ctx: TorchCtx, arg: Any) -> float:
    raise ctx.fail(f"needs constant bounds, got {type(arg).__name__}")


@converts("aten.softmax.int", "aten._softmax.default", emits=("Softmax",))
@converts("aten.log_softmax.int", "aten._log_softmax.default", emits=("LogSoftmax",))
def _softmax(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    op = "LogSoftmax" if "log_softmax" in ctx.op else "Softmax"
    return ctx.emit(op, x, axis=_axis(int(a["dim"]), x.type.rank))


# ----------------------------------------------------------------------------- pooling
def _pool_window(ctx: TorchCtx, a: dict[str, Any]) -> dict[str, Any]:
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"]) if a.get("stride") else kernel  # torch: an empty stride means the kernel
    ph, pw = _pair(a["padding"])
    if any(d != 1 for d in _pair(a.get("dilation", 1))):
        raise ctx.fail("dilated pooling is not supported")
    return {"kernel": kernel, "strides": stride, "pads": [ph, pw, ph, pw], "ceil_mode": bool(a["ceil_mode"])}


@converts("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default", emits=("MaxPool",))
def _max_pool(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    y = ctx.emit("MaxPool", _rank4(ctx, ctx.value(a["self"])), **_pool_window(ctx, a))
    return (y, None) if "with_indices" in ctx.op else y


@converts("aten.avg_pool2d.default", emits=("AvgPool",))
def _avg_pool(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    if a.get("divisor_override") is not None:
        raise ctx.fail("avg_pool2d with divisor_override is not supported")
    return ctx.emit("AvgPool", _rank4(ctx, ctx.value(a["self"])), count_include_pad=bool(a["count_include_pad"]),
                    **_pool_window(ctx, a))


@converts("aten.adaptive_avg_pool2d.default", emits=("GlobalAvgPool", "AvgPool"), keep_whole=True)
@converts("aten._adaptive_avg_pool2d.default", emits=("GlobalAvgPool", "AvgPool"))
@converts("aten.adaptive_max_pool2d.default", emits=("GlobalMaxPool", "MaxPool"))
def _adaptive_pool(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    x = _rank4(ctx, ctx.value(a["self"]))
    is_max = "max" in ctx.op
    size = x.type.shape[2:]
    wanted = a["output_size"]
    wanted = [wanted, wanted] if isinstance(wanted, int) else list(wanted) * (2 if len(wanted) == 1 else 1)
    out = [int(o) if o is not None else size[i] for i, o in enumerate(wanted)]
    if out == [1, 1]:
        y = ctx.emit("GlobalMaxPool" if is_max else "GlobalAvgPool", x)
    elif not all(isinstance(s, int) for s in size) or any(int(s) % int(o) for s, o in zip(size, out)):
        raise ctx.fail(f"adaptive pooling of {tuple(size)} to {tuple(out)}: only output 1 or an exact divisor "
                       f"of the input size is supported")
    elif out == list(size):
        y = x
    else:
        kernel = [int(s) // int(o) for s, o in zip(size, out)]
        attrs: dict[str, Any] = {"kernel": kernel, "strides": kernel}
        y = ctx.emit("MaxPool", x, **attrs) if is_max else ctx.emit("AvgPool", x, **attrs)
    return (y, None) if is_max else y


def _reduce_axes(value: Value, dims: Any) -> list[int]:
    rank = value.type.rank
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    items = [dims] if isinstance(dims, int) else list(dims)
    return sorted(_axis(int(d), rank) for d in items)


@converts("aten.mean.dim", "aten.mean.default", "aten.sum.dim_IntList", "aten.amax.default",
          emits={"aten.mean.dim": "ReduceMean", "aten.mean.default": "ReduceMean",
                 "aten.sum.dim_IntList": "ReduceSum", "aten.amax.default": "ReduceMax"})
def _reduce(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    if a.get("dtype") is not None:
        raise ctx.fail("reduction with a dtype cast")
    op = {"mean": "ReduceMean", "sum": "ReduceSum", "amax": "ReduceMax"}[ctx.op.split(".")[1]]
    return ctx.emit(op, x, axes=_reduce_axes(x, a.get("dim")), keepdims=bool(a.get("keepdim", False)))


# ----------------------------------------------------------------------------- arithmetic
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "rsub": "Sub", "maximum": "Max",
           "minimum": "Min", "pow": "Pow"}


@converts(*_keys("add", ("Tensor", "Scalar"), True), *_keys("sub", ("Tensor", "Scalar"), True),
          *_keys("mul", ("Tensor", "Scalar"), True), *_keys("div", ("Tensor", "Scalar", "Tensor_mode"), True),
          *_keys("rsub", ("Tensor", "Scalar")), "aten.maximum.default", "aten.minimum.default",
          *_keys("pow", ("Tensor_Scalar", "Tensor_Tensor"), True), emits=("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"))
def _binary(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    name = ctx.op.split(".")[1].rstrip("_")
    if a.get("rounding_mode") is not None:
        raise ctx.fail(f"division with rounding_mode={a['rounding_mode']!r}")
    lhs, rhs = a["self"], a.get("other", a.get("exponent"))
    if name == "rsub":  # other - alpha * self
        lhs, rhs = rhs, lhs
    alpha = a.get("alpha", 1)
    if alpha is not None and float(alpha) != 1.0:
        if isinstance(rhs, Value):
            rhs = ctx.emit("Mul", rhs, ctx.value(float(alpha), "alpha"), part="alpha")
        else:
            rhs = ctx.array(rhs) * np.float32(alpha)
    return ctx.emit(_BINARY[name], ctx.value(lhs, "lhs"), ctx.value(rhs, "rhs"))


# ----------------------------------------------------------------------------- data movement
@converts("aten.cat.default", "aten.concat.default", emits=("Concat",))
def _cat(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    values = [ctx.value(t) for t in a["tensors"]]
    values = [v for v in values if v.type.shape != (0,)] or values  # torch skips legacy empty tensors
    return ctx.emit("Concat", *values, axis=_axis(int(a["dim"]), values[0].type.rank))


@converts("aten.stack.default", emits=("Unsqueeze", "Concat"))
def _stack(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    values = [ctx.value(t) for t in a["tensors"]]
    axis = _axis(int(a["dim"]), values[0].type.rank + 1)
    parts = [ctx.emit("Unsqueeze", v, axes=[axis]) for v in values]
    return ctx.emit("Concat", *parts, axis=axis, main=True)


def reshape(ctx: TorchCtx, x: Value, target: Sequence[Any]) -> Value:
    """Reshape to torch sizes; a symbolic size becomes 0 (copied) at the same position, else -1."""
    shape = ctx.shape(x)
    dims: list[int] = []
    for i, d in enumerate(target):
        if isinstance(d, int):
            dims.append(int(d))
        elif i < len(shape) and shape[i] == d:
            dims.append(0)
        else:
            dims.append(-1)
    if dims.count(-1) > 1:
        raise ctx.fail(f"reshape of {shape} to {list(target)} (several unknown sizes)")
    if tuple(dims) == shape:
        return x
    return ctx.emit("Reshape", x, shape=dims)


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default",
          emits=("Reshape",))
def _view(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    return reshape(ctx, ctx.value(a["self"]), list(a.get("size", a.get("shape")) or []))


@converts("aten.flatten.using_ints", emits=("Reshape", "Flatten"))
def _flatten(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    rank = x.type.rank
    if rank == 0:
        return reshape(ctx, x, [1])
    start, end = _axis(int(a["start_dim"]), rank), _axis(int(a["end_dim"]), rank)
    if start >= end:
        return x
    if start == 1 and end == rank - 1:
        return ctx.emit("Flatten", x, axis=1)
    shape = ctx.shape(x)
    merged = math.prod(int(d) for d in shape[start:end + 1]) if all(
        isinstance(d, int) for d in shape[start:end + 1]) else "?"
    return reshape(ctx, x, [*shape[:start], merged, *shape[end + 1:]])


@converts("aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.numpy_T.default", emits=("Transpose",))
def _permute(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    rank = x.type.rank
    perm = list(range(rank))
    if "dims" in a:
        perm = [_axis(int(d), rank) for d in a["dims"]]
    elif "dim0" in a:
        d0, d1 = _axis(int(a["dim0"]), rank), _axis(int(a["dim1"]), rank)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = perm[::-1]
    return x if perm == list(range(rank)) else ctx.emit("Transpose", x, perm=perm)


@converts("aten.unsqueeze.default", emits=("Unsqueeze",))
def _unsqueeze(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    return ctx.emit("Unsqueeze", x, axes=[_axis(int(a["dim"]), x.type.rank + 1)])


@converts("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", emits=("Squeeze",))
def _squeeze(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    shape = ctx.shape(x)
    dims = a.get("dim")
    candidates = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = sorted({_axis(int(d), len(shape)) for d in candidates if shape[_axis(int(d), len(shape))] == 1})
    return ctx.emit("Squeeze", x, axes=axes) if axes else x


def _split_sizes(ctx: TorchCtx, x: Value, axis: int) -> int:
    size = x.type.shape[axis]
    if not isinstance(size, int):
        raise ctx.fail(f"split along the symbolic dimension {size!r}")
    return size


def split(ctx: TorchCtx, x: Value, axis: int, sizes: list[int], part: str | None = None) -> list[Value]:
    if len(sizes) == 1:
        return [x]
    return list(ctx.emit_node("Split", [x], {"axis": axis, "split": sizes}, part=part).outputs)


@converts("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int",
          "aten.tensor_split.sections", emits=("Split", "Squeeze"))
def _split(ctx: TorchCtx, a: dict[str, Any]) -> list[Value]:
    x = ctx.value(a["self"])
    axis = _axis(int(a.get("dim", 0)), x.type.rank)
    size = _split_sizes(ctx, x, axis)
    name = ctx.op.split(".")[1]
    if name == "split_with_sizes":
        sizes = [int(s) for s in a["split_sizes"]]
    elif name == "split":
        step = int(a["split_size"])
        sizes = [min(step, size - i) for i in range(0, size, step)]
    elif name == "unbind":
        parts = split(ctx, x, axis, [1] * size)
        return [ctx.emit("Squeeze", p, axes=[axis], part="unbind") for p in parts]
    else:  # chunk: ceil-sized pieces (maybe fewer than asked); tensor_split: sizes differ by one at most
        n = int(a["chunks"] if "chunks" in a else a["sections"])
        if name == "chunk":
            step = -(-size // n)
            sizes = [min(step, size - i) for i in range(0, size, step)]
        else:
            sizes = [size // n + (1 if i < size % n else 0) for i in range(n)]
    return split(ctx, x, axis, sizes)


def slice_axis(ctx: TorchCtx, x: Value, axis: int, start: int | None, end: int | None, step: int = 1) -> Value:
    size = x.type.shape[axis]
    lo = 0 if start is None else int(start)
    hi = INT_MAX if end is None else int(end)
    if isinstance(size, int):
        lo, hi, _ = slice(lo, hi, step).indices(size)
        if lo == 0 and hi == size and step == 1:
            return x
    elif lo == 0 and hi >= INT_MAX and step == 1:
        return x
    elif lo < 0 or hi < 0 or hi >= INT_MAX:
        raise ctx.fail(f"slice relative to the end of symbolic dimension {size!r}")
    return ctx.emit("Slice", x, starts=[lo], ends=[hi], axes=[axis], steps=[int(step)])


@converts("aten.slice.Tensor", "aten.narrow.default", emits=("Slice",))
def _slice(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    axis = _axis(int(a["dim"]), x.type.rank)
    if "length" in a:
        return slice_axis(ctx, x, axis, int(a["start"]), int(a["start"]) + int(a["length"]))
    if int(a["step"]) < 1:
        raise ctx.fail("slice with a non-positive step")
    return slice_axis(ctx, x, axis, a["start"], a["end"], int(a["step"]))


@converts("aten.select.int", emits=("Slice", "Squeeze"))
def _select(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    axis = _axis(int(a["dim"]), x.type.rank)
    size = _split_sizes(ctx, x, axis)
    index = int(a["index"]) % size
    part = ctx.emit("Slice", x, starts=[index], ends=[index + 1], axes=[axis], steps=[1])
    return ctx.emit("Squeeze", part, axes=[axis])


# ----------------------------------------------------------------------------- no-ops and constants
@converts(*_keys("clone"), *_keys("contiguous"), *_keys("alias"), *_keys("detach"), *_keys("lift_fresh_copy"),
          "aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.type_as.default",
          *_keys("dropout", inplace=True), *_keys("feature_dropout", inplace=True),
          *_keys("alpha_dropout", inplace=True), "aten.native_dropout.default", emits=())
def _passthrough(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    """Ops that do nothing at inference in float32: the input itself."""
    x = ctx.value(a.get("self", a.get("input")))
    if a.get("train"):
        raise ctx.fail("dropout in training mode (export the module in eval mode)")
    dtype = a.get("dtype")
    if dtype is not None and dtype not in (ctx.torch.float32, ctx.torch.float16, ctx.torch.bfloat16,
                                           ctx.torch.float64):
        raise ctx.fail(f"cast to {dtype}")
    return (x, None) if ctx.op == "aten.native_dropout.default" else x


@converts("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default", emits=())
def _like(ctx: TorchCtx, a: dict[str, Any]) -> Value:
    x = ctx.value(a["self"])
    fill = {"zeros_like": 0.0, "ones_like": 1.0}.get(ctx.op.split(".")[1])
    value = float(fill if fill is not None else a["fill_value"])
    return ctx.value(np.full(ctx.static_shape(x), value, np.float32), "fill")


@converts("aten.sym_size.int", emits=())
def _sym_size(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    x = ctx.value(a["self"])
    return x.type.shape[_axis(int(a["dim"]), x.type.rank)]


@converts("operator.mul", "operator.add", "operator.sub", "operator.floordiv", emits=())
def _python_int(ctx: TorchCtx, a: dict[str, Any]) -> Any:
    """Size arithmetic; anything involving a symbolic dim stays unknown ('?')."""
    lhs, rhs = a["a0"], a["a1"]
    if not isinstance(lhs, int) or not isinstance(rhs, int):
        return "?"
    fn = {"mul": int.__mul__, "add": int.__add__, "sub": int.__sub__, "floordiv": int.__floordiv__}
    return fn[ctx.op.split(".")[1]](lhs, rhs)
