"""IR -> nnabla functions that nnabla-c-runtime implements (a `Program`).

One handler per IR op. Anything without a handler, or a handler's case the runtime cannot run,
is an UnsupportedError naming the op and the node, raised before any file is written.

Types follow the annotations (`program.storage_of`). Where a runtime kernel needs one type for
all its operands (Convolution, DepthwiseConvolution: x, W, b and y) and the annotations mix
types, the function runs in float and qcc inserts lossless conversions (Identity: fixed ->
float, and float -> the output's type through the runtime's setter), so the file computes what
the annotations say instead of reading garbage. `legalize.py` avoids most of these by making
qcc-chosen parameter types match before lowering.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence

import numpy as np

from qcc.errors import InternalError, UnsupportedError
from qcc.formats import nnabla_functions as nf
from qcc.ir.core import Model, Node, Value
from qcc.ir.ops._common import norm_axis
from qcc.ir.types import Float32, QuantType
from qcc.tables import registrar

from .format import ArgValue, DataType
from .functions import RUNTIME_IMPLEMENTED
from .program import FLOAT, NFunc, NVar, Program, Storage, encode_param, storage_of

Handler = Callable[["Lowerer", Node], None]
LOWERINGS: dict[str, Handler] = {}
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


lowering = registrar(LOWERINGS)


def supported_ops() -> list[str]:
    return sorted(LOWERINGS)


class Lowerer:
    """State of one lowering: IR values -> variables, in file order."""

    def __init__(self, model: Model, batch: int = 1) -> None:
        self.model = model
        self.graph = model.graph
        self.batch = batch
        self.program = Program()
        self.values: dict[int, NVar] = {}
        self.params: dict[tuple[int, str, Storage], NVar] = {}
        self.graph_outputs = {id(v) for v in self.graph.outputs}
        self.graph_inputs = {id(v) for v in self.graph.inputs}
        self._names: set[str] = set()

    # ------------------------------------------------------------------ variables
    def shape(self, value: Value) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else self.batch for d in value.type.shape)

    def new_var(self, name: str, shape: Sequence[int], storage: Storage, source: Value | None = None,
                array: np.ndarray | None = None, quant: QuantType | None = None) -> NVar:
        """A variable; with `array` a parameter holding it as `quant` reads back in `storage`."""
        base, n = name, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        data = None
        if array is not None:
            array = np.ascontiguousarray(array, dtype=np.float32)
            data = encode_param(array, quant, storage)
        var = NVar(name, tuple(int(d) for d in shape), storage, source, data, array)
        self.program.variables.append(var)
        return var

    def var(self, value: Value, node: Node | None = None) -> NVar:
        """The variable holding `value` (parameters in their plain layout)."""
        if value.is_const:
            return self.param(value)
        var = self.values.get(id(value))
        if var is None:
            where = f"node {node.name!r} ({node.op})" if node is not None else "the graph"
            raise InternalError(f"{where}: input {value.name!r} is used before it is computed")
        return var

    def define(self, value: Value, shape: Sequence[int] | None = None) -> NVar:
        """A new activation variable for a node output."""
        var = self.new_var(value.name, self.shape(value) if shape is None else shape,
                           storage_of(value), value)
        self.values[id(value)] = var
        return var

    def alias(self, value: Value, var: NVar) -> None:
        """`value` is stored in `var` (a view or a no-op kept out of the file)."""
        self.values[id(value)] = var

    def param(self, value: Value, form: str = "", shape: Sequence[int] | None = None,
              transform: Callable[[np.ndarray], np.ndarray] | None = None,
              storage: Storage | None = None) -> NVar:
        """A parameter variable; `form` names a layout, `storage` another type or position
        (one variable per value, form and storage)."""
        own = storage_of(value)
        storage = storage or own
        key = (id(value), form, storage)
        if key not in self.params:
            assert value.const is not None
            array = value.const if transform is None else transform(value.const)
            declared = array.shape if shape is None else tuple(shape)
            name = value.name if not form else f"{value.name}/{form}"
            if storage != own:
                name = f"{name}/{storage}"
            self.params[key] = self.new_var(name, declared, storage, value, array, value.quant)
        return self.params[key]

    def temp(self, like: NVar | Value, storage: Storage, suffix: str, shape: Sequence[int] | None = None) -> NVar:
        """An activation qcc adds (a conversion or an intermediate result)."""
        if shape is None:
            shape = self.shape(like) if isinstance(like, Value) else like.shape
        return self.new_var(f"{like.name}/{suffix}", shape, storage)

    # ------------------------------------------------------------------ functions
    def emit(self, node: Node | None, kind: str, inputs: Sequence[NVar], outputs: Sequence[NVar],
             **args: ArgValue) -> NFunc:
        name = node.name if node is not None else f"{outputs[0].name}/{kind}"
        impl = int(node.meta.get("nnb.implement", 0)) if node is not None else 0
        fn = NFunc(name, kind, list(inputs), list(outputs), dict(args), node, impl)
        self.program.functions.append(fn)
        return fn

    def convert(self, var: NVar, storage: Storage, suffix: str = "float") -> NVar:
        """`var` as `storage` through an Identity (callers only ask for lossless conversions)."""
        if var.storage == storage:
            return var
        out = self.temp(var, storage, suffix)
        self.emit(None, "Identity", [var], [out])
        return out

    def output(self, node: Node, storage: Storage) -> tuple[NVar, NVar]:
        """(variable the function writes, variable holding the node output): a float temp then
        an Identity into the output when the function computes in another type."""
        value = node.outputs[0]
        final = self.define(value)
        if final.storage == storage:
            return final, final
        return self.temp(value, storage, "float"), final

    def finish(self, node: Node, written: NVar, final: NVar) -> None:
        if written is not final:
            self.emit(None, "Identity", [written], [final])


def unsupported(node: Node, why: str) -> UnsupportedError:
    return UnsupportedError(f"node {node.name!r} ({node.op}): {why} (target nnb)")


def lower_model(model: Model, batch: int = 1) -> Program:
    """The program for `model`; UnsupportedError naming the first op the runtime cannot run."""
    missing = sorted({f"{n.op} ({n.name!r})" for n in model.graph.nodes if n.op not in LOWERINGS})
    if missing:
        raise UnsupportedError(
            f"target nnb cannot express {', '.join(missing[:10])}; nnabla-c-runtime functions "
            f"cover the IR ops {', '.join(supported_ops())}"
        )
    lw = Lowerer(model, batch)
    graph = model.graph
    for value in graph.inputs:
        for d in value.type.shape:
            if isinstance(d, str) and d != "N":
                raise UnsupportedError(f"graph input {value.name!r}: symbolic dimension {d!r}; .nnb needs static "
                                       "shapes (bind it with --batch-size or re-export the model)")
        lw.program.inputs.append(lw.define(value))
    elided = _elidable_views(model)
    for node in graph.nodes:
        if id(node) in elided:
            lw.alias(node.outputs[0], lw.var(node.input(0), node))
            continue
        LOWERINGS[node.op](lw, node)
    for value in graph.outputs:
        var = lw.var(value)
        if var.is_param or var in lw.program.inputs or var in lw.program.outputs:
            copy = lw.new_var(f"{value.name}/out", var.shape, var.storage, value)
            lw.emit(None, "Identity", [var], [copy])
            var = copy
        lw.program.outputs.append(var)
    _drop_unused(lw.program)
    return lw.program


def _elidable_views(model: Model) -> set[int]:
    """Flatten/Reshape nodes that only feed Dense x with the batch axis kept: nnabla's Affine
    flattens from base_axis 1 itself, so the view costs neither a function nor a buffer."""
    outputs = {id(v) for v in model.graph.outputs}
    out: set[int] = set()
    for node in model.graph.nodes:
        if node.op not in VIEW_OPS:
            continue
        x, y = node.input(0), node.outputs[0]
        uses = y.uses()
        if (id(y) in outputs or not uses or x.is_const or y.type.rank != 2 or x.type.rank < 2
                or x.type.shape[0] != y.type.shape[0] or storage_of(x) != storage_of(y)):
            continue
        if all(user.op == "Dense" and index == 0 for user, index in uses):
            out.add(id(node))
    return out


def _drop_unused(program: Program) -> None:
    """Parameters no function reads (e.g. a plain-layout copy never used) leave the file."""
    used = {id(v) for fn in program.functions for v in (*fn.inputs, *fn.outputs)}
    used |= {id(v) for v in (*program.inputs, *program.outputs)}
    program.variables = [v for v in program.variables if id(v) in used]


# ------------------------------------------------------------------------------ helpers


def _scalar(value: Value | None) -> float | None:
    if value is not None and value.is_const and value.const is not None and value.const.size == 1:
        return float(value.const.reshape(-1)[0])
    return None


def _pairs(node: Node, pads: Sequence[int]) -> tuple[int, int]:
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise unsupported(node, f"asymmetric padding {list(pads)} (nnabla pads both sides equally)")
    return int(pads[0]), int(pads[1])


def _unary(kind: str, **args: ArgValue) -> Handler:
    def lower(lw: Lowerer, node: Node) -> None:
        lw.emit(node, kind, [lw.var(node.input(0), node)], [lw.define(node.outputs[0])], **args)

    return lower


LOWERINGS["Neg"] = _unary("MulScalar", val=-1.0, inplace=False)
LOWERINGS["Reciprocal"] = _unary("RDivScalar", val=1.0)
LOWERINGS["Sqrt"] = _unary("PowScalar", val=0.5, inplace=False)


@lowering("LeakyRelu")
def _leaky(lw: Lowerer, node: Node) -> None:
    lw.emit(node, "LeakyReLU", [lw.var(node.input(0), node)], [lw.define(node.outputs[0])],
            alpha=float(node.attrs["alpha"]), inplace=False)


@lowering("Elu")
def _elu(lw: Lowerer, node: Node) -> None:
    lw.emit(node, "ELU", [lw.var(node.input(0), node)], [lw.define(node.outputs[0])], alpha=float(node.attrs["alpha"]))


@lowering("Clip")
def _clip(lw: Lowerer, node: Node) -> None:
    lo, hi = node.attrs["min"], node.attrs["max"]
    x = lw.var(node.input(0), node)
    y = node.outputs[0]
    if lo is None and hi is None:
        _identity(lw, node)
        return
    if lo == 0.0 and hi is None:
        lw.emit(node, "ReLU", [x], [lw.define(y)], inplace=False)
        return
    steps = [("MaximumScalar", lo), ("MinimumScalar", hi)]
    steps = [(k, v) for k, v in steps if v is not None]
    out = lw.define(y)
    for i, (kind, val) in enumerate(steps):
        target = out if i == len(steps) - 1 else lw.temp(y, out.storage, "max")
        lw.emit(node if i == len(steps) - 1 else None, kind, [x], [target], val=float(val))
        x = target


@lowering("Identity", "Dropout", "Quantize")
def _identity(lw: Lowerer, node: Node) -> None:
    """No function when the output is stored like the input; else an Identity converts it
    through the runtime's setter (truncation toward zero, saturation)."""
    source, y = node.input(0), node.outputs[0]
    if source.is_const and id(y) not in lw.graph_outputs and source.quant in (None, Float32()):
        assert source.const is not None  # a constant fake-quantized: store it quantized
        lw.alias(y, lw.new_var(y.name, lw.shape(y), storage_of(y), y, source.const, y.quant))
        return
    x = lw.var(source, node)
    if storage_of(y) == x.storage and id(y) not in lw.graph_outputs:
        lw.alias(y, x)
    else:
        lw.emit(node, "Identity", [x], [lw.define(y)])


@lowering("Softmax")
def _softmax(lw: Lowerer, node: Node) -> None:
    x = node.input(0)
    axis = norm_axis(node.attrs["axis"], x.type.rank)
    lw.emit(node, "Softmax", [lw.var(x, node)], [lw.define(node.outputs[0])], axis=axis)


# ------------------------------------------------------------------------------ nn


def _layer_operands(node: Node) -> tuple[Value, Value, Value | None]:
    """x, a constant weight and an optional constant bias."""
    x, w = node.input(0), node.input(1)
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if not w.is_const or (b is not None and not b.is_const):
        raise unsupported(node, "weight and bias must be constants")
    return x, w, b


def _one_type(lw: Lowerer, node: Node, xv: NVar, w: Value, b: Value | None,
              weight: Callable[[Storage | None], NVar]) -> tuple[list[NVar], Storage] | None:
    """Operands for the runtime's fixed Affine/Convolution kernel, which reads x, W, b and y as
    one type: what qcc's simulator computes with its integer kernel (x, W and y fixed point).

    A narrower operand is widened exactly (an 8-bit activation through an Identity, an 8-bit
    weight stored as 16-bit integers); a bias is stored as the integers the simulator adds (in
    the output's type and position). None when the simulator does not use its integer kernel.
    """
    y = storage_of(node.outputs[0])
    sw = storage_of(w)
    if not (xv.storage.is_fixed and sw.is_fixed and y.is_fixed):
        return None
    for what, storage in (("input", xv.storage), ("weight", sw)):
        if storage.dtype != y.dtype and storage.dtype != DataType.INT8:
            raise unsupported(node, f"{what} {storage} is wider than the output {y}; nnabla-c-runtime's kernel "
                                    "uses one type for x, W, b and y and narrowing would change the result "
                                    "(assign-fixed-point under the nnb target gives them one width)")
    x = lw.convert(xv, Storage(y.dtype, xv.storage.fp_pos), "widened")
    ins = [x, weight(Storage(y.dtype, sw.fp_pos))]
    if b is not None:
        ins.append(lw.param(b, storage=y))
    return ins, y


@lowering("Conv")
def _conv(lw: Lowerer, node: Node) -> None:
    x, w, b = _layer_operands(node)
    strides, pads, dil, group = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"], node.attrs["group"]
    pad = _pairs(node, pads)
    cin, cout = int(x.type.shape[1]), int(w.type.shape[0])
    kh, kw = int(w.type.shape[2]), int(w.type.shape[3])
    depthwise = group > 1 and group == cin and int(w.type.shape[1]) == 1

    def weight(storage: Storage | None) -> NVar:
        if depthwise:
            return lw.param(w, "depthwise", (cout, kh, kw), storage=storage)
        return lw.param(w, storage=storage)

    xv = lw.var(x, node)
    args: dict[str, ArgValue] = {"base_axis": 1, "pad": pad, "stride": tuple(strides), "dilation": tuple(dil)}
    if _binary_conv(lw, node, xv, w, b, args):
        return
    fixed = _one_type(lw, node, xv, w, b, weight)
    if fixed is not None:
        ins, storage = fixed
    else:  # the simulator's generic kernel: float32 compute, one store
        storage = FLOAT
        operands = [xv, weight(None), *([lw.param(b)] if b is not None else [])]
        ins = [lw.convert(v, FLOAT) for v in operands]
        if any(a is not v for a, v in zip(ins, operands)) or storage_of(node.outputs[0]) != FLOAT:
            lw.program.notes.append(f"node {node.name!r}: convolution computed in float "
                                    "(its operands are not all fixed point)")
    written, final = lw.output(node, storage)
    if depthwise:
        lw.emit(node, "DepthwiseConvolution", ins, [written], **args, multiplier=cout // cin)
    else:
        lw.emit(node, "Convolution", ins, [written], **args, group=group, channel_last=False)
    lw.finish(node, written, final)


def _binary_conv(lw: Lowerer, node: Node, xv: NVar, w: Value, b: Value | None, args: dict[str, ArgValue]) -> bool:
    """A float convolution with SIGN weights: the runtime's BinaryConnectConvolution reads the
    signs through its getter (no float copy of the weights). Its unused float-weight input is
    the sign variable again; nnabla's converter stores a one-element stub there."""
    y = node.outputs[0]
    if storage_of(w).dtype != DataType.SIGN or xv.storage != FLOAT or storage_of(y) != FLOAT:
        return False
    if b is not None and storage_of(b) != FLOAT:
        return False
    signs = lw.param(w)
    ins = [xv, signs, signs, *([lw.param(b)] if b is not None else [])]
    lw.emit(node, "BinaryConnectConvolution", ins, [lw.define(y)], **args, group=node.attrs["group"],
            quantize_zero_to=1.0)
    return True


@lowering("ConvTranspose")
def _deconv(lw: Lowerer, node: Node) -> None:
    x, w, b = _layer_operands(node)
    if any(node.attrs["output_padding"]):
        raise unsupported(node, "output_padding is not supported by nnabla-c-runtime's Deconvolution")
    pad = _pairs(node, node.attrs["pads"])
    ins = [lw.var(x, node), lw.param(w), *([lw.param(b)] if b is not None else [])]
    lw.emit(node, "Deconvolution", ins, [lw.define(node.outputs[0])], base_axis=1, pad=pad,
            stride=tuple(node.attrs["strides"]), dilation=tuple(node.attrs["dilations"]),
            group=node.attrs["group"], channel_last=False, output_padding=(0, 0))


def _transposed(w: np.ndarray) -> np.ndarray:
    """Affine weights are stored (out, in) while their declared shape stays (in, out)."""
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


@lowering("Dense")
def _dense(lw: Lowerer, node: Node) -> None:
    x, w, b = _layer_operands(node)

    def weight(storage: Storage | None) -> NVar:
        return lw.param(w, "affine", lw.shape(w), _transposed, storage)

    xv = lw.var(x, node)
    fixed = _one_type(lw, node, xv, w, b, weight)
    # otherwise the runtime's generic Affine reads any mix of types, like the simulator
    ins = fixed[0] if fixed is not None else [xv, weight(None), *([lw.param(b)] if b is not None else [])]
    lw.emit(node, "Affine", ins, [lw.define(node.outputs[0])], base_axis=1)


@lowering("MatMul")
def _matmul(lw: Lowerer, node: Node) -> None:
    a, w = node.input(0), node.input(1)
    if w.is_const and w.type.rank == 2 and a.type.rank == 2 and not a.is_const:
        _dense(lw, node)
        return
    if a.type.rank == w.type.rank >= 3 and lw.shape(a)[:-2] == lw.shape(w)[:-2]:
        lw.emit(node, "BatchMatmul", [lw.var(a, node), lw.var(w, node)], [lw.define(node.outputs[0])],
                transpose_a=False, transpose_b=False)
        return
    raise unsupported(node, f"MatMul of shapes {a.type.shape} x {w.type.shape} (only x @ constant 2-D "
                            "matrix or BatchMatmul of equal batch axes)")


@lowering("BatchNorm")
def _batchnorm(lw: Lowerer, node: Node) -> None:
    x = node.input(0)
    scale, bias, mean, var = (node.input(i) for i in range(1, 5))
    if not all(v.is_const for v in (scale, bias, mean, var)):
        raise unsupported(node, "scale, bias, mean and variance must be constants")
    shape = (1, int(x.type.shape[1])) + (1,) * (x.type.rank - 2)
    params = [lw.param(v, "bn", shape, _reshaper(shape)) for v in (bias, scale, mean, var)]
    lw.emit(node, "BatchNormalization", [lw.var(x, node), *params], [lw.define(node.outputs[0])],
            axes=(1,), decay_rate=0.9, eps=float(node.attrs["epsilon"]), batch_stat=False,
            no_scale=False, no_bias=False)


def _pool_args(node: Node, lw: Lowerer) -> dict[str, ArgValue]:
    """nnabla's pooling arguments (qcc.formats.nnp's rule, shared with the .nnp writer); the
    runtime sizes the output itself (pooling.c), so its size must be the IR's."""
    from qcc.formats.nnp import nnabla_pool_size, nnabla_pooling

    kernel = [int(k) for k in node.attrs["kernel"]]
    strides = [int(s) for s in (node.attrs["strides"] or [1, 1])]
    x, y = node.input(0), node.outputs[0]
    hw = (int(x.type.shape[2]), int(x.type.shape[3]))
    found = nnabla_pooling(node.op, {**node.attrs, "strides": strides}, hw)
    if found is None:
        raise unsupported(node, f"pads {list(node.attrs['pads'])} with ceil_mode {bool(node.attrs['ceil_mode'])} "
                                "have no nnabla pooling (nnabla pads both sides equally, or runs windows past "
                                "the end with ignore_border=False)")
    ignore_border, pad = found
    for axis in range(2):
        w, k, s, p = hw[axis], kernel[axis], strides[axis], pad[axis]
        runtime = (w + p - (k - p if ignore_border else 1)) // s + 1  # pooling.c
        if runtime != y.type.shape[2 + axis] or runtime != nnabla_pool_size(w, k, s, p, ignore_border):
            raise InternalError(f"node {node.name!r} ({node.op}): output size {y.type.shape[2 + axis]} on axis "
                                f"{2 + axis} differs from nnabla-c-runtime's {runtime}")
    return {"kernel": tuple(kernel), "stride": tuple(strides), "ignore_border": ignore_border,
            "pad": tuple(pad), "channel_last": False}


@lowering("MaxPool", "SumPool")
def _pool(lw: Lowerer, node: Node) -> None:
    kind = "MaxPooling" if node.op == "MaxPool" else "SumPooling"
    lw.emit(node, kind, [lw.var(node.input(0), node)], [lw.define(node.outputs[0])], **_pool_args(node, lw))


@lowering("AvgPool")
def _avgpool(lw: Lowerer, node: Node) -> None:
    lw.emit(node, "AveragePooling", [lw.var(node.input(0), node)], [lw.define(node.outputs[0])],
            **_pool_args(node, lw), including_pad=bool(node.attrs["count_include_pad"]))


@lowering("GlobalAvgPool", "GlobalMaxPool")
def _global_pool(lw: Lowerer, node: Node) -> None:
    x = node.input(0)
    if x.type.rank != 4:
        raise unsupported(node, f"global pooling of rank {x.type.rank} (the runtime pools 2-D maps)")
    kernel = (int(x.type.shape[2]), int(x.type.shape[3]))
    args: dict[str, ArgValue] = {"kernel": kernel, "stride": kernel, "ignore_border": True, "pad": (0, 0),
                                 "channel_last": False}
    if node.op == "GlobalAvgPool":
        lw.emit(node, "AveragePooling", [lw.var(x, node)], [lw.define(node.outputs[0])], **args, including_pad=True)
    else:
        lw.emit(node, "MaxPooling", [lw.var(x, node)], [lw.define(node.outputs[0])], **args)


# ------------------------------------------------------------------------------ arithmetic

_BINARY = {op: nf.nnabla_function(op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")}
_INPLACE_ARG = {"AddScalar", "MulScalar", "PowScalar", "Add2", "Sub2", "Mul2", "Div2", "Pow2"}


def _scalar_function(node: Node, a: Value, b: Value) -> tuple[str, Value, float] | None:
    """(function, tensor operand, val) when a float32 scalar function computes the node exactly.

    Only in float: the runtime's fixed AddScalar/MulScalar quantize the scalar their own way,
    while qcc's simulator adds or multiplies the stored operands; there the node becomes the
    two-input function with a one-element parameter, which both compute alike."""
    if any(storage_of(v) != FLOAT for v in (a, b, node.outputs[0])):
        return None
    right, left = _scalar(b), _scalar(a)
    scalar = nf.scalar_function(node.op, scalar_left=False)  # float32 functions computing exactly `x op c`
    if right is not None and not a.is_const and scalar is not None:
        kind, negate = scalar
        return kind, a, -right if negate else right
    scalar = nf.scalar_function(node.op, scalar_left=True)
    if left is not None and not b.is_const and scalar is not None:
        return scalar[0], b, left
    return None


@lowering(*_BINARY)
def _binary(lw: Lowerer, node: Node) -> None:
    a, b = node.input(0), node.input(1)
    y = node.outputs[0]
    scalar = _scalar_function(node, a, b)
    if scalar is not None and np.isfinite(np.float32(scalar[2])):
        kind, x, val = scalar
        args: dict[str, ArgValue] = {"val": float(val)}
        if kind in _INPLACE_ARG:
            args["inplace"] = False
        lw.emit(node, kind, [lw.var(x, node)], [lw.define(y)], **args)
        return
    rank = y.type.rank
    ins = [_at_rank(lw, node, v, rank) for v in (a, b)]
    if node.op in ("Add", "Sub"):
        ins = _same_position(lw, node, ins)
    extra: dict[str, ArgValue] = {"inplace": False} if _BINARY[node.op] in _INPLACE_ARG else {}
    lw.emit(node, _BINARY[node.op], ins, [lw.define(y)], **extra)


def _same_position(lw: Lowerer, node: Node, ins: list[NVar]) -> list[NVar]:
    """The fixed Add2/Sub2 kernel rescales the finer input in its own buffer and keeps the new
    position; give it both inputs at the coarser position instead (the simulator truncates the
    finer one the same way). A position qcc chose is left for `legalize` to change instead."""
    y = storage_of(node.outputs[0])
    if not y.is_fixed or any(v.storage.dtype != y.dtype for v in ins):
        return ins
    common = min(v.storage.fp_pos for v in ins)
    out = []
    for v, value in zip(ins, node.inputs):
        target = Storage(y.dtype, common)
        if v.storage == target or (v.source is not None and not v.pinned):
            out.append(v)
        elif v.is_param and value is not None:
            form = f"rank{len(v.shape)}" if v.shape != lw.shape(value) else ""
            out.append(lw.param(value, form, v.shape, _reshaper(v.shape), target))
        else:
            out.append(lw.convert(v, target, f"fp{common}"))
            lw.program.notes.append(f"node {node.name!r}: {v.name!r} is pinned to {v.storage}; converted to "
                                    f"{target} for {node.op} (nnabla-c-runtime adds inputs at one position)")
    return out


def _reshaper(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda array: array.reshape(shape)


def _at_rank(lw: Lowerer, node: Node, value: Value, rank: int) -> NVar:
    """The runtime's binary functions need equal ranks: pad with leading 1s."""
    if value.type.rank == rank:
        return lw.var(value, node)
    shape = (1,) * (rank - value.type.rank) + lw.shape(value)
    if value.is_const:
        return lw.param(value, f"rank{rank}", shape, _reshaper(shape))
    source = lw.var(value, node)
    out = lw.temp(source, source.storage, f"rank{rank}", shape)
    lw.emit(None, "Reshape", [source], [out], shape=shape, inplace=False)
    return out


# ------------------------------------------------------------------------------ tensors


@lowering(*VIEW_OPS)
def _reshape(lw: Lowerer, node: Node) -> None:
    y = node.outputs[0]
    shape = lw.shape(y)
    lw.emit(node, "Reshape", [lw.var(node.input(0), node)], [lw.define(y)], shape=shape, inplace=False)


@lowering("Transpose")
def _transpose(lw: Lowerer, node: Node) -> None:
    lw.emit(node, "Transpose", [lw.var(node.input(0), node)], [lw.define(node.outputs[0])],
            axes=tuple(int(p) for p in node.attrs["perm"]))


@lowering("Concat")
def _concat(lw: Lowerer, node: Node) -> None:
    y = node.outputs[0]
    axis = norm_axis(node.attrs["axis"], y.type.rank)
    ins = [lw.var(v, node) for v in node.inputs if v is not None]
    lw.emit(node, "Concatenate", ins, [lw.define(y)], axis=axis)


def _slice_args(lw: Lowerer, node: Node, x: Value, slices: Sequence[slice]) -> dict[str, ArgValue]:
    start, stop, step = [], [], []
    for dim, s in zip(lw.shape(x), slices):
        first, last, stride = s.indices(dim)
        if stride < 1:
            raise unsupported(node, "negative slice steps (nnabla-c-runtime's Slice only steps forward)")
        start.append(first)
        stop.append(max(last, first))
        step.append(stride)
    return {"start": tuple(start), "stop": tuple(stop), "step": tuple(step)}


@lowering("Slice")
def _slice(lw: Lowerer, node: Node) -> None:
    x = node.input(0)
    slices = [slice(None)] * x.type.rank
    steps = node.attrs["steps"] or [1] * len(node.attrs["axes"])
    for first, last, axis, stride in zip(node.attrs["starts"], node.attrs["ends"], node.attrs["axes"], steps):
        slices[norm_axis(axis, x.type.rank)] = slice(first, last, stride)
    lw.emit(node, "Slice", [lw.var(x, node)], [lw.define(node.outputs[0])], **_slice_args(lw, node, x, slices))


@lowering("Split")
def _split(lw: Lowerer, node: Node) -> None:
    x = node.input(0)
    axis = norm_axis(node.attrs["axis"], x.type.rank)
    offset = 0
    for size, y in zip(node.attrs["split"], node.outputs):
        slices = [slice(None)] * x.type.rank
        slices[axis] = slice(offset, offset + size)
        offset += size
        fn = lw.emit(node, "Slice", [lw.var(x, node)], [lw.define(y)], **_slice_args(lw, node, x, slices))
        fn.name = y.name


@lowering("Pad")
def _pad(lw: Lowerer, node: Node) -> None:
    x = node.input(0)
    mode = {"constant": "constant", "reflect": "reflect"}.get(node.attrs["mode"])
    if mode is None:
        raise unsupported(node, f"pad mode {node.attrs['mode']!r} (the runtime pads 'constant' and 'reflect')")
    pads = node.attrs["pads"]
    rank = x.type.rank
    width = tuple(v for axis in range(rank) for v in (int(pads[axis]), int(pads[axis + rank])))
    if min(width) < 0:
        raise unsupported(node, "negative padding")
    lw.emit(node, "Pad", [lw.var(x, node)], [lw.define(node.outputs[0])], pad_width=width,
            mode=("constant", "reflect", "repeat").index(mode), constant_value=float(node.attrs["value"]))


@lowering("ReduceSum", "ReduceMean")
def _reduce(lw: Lowerer, node: Node) -> None:
    x, y = node.input(0), node.outputs[0]
    axes = tuple(sorted(norm_axis(a, x.type.rank) for a in node.attrs["axes"]))
    args: dict[str, ArgValue] = {"axes": axes, "keep_dims": bool(node.attrs["keepdims"])}
    if node.op == "ReduceSum":
        lw.emit(node, "Sum", [lw.var(x, node)], [lw.define(y)], **args)
        return
    count = math.prod(lw.shape(x)[a] for a in axes)
    total = lw.temp(y, FLOAT, "sum")
    lw.emit(None, "Sum", [lw.var(x, node)], [total], **args)
    lw.emit(node, "MulScalar", [total], [lw.define(y)], val=1.0 / count, inplace=False)


for _direct in nf.DIRECT:  # ops without a handler of their own: their function, if the runtime has it
    if _direct.op not in LOWERINGS and _direct.function in RUNTIME_IMPLEMENTED:
        LOWERINGS[_direct.op] = _unary(_direct.function, **_direct.args)

importlib.import_module("qcc.backends.nnb.lower_layers")  # it adds its lowerings to LOWERINGS
