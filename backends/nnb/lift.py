"""A decoded .nnb file back to qcc's IR, so qcc's simulator can run what a file says.

`lift_nnb(read_nnb(data, path))` is the emulation of a file without nnabla-c-runtime: every
function becomes the IR op with the same arithmetic in `qcc.sim.fixed` (fixed-point kernels
where the runtime has them, float32 then the runtime's setter elsewhere), every parameter a
constant holding the stored numbers with their type as annotation. Tests compare it with the
simulation of the model the file was written from: equal integers mean the file's layout,
weights, positions and arguments all say what the model says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from qcc.errors import UnsupportedError
from qcc.formats import nnabla_functions as nf
from qcc.ir.core import Graph, Model, Value
from qcc.ir.types import FixedPoint, QuantType, Sign, TensorType
from qcc.ir.verify import verify_model
from qcc.tables import registrar

from .format import DataType, Function, NnbFile, Variable, decode_values
from .functions import FunctionSpec, default_table

Lift = Callable[["_Lifter", Function, dict[str, Any]], None]
LIFTS: dict[str, Lift] = {}


lifts = registrar(LIFTS)


def annotation(var: Variable, rounding: str = "half_even") -> QuantType | None:
    """The variable's type; a computed value (or an input) is stored by the runtime's truncation."""
    if var.dtype == DataType.INT16:
        return FixedPoint(16, var.fp_pos, rounding)
    if var.dtype == DataType.INT8:
        return FixedPoint(8, var.fp_pos, rounding)
    if var.dtype == DataType.SIGN:
        return Sign()
    return None


class _Lifter:
    def __init__(self, nnb: NnbFile) -> None:
        self.nnb = nnb
        self.graph = Graph(name="nnb")
        self.values: dict[int, Value] = {}
        self.kind = ""  # the nnabla function being lifted

    def value(self, index: int) -> Value:
        if index not in self.values:
            var = self.nnb.variables[index]
            if var.data is None:
                raise UnsupportedError(f"variable {index} is read before any function writes it")
            numbers = decode_values(var.data, var.dtype, var.size).astype(np.float64)
            if var.dtype in (DataType.INT16, DataType.INT8):
                numbers = np.ldexp(numbers, -var.fp_pos)
            const = self.graph.add_constant(f"v{index}", numbers.astype(np.float32).reshape(var.shape))
            const.quant = annotation(var)
            self.values[index] = const
        return self.values[index]

    def const(self, name: str, array: np.ndarray) -> Value:
        return self.graph.add_constant(self.graph.unique_name(name), np.asarray(array, dtype=np.float32))

    def reshaped(self, index: int, shape: tuple[int, ...]) -> Value:
        """A parameter in another layout (same stored numbers and annotation)."""
        source = self.value(index)
        assert source.const is not None
        value = self.const(f"v{index}/{'x'.join(map(str, shape))}", source.const.reshape(shape))
        value.quant = source.quant
        return value

    def node(self, fn: Function, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
             out: int | None = None) -> Value:
        """A node writing `fn`'s output (or an intermediate when out is None: same annotation)."""
        index = fn.outputs[0]
        var = self.nnb.variables[index]
        names = [f"v{index}"] if out is not None else None
        node = self.graph.add_node(op, inputs, attrs, name=f"f{len(self.graph.nodes)}", output_names=names)
        result = node.outputs[0]
        result.quant = annotation(var, "trunc")
        if out is not None:
            if tuple(1 if d == "N" else d for d in result.type.shape) != var.shape:
                raise UnsupportedError(f"{op} computes shape {result.type.shape}, the file declares {var.shape}")
            self.values[index] = result
        return result


def lift_nnb(nnb: NnbFile, batch: bool = True) -> Model:
    """The IR of a decoded file (see module doc); UnsupportedError for functions qcc does not model.

    batch: a leading dimension of 1 on the inputs becomes the symbol 'N', so one run emulates
    many samples (the runtime itself runs one at a time).
    """
    table = default_table()
    lifter = _Lifter(nnb)
    for index in nnb.inputs:
        var = nnb.variables[index]
        shape: tuple[int | str, ...] = var.shape
        if batch and var.shape[:1] == (1,):
            shape = ("N", *var.shape[1:])
        value = lifter.graph.add_input(f"v{index}", TensorType("float32", shape))
        value.quant = annotation(var, "trunc")
        lifter.values[index] = value
    for n, fn in enumerate(nnb.functions):
        spec = table.by_id(fn.type_id, nnb.api_level)
        assert spec is not None  # read_nnb checked every id
        lift = LIFTS.get(spec.name)
        lifter.kind = spec.name
        if lift is None:
            raise UnsupportedError(f"function {n} ({spec.name}) has no qcc equivalent to emulate it")
        lift(lifter, fn, _named(spec, fn))
    lifter.graph.outputs = [lifter.value(i) for i in nnb.outputs]
    model = Model(lifter.graph, metadata={"source_format": "nnb"})
    problems = verify_model(model)
    if problems:
        raise UnsupportedError("lifted .nnb graph is invalid: " + "; ".join(problems[:5]))
    return model


def _named(spec: FunctionSpec, fn: Function) -> dict[str, Any]:
    return {arg.name or f"#{i}": value for i, (arg, value) in enumerate(zip(spec.args, fn.args))}


def _ins(lf: _Lifter, fn: Function) -> list[Value]:
    return [lf.value(i) for i in fn.inputs]


def _simple(op: str, **fixed: Any) -> Lift:
    def lift(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
        attrs = {key: (args[src] if isinstance(src, str) else src) for key, src in fixed.items()}
        lf.node(fn, op, list(_ins(lf, fn)), attrs, out=0)

    return lift


def _direct(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    direct = nf.DIRECT_BY_FUNCTION[lf.kind]
    problem = nf.direct_mismatch(direct, args)
    if problem is not None:
        raise UnsupportedError(f"{lf.kind}: {problem}")
    lf.node(fn, direct.op, list(_ins(lf, fn)), out=0)


for _name in nf.DIRECT_BY_FUNCTION:
    LIFTS[_name] = _direct
for _name in ("Add2", "Sub2", "Mul2", "Div2", "Pow2", "Maximum2", "Minimum2", "BatchMatmul"):
    LIFTS[_name] = _simple(nf.FUNCTION_OPS[_name])
LIFTS["LeakyReLU"] = _simple(nf.FUNCTION_OPS["LeakyReLU"], alpha="alpha")
LIFTS["ELU"] = _simple(nf.FUNCTION_OPS["ELU"], alpha="alpha")
LIFTS["Softmax"] = _simple(nf.FUNCTION_OPS["Softmax"], axis="axis")
LIFTS["Concatenate"] = _simple(nf.FUNCTION_OPS["Concatenate"], axis="axis")
LIFTS["Transpose"] = _simple(nf.FUNCTION_OPS["Transpose"], perm="axes")


@lifts("Reshape")
def _reshape(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    x = lf.value(fn.inputs[0])
    shape = list(args["shape"])
    if shape[:1] == [1] and x.type.shape[:1] == ("N",):
        shape[0] = 0  # the batch, copied
    lf.node(fn, "Reshape", [x], {"shape": shape}, out=0)


@lifts(*nf.SCALARS)
def _scalar(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    """The scalar as an unannotated float32 constant, as qcc's frontends import it."""
    op, reverse = nf.SCALARS[lf.kind]
    x = lf.value(fn.inputs[0])
    c = lf.const("val", np.full((1,) * x.type.rank, np.float32(args["val"])))
    lf.node(fn, op, [c, x] if reverse else [x, c], out=0)


def _conv_attrs(args: dict[str, Any], group: int) -> dict[str, Any]:
    if args.get("base_axis", 1) != 1 or args.get("channel_last", 0):
        raise UnsupportedError("only base_axis 1, channels-first convolutions are emulated")
    pad = list(args["pad"])
    if len(pad) != 2:
        raise UnsupportedError(f"only 2-D convolutions are emulated (pad {pad})")
    return {"strides": list(args["stride"]), "pads": pad + pad, "dilations": list(args["dilation"]), "group": group}


@lifts("Convolution")
def _conv(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    ins = _ins(lf, fn)
    lf.node(fn, "Conv", list(ins), _conv_attrs(args, int(args["group"])), out=0)


@lifts("BinaryConnectConvolution")
def _binary_connect(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    """Input 1 (the float weight) is never read; input 2 holds the signs."""
    ins = [lf.value(i) for i in (fn.inputs[0], *fn.inputs[2:])]
    lf.node(fn, "Conv", ins, _conv_attrs(args, int(args["group"])), out=0)


@lifts("DepthwiseConvolution")
def _depthwise(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    x = lf.value(fn.inputs[0])
    w = lf.nnb.variables[fn.inputs[1]]
    weight = lf.reshaped(fn.inputs[1], (w.shape[0], 1, *w.shape[1:]))
    bias = lf.value(fn.inputs[2]) if len(fn.inputs) > 2 else None
    lf.node(fn, "Conv", [x, weight, bias], _conv_attrs(args, int(x.type.shape[1])), out=0)


@lifts("Deconvolution")
def _deconv(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    attrs = _conv_attrs(args, int(args["group"]))
    attrs["output_padding"] = list(args.get("output_padding", (0, 0))) or [0, 0]
    lf.node(fn, "ConvTranspose", list(_ins(lf, fn)), attrs, out=0)


@lifts("Affine")
def _affine(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    if args.get("base_axis", 1) != 1:
        raise UnsupportedError("only base_axis 1 Affine is emulated")
    x = lf.value(fn.inputs[0])
    w = lf.nnb.variables[fn.inputs[1]]
    k = w.shape[0]
    m = w.size // k
    if x.type.rank != 2:
        flat = lf.graph.add_node("Flatten", [x], {"axis": 1}, name=lf.graph.unique_name("flatten", node=True))
        flat.outputs[0].quant = x.quant
        x = flat.outputs[0]
    source = lf.value(fn.inputs[1])
    assert source.const is not None
    weight = lf.const(f"v{fn.inputs[1]}/km", np.ascontiguousarray(source.const.reshape(m, k).T))
    weight.quant = source.quant
    bias = None
    if len(fn.inputs) > 2:
        b = lf.value(fn.inputs[2])
        assert b.const is not None
        bias = lf.const(f"v{fn.inputs[2]}/m", b.const.reshape(-1))
        bias.quant = b.quant
    if lf.nnb.variables[fn.outputs[0]].shape[1:] != (m,):
        raise UnsupportedError("only Affine outputs of shape (batch, out) are emulated")
    lf.node(fn, "Dense", [x, weight, bias], out=0)


@lifts("BatchNormalization")
def _batchnorm(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    if tuple(args["axes"]) != (1,) or args["batch_stat"] or args["no_scale"] or args["no_bias"]:
        raise UnsupportedError("only inference BatchNormalization over axis 1 with scale and bias is emulated")
    x, beta, gamma, mean, var = (lf.value(i) for i in fn.inputs)
    flat = []
    for v in (gamma, beta, mean, var):
        assert v.const is not None
        c = lf.const(f"{v.name}/c", v.const.reshape(-1))
        c.quant = v.quant
        flat.append(c)
    lf.node(fn, "BatchNorm", [x, *flat], {"epsilon": float(args["eps"])}, out=0)


def _pool_attrs(lf: _Lifter, fn: Function, args: dict[str, Any]) -> dict[str, Any]:
    """The IR pool of an nnabla pooling (qcc.formats.nnp's rule, as the .nnp frontend reads it)."""
    from qcc.formats.nnp import pool_geometry

    if args.get("channel_last", 0) or len(args["kernel"]) != 2:
        raise UnsupportedError("only 2-D channels-first pooling is emulated")
    attrs = {"kernel": list(args["kernel"]), "strides": list(args["stride"]),
             "count_include_pad": bool(args.get("including_pad", False))}
    shape = lf.nnb.variables[fn.inputs[0]].shape
    geometry = pool_geometry(nf.FUNCTION_OPS[lf.kind], attrs, (int(shape[-2]), int(shape[-1])),
                             bool(args["ignore_border"]), list(args["pad"]))
    if geometry is None:
        raise UnsupportedError(f"{lf.kind} with ignore_border=False and including_pad windows past the padding "
                               "is not emulated")
    return {**attrs, **geometry}


@lifts("MaxPooling", "SumPooling")
def _pool(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    op = nf.FUNCTION_OPS[lf.kind]
    attrs = _pool_attrs(lf, fn, args)
    del attrs["count_include_pad"]
    lf.node(fn, op, _ins(lf, fn), attrs, out=0)


@lifts("AveragePooling")
def _avgpool(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    lf.node(fn, "AvgPool", _ins(lf, fn), _pool_attrs(lf, fn, args), out=0)


@lifts("Slice")
def _slice(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    x = lf.value(fn.inputs[0])
    rank = x.type.rank
    start, stop, step = (list(args[k]) for k in ("start", "stop", "step"))
    lead = rank - len(start)
    dims = lf.nnb.variables[fn.inputs[0]].shape
    keep = [i for i in range(len(start)) if (start[i], stop[i], step[i]) != (0, dims[lead + i], 1)]
    attrs = {"starts": [start[i] for i in keep], "ends": [stop[i] for i in keep],
             "axes": [lead + i for i in keep], "steps": [step[i] for i in keep]}
    lf.node(fn, "Slice", [x], attrs, out=0)


@lifts("Pad")
def _pad(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    x = lf.value(fn.inputs[0])
    width = list(args["pad_width"])
    lead = x.type.rank - len(width) // 2
    pads = [0] * lead + width[0::2] + [0] * lead + width[1::2]
    mode = ("constant", "reflect", "edge")[int(args["mode"])]
    lf.node(fn, "Pad", [x], {"pads": pads, "mode": mode, "value": float(args["constant_value"])}, out=0)


@lifts("Sum")
def _sum(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    lf.node(fn, "ReduceSum", _ins(lf, fn), {"axes": list(args["axes"]), "keepdims": bool(args["keep_dims"])}, out=0)


@lifts("PReLU")
def _prelu(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    x = lf.value(fn.inputs[0])
    count = int(np.prod(lf.nnb.variables[fn.inputs[1]].shape))
    axis = int(args["base_axis"])
    shape = (1,) if count == 1 else (count,) + (1,) * (x.type.rank - axis - 1)
    lf.node(fn, "PRelu", [x, lf.reshaped(fn.inputs[1], shape)], out=0)


@lifts("Unpooling")
def _unpooling(lf: _Lifter, fn: Function, args: dict[str, Any]) -> None:
    """Each element repeated k times along the trailing axes: nearest Resize, index i // k."""
    x = lf.value(fn.inputs[0])
    kernel = [int(k) for k in args["kernel"]]
    lead = x.type.rank - len(kernel)
    sizes = [d if isinstance(d, int) else 0 for d in x.type.shape[:lead]] + [
        int(d) * k for d, k in zip(x.type.shape[lead:], kernel)]
    lf.node(fn, "Resize", [x], {"sizes": sizes, "scales": [1.0] * lead + [float(k) for k in kernel],
                                "mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                "nearest_mode": "floor"}, out=0)
