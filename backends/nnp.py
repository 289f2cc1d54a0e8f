"""Target `nnp`: the IR as an NNabla .nnp (network.nntxt + parameters) that NnpLoader runs.

IR value names become variable names and node names function names, so a model imported from
an .nnp comes back with its own names. Quantize nodes become nnabla's quantize functions so
nnabla runs the quantized model: FixedPoint -> FixedPointQuantize(sign, n, delta=2^-frac),
Affine -> MinMaxQuantize with the static range as its parameters, Sign -> Sign, no annotation ->
MinMaxQuantize with x_min_max (the dynamic range of the seed's PF.min_max_quantize), and a
Quantize imported from an .nnp and left as it was -> its original function.
"""

from __future__ import annotations

import importlib
import io
import os
import zipfile
from collections.abc import Callable
from typing import Any, Literal

import attrs
import numpy as np

from qcc.errors import UnsupportedError
from qcc.formats import nnabla_functions as nf
from qcc.formats.nnp_archive import param_field
from qcc.io import atomic_write_bytes
from qcc.ir.core import Model, Node, Value
from qcc.ir.types import Affine, FixedPoint, Float32, Sign
from qcc.runtimes.base import Runtime, Tolerance
from qcc.tables import registrar
from qcc.target import NNABLA_C_RUNTIME, Backend, Constraints, WriteResult, is_quantized

EXECUTOR = "Runtime"
NNABLA_QUANTIZE = Tolerance(20.0, 0.98, "nnabla's quantize functions compute in float32 and round their own "
                            "way: one step apart from qcc's simulation on a few elements")
AFFINE_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
                 "int4": (-8, 7), "uint4": (0, 15)}


class NnpWriter:
    """Accumulates one network's variables, functions and parameters."""

    def __init__(self, model: Model, batch_size: int | None = None) -> None:
        from nnabla.utils import nnabla_pb2

        self.model = model
        self.proto = nnabla_pb2.NNablaProtoBuf()
        self.net = self.proto.network.add()
        self.net.name = model.graph.name or "network"
        bound = model.metadata.get("nnp.batch_size", 1)
        self.batch = int(batch_size if batch_size is not None else bound)
        self.net.batch_size = self.batch
        self.params: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.skip: set[int] = set()
        self.rename: dict[int, str] = {}
        self._taken = {v.name for v in model.graph.values()}
        self._fn_names: set[str] = set()

    # ------------------------------------------------------------------ variables
    def fresh(self, base: str) -> str:
        return _unique(base, self._taken)

    def dims(self, value: Value) -> list[int]:
        out = []
        for i, d in enumerate(value.type.shape):
            if isinstance(d, int):
                out.append(d)
            elif i == 0:
                out.append(-1)
            else:
                raise UnsupportedError(f"nnp backend: tensor {value.name!r} has a symbolic non-batch dim {d!r}")
        return out

    def declare(self, name: str, shape: list[int], kind: str = "Buffer") -> str:
        if name not in self.shapes:
            var = self.net.variable.add()
            var.name, var.type = name, kind
            var.shape.dim.extend(shape)
            self.shapes[name] = tuple(shape)
        return name

    def buffer(self, value: Value) -> str:
        name = self.rename.get(id(value), value.name)
        return self.declare(name, self.dims(value))

    def param(self, name: str, array: np.ndarray) -> str:
        """A Parameter variable (a differently shaped second use of one constant gets its own name)."""
        array = np.ascontiguousarray(array, dtype=np.float32)
        if name in self.params and self.params[name].shape == array.shape:
            return name
        if name in self.params or name in self.shapes:
            name = self.fresh(name)
        self.params[name] = array
        return self.declare(name, list(array.shape), "Parameter")

    def operand(self, value: Value, rank: int | None = None) -> str:
        """Variable for an input: constants become parameters (broadcast-padded to `rank`)."""
        if value.const is not None:
            data = value.const
            if rank is not None and data.ndim < rank:
                data = data.reshape((1,) * (rank - data.ndim) + data.shape)
            return self.param(value.name, data)
        return self.buffer(value)

    def temp(self, base: str, shape: list[int]) -> str:
        return self.declare(self.fresh(base), shape)

    # ------------------------------------------------------------------ functions
    def function(self, ftype: str, inputs: list[str], outputs: list[str], name: str,
                 args: dict[str, Any] | None = None) -> Any:
        f = self.net.function.add()
        f.name = _unique(name, self._fn_names)
        f.type = ftype
        f.input.extend(inputs)
        f.output.extend(outputs)
        field = param_field(ftype)
        if field is not None:
            message = getattr(f, field)
            message.SetInParent()
            set_args(message, args or {})
        elif args:
            raise UnsupportedError(f"nnp backend: nnabla function {ftype} takes no arguments")
        return f

    def chain(self, node: Node, x: str, steps: list[tuple[str, dict[str, Any]]]) -> None:
        """Unary functions one after another; the last writes the node's output."""
        shape = self.dims(node.outputs[0])
        for i, (ftype, args) in enumerate(steps):
            last = i == len(steps) - 1
            out = self.buffer(node.outputs[0]) if last else self.temp(f"{node.name}/{ftype}_out", shape)
            self.function(ftype, [x], [out], node.name if last else f"{node.name}/{ftype}", args)
            x = out

    # ------------------------------------------------------------------ whole model
    def build(self) -> None:
        graph = self.model.graph
        unsupported = sorted({n.op for n in graph.nodes if n.op not in EMITTERS})
        if unsupported:
            raise UnsupportedError(f"nnp backend: no nnabla mapping for IR op(s) {', '.join(unsupported)}; "
                                   f"supported: {', '.join(sorted(EMITTERS))}")
        for value in graph.inputs:
            self.buffer(value)
        for node in graph.nodes:
            if id(node) not in self.skip:
                EMITTERS[node.op](self, node)
        exe = self.proto.executor.add()
        exe.name, exe.network_name = EXECUTOR, self.net.name
        for value in graph.inputs:
            dv = exe.data_variable.add()
            dv.variable_name = dv.data_name = self.buffer(value)
        for value in graph.outputs:
            if value.const is not None or value.producer() is None:
                raise UnsupportedError(f"nnp backend: graph output {value.name!r} is not computed by a function")
            ov = exe.output_variable.add()
            ov.variable_name = ov.data_name = self.buffer(value)
        for name in self.params:
            exe.parameter_variable.add().variable_name = name

    def to_bytes(self, parameter_format: str = ".protobuf") -> bytes:
        from google.protobuf import text_format
        from nnabla.utils.nnp_format import nnp_version

        body = io.BytesIO()
        with zipfile.ZipFile(body, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(_member("nnp_version.txt"), f"{nnp_version()}\n")
            archive.writestr(_member("network.nntxt"), text_format.MessageToString(self.proto))
            # random-looking floats do not deflate; storing them is 10x faster
            archive.writestr(_member(f"parameter{parameter_format}", zipfile.ZIP_STORED),
                             self._parameters(parameter_format))
        return body.getvalue()

    def _parameters(self, parameter_format: str) -> bytes:
        if parameter_format == ".h5":
            import h5py

            buf = io.BytesIO()
            with h5py.File(buf, "w") as handle:
                for index, (name, array) in enumerate(self.params.items()):
                    handle.create_dataset(name, data=array)
                    handle[name].attrs["need_grad"] = False
                    handle[name].attrs["index"] = index
            return buf.getvalue()
        if parameter_format != ".protobuf":
            raise UnsupportedError(f"nnp backend: parameter_format must be '.protobuf' or '.h5', not {parameter_format!r}")
        from nnabla.utils import nnabla_pb2

        holder = nnabla_pb2.NNablaProtoBuf()
        for name, array in self.params.items():
            p = holder.parameter.add()
            p.variable_name = name
            p.shape.dim.extend(array.shape)
            p.data.extend(array.reshape(-1).tolist())
            p.need_grad = False
        return bytes(holder.SerializeToString())


def _unique(base: str, taken: set[str]) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def set_args(message: Any, args: dict[str, Any]) -> None:
    """Fill an nnabla argument message from plain Python values (Shape fields take lists)."""
    for key, value in args.items():
        field = message.DESCRIPTOR.fields_by_name[key]
        if field.message_type is not None and field.message_type.name == "Shape":
            getattr(message, key).dim.extend(int(v) for v in value)
        elif field.label == field.LABEL_REPEATED:
            getattr(message, key).extend(value)
        else:
            setattr(message, key, value)


Emitter = Callable[[NnpWriter, Node], None]
EMITTERS: dict[str, Emitter] = {}


emitter = registrar(EMITTERS)


def _one(w: NnpWriter, node: Node, ftype: str, args: dict[str, Any] | None = None,
         inputs: list[str] | None = None) -> Any:
    ins = inputs if inputs is not None else [w.operand(v) for v in node.inputs if v is not None]
    return w.function(ftype, ins, [w.buffer(v) for v in node.outputs], node.name, args)


def _symmetric(node: Node, pads: list[int]) -> list[int]:
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise UnsupportedError(f"nnp backend: node {node.name!r} ({node.op}) has asymmetric pads {pads}")
    return pads[:2]


def _padded_input(w: NnpWriter, node: Node) -> tuple[str, list[int]]:
    """Conv input and its symmetric pads; asymmetric padding becomes a Pad function in front."""
    x = node.input(0)
    pads = list(node.attrs["pads"])
    name = w.operand(x)
    if pads[0] == pads[2] and pads[1] == pads[3]:
        return name, pads[:2]
    shape = w.dims(x)
    shape[2] += pads[0] + pads[2]
    shape[3] += pads[1] + pads[3]
    out = w.temp(f"{node.name}/pad_out", shape)
    w.function("Pad", [name], [out], f"{node.name}/pad",
               {"pad_width": [pads[0], pads[2], pads[1], pads[3]], "mode": "constant", "constant_value": 0.0})
    return out, [0, 0]


# ----------------------------------------------------------------------------- convolutions
@emitter("Conv")
def _conv(w: NnpWriter, node: Node) -> None:
    x, pad = _padded_input(w, node)
    weight = node.input(1)
    a = node.attrs
    bias = [w.operand(node.inputs[2])] if len(node.inputs) > 2 and node.inputs[2] is not None else []
    geometry = {"base_axis": 1, "pad": pad, "stride": a["strides"], "dilation": a["dilations"]}
    channels = node.input(0).type.shape[1]
    wshape = weight.type.shape
    if a["group"] > 1 and a["group"] == channels and wshape[1] == 1 and weight.const is not None:
        wd = w.param(weight.name, weight.const.reshape(weight.const.shape[0], *weight.const.shape[2:]))
        _one(w, node, "DepthwiseConvolution", {**geometry, "multiplier": int(wshape[0]) // int(channels)},
             [x, wd, *bias])
        return
    _one(w, node, "Convolution", {**geometry, "group": a["group"], "channel_last": False},
         [x, w.operand(weight), *bias])


@emitter("ConvTranspose")
def _deconv(w: NnpWriter, node: Node) -> None:
    a = node.attrs
    _one(w, node, "Deconvolution", {"base_axis": 1, "pad": _symmetric(node, a["pads"]), "stride": a["strides"],
                                    "dilation": a["dilations"], "group": a["group"], "channel_last": False,
                                    "output_padding": a["output_padding"]})


@emitter("Dense")
def _dense(w: NnpWriter, node: Node) -> None:
    x = node.input(0)
    producer = x.producer()
    if (producer is not None and producer.op == "Flatten" and producer.attrs["axis"] == 1
            and len(x.consumers()) == 1 and all(o is not x for o in w.model.graph.outputs)):
        x = producer.input(0)  # nnabla's Affine flattens by itself (base_axis 1)
    ins = [w.operand(x)] + [w.operand(v) for v in node.inputs[1:] if v is not None]
    _one(w, node, "Affine", {"base_axis": 1}, ins)


@emitter("MatMul")
def _matmul(w: NnpWriter, node: Node) -> None:
    a, b = node.input(0), node.input(1)
    if a.type.rank == 2 and b.type.rank == 2:
        _one(w, node, "Affine", {"base_axis": 1})
        return
    if a.type.rank != b.type.rank:
        raise UnsupportedError(f"nnp backend: MatMul {node.name!r} of ranks {a.type.rank} and {b.type.rank}")
    _one(w, node, "BatchMatmul", {"transpose_a": False, "transpose_b": False})


@emitter("Flatten")
def _flatten(w: NnpWriter, node: Node) -> None:
    out = node.outputs[0]
    if all(user.op == "Dense" and user.inputs[0] is out for user in out.consumers()) and out.consumers() and \
            all(o is not out for o in w.model.graph.outputs):
        return  # folded into the Affine that reads it
    _reshape(w, node)


@emitter("Reshape", "Squeeze", "Unsqueeze")
def _reshape(w: NnpWriter, node: Node) -> None:
    _one(w, node, "Reshape", {"shape": w.dims(node.outputs[0]), "inplace": False}, [w.operand(node.input(0))])


@emitter("BatchNorm")
def _bn(w: NnpWriter, node: Node) -> None:
    x, scale, bias, mean, var = (node.input(i) for i in range(5))
    shape = [1, -1] + [1] * (x.type.rank - 2)
    params = []
    for value in (bias, scale, mean, var):
        if value.const is None:
            raise UnsupportedError(f"nnp backend: BatchNorm {node.name!r} needs constant statistics")
        params.append(w.param(value.name, value.const.reshape(shape)))
    _one(w, node, "BatchNormalization", {"axes": [1], "decay_rate": 0.9, "eps": node.attrs["epsilon"],
                                          "batch_stat": False, "no_scale": False, "no_bias": False},
         [w.operand(x), *params])


# ----------------------------------------------------------------------------- elementwise
@emitter(*nf.DIRECT_BY_OP, "Dropout")
def _plain(w: NnpWriter, node: Node) -> None:
    saved = node.meta.get("nnp.function")
    if node.op == "Identity" and saved is not None:
        _restore(w, node, saved, [w.operand(node.input(0))])
        return
    direct = nf.DIRECT_BY_OP["Identity" if node.op == "Dropout" else node.op]  # Dropout: identity at inference
    _one(w, node, direct.function, dict(direct.args), inputs=[w.operand(node.input(0))])


_UNARY_CHAINS: dict[str, Callable[[dict[str, Any]], list[tuple[str, dict[str, Any]]]]] = {
    "LeakyRelu": lambda a: [("LeakyReLU", {"alpha": a["alpha"], "inplace": False})],
    "Elu": lambda a: [("ELU", {"alpha": a["alpha"]})],
    "Sqrt": lambda a: [("PowScalar", {"val": 0.5, "inplace": False})],
    "Neg": lambda a: [("MulScalar", {"val": -1.0, "inplace": False})],
    "Reciprocal": lambda a: [("RDivScalar", {"val": 1.0})],
    "HardSigmoid": lambda a: [("MulScalar", {"val": a["alpha"], "inplace": False}),
                              ("AddScalar", {"val": a["beta"], "inplace": False}),
                              ("MaximumScalar", {"val": 0.0}), ("MinimumScalar", {"val": 1.0})],
}


@emitter(*_UNARY_CHAINS)
def _unary_chain(w: NnpWriter, node: Node) -> None:
    a = node.attrs
    if node.op == "HardSigmoid" and (a["alpha"], a["beta"]) == (0.2, 0.5):
        _one(w, node, "HardSigmoid", inputs=[w.operand(node.input(0))])
        return
    w.chain(node, w.operand(node.input(0)), _UNARY_CHAINS[node.op](a))


@emitter("Clip")
def _clip(w: NnpWriter, node: Node) -> None:
    lo, hi = node.attrs["min"], node.attrs["max"]
    x = w.operand(node.input(0))
    if (lo, hi) == (0.0, 6.0):
        _one(w, node, "ReLU6", inputs=[x])
    elif (lo, hi) == (-1.0, 1.0):
        _one(w, node, "HardTanh", inputs=[x])
    else:
        steps = ([("MaximumScalar", {"val": lo})] if lo is not None else []) + (
            [("MinimumScalar", {"val": hi})] if hi is not None else [])
        w.chain(node, x, steps or [("Identity", {})])


@emitter("HardSwish")
def _hardswish(w: NnpWriter, node: Node) -> None:
    x = w.operand(node.input(0))
    shape = w.dims(node.outputs[0])
    gate = x
    for ftype, args in (("MulScalar", {"val": 1 / 6, "inplace": False}), ("AddScalar", {"val": 0.5, "inplace": False}),
                        ("MaximumScalar", {"val": 0.0}), ("MinimumScalar", {"val": 1.0})):
        out = w.temp(f"{node.name}/{ftype}_out", shape)
        w.function(ftype, [gate], [out], f"{node.name}/{ftype}", args)
        gate = out
    _one(w, node, "Mul2", {"inplace": False}, [x, gate])


@emitter("Gelu")
def _gelu(w: NnpWriter, node: Node) -> None:
    if node.attrs["approximate"] != "tanh":
        raise UnsupportedError(f"nnp backend: Gelu {node.name!r}: nnabla's GELU is the tanh approximation")
    _one(w, node, "GELU", inputs=[w.operand(node.input(0))])


@emitter("Softmax")
def _softmax(w: NnpWriter, node: Node) -> None:
    _one(w, node, "Softmax", {"axis": node.attrs["axis"] % node.input(0).type.rank})


_TWO = {op: nf.nnabla_function(op) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")}
_INPLACE = {"AddScalar", "MulScalar", "PowScalar"}


@emitter(*_TWO)
def _binary(w: NnpWriter, node: Node) -> None:
    a, b = node.input(0), node.input(1)
    rank = node.outputs[0].type.rank
    for const, other, right in ((b, a, True), (a, b, False)):
        scalar = nf.scalar_function(node.op, scalar_left=not right)
        if const.const is not None and const.const.size == 1 and other.const is None and \
                scalar is not None and other.type.shape == node.outputs[0].type.shape:
            ftype, negate = scalar
            c = float(const.const.reshape(-1)[0])
            args: dict[str, Any] = {"val": float(-c if negate else c)}
            if ftype in _INPLACE:
                args["inplace"] = False
            _one(w, node, ftype, args, [w.operand(other)])
            return
    if a.const is None and b.const is None and a.type.rank != b.type.rank:
        raise UnsupportedError(f"nnp backend: {node.op} {node.name!r} of ranks {a.type.rank} and {b.type.rank}")
    args = {} if node.op in ("Max", "Min") else {"inplace": False}
    _one(w, node, _TWO[node.op], args, [w.operand(a, rank), w.operand(b, rank)])


# ----------------------------------------------------------------------------- pooling
@emitter("MaxPool", "AvgPool", "SumPool")
def _pool(w: NnpWriter, node: Node) -> None:
    from qcc.formats.nnp import nnabla_pooling

    a = node.attrs
    x = node.input(0).type.shape
    found = nnabla_pooling(node.op, a, (int(x[2]), int(x[3])))
    if found is None:
        raise UnsupportedError(f"nnp backend: {node.op} {node.name!r}: pads {list(a['pads'])} / ceil_mode "
                               f"{a['ceil_mode']} have no nnabla pooling equivalent")
    ignore_border, pad = found
    args: dict[str, Any] = {"kernel": a["kernel"], "stride": a["strides"] or [1, 1], "ignore_border": ignore_border,
                            "pad": pad, "channel_last": False}
    ftype = nf.nnabla_function(node.op)
    if node.op == "AvgPool":
        args["including_pad"] = a["count_include_pad"]
    _one(w, node, ftype, args)


@emitter("GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax")
def _reduce(w: NnpWriter, node: Node) -> None:
    rank = node.input(0).type.rank
    if node.op == "GlobalMaxPool":
        axes, keep = list(range(2, rank)), True
    else:
        axes, keep = [a % rank for a in node.attrs["axes"]], node.attrs["keepdims"]
    ftype = nf.nnabla_function("ReduceMax" if node.op == "GlobalMaxPool" else node.op)
    args: dict[str, Any] = {"axes": axes, "keep_dims": keep}
    if ftype == "Max":
        args.update(with_index=False, only_index=False)
    _one(w, node, ftype, args)


# ----------------------------------------------------------------------------- tensor ops
@emitter("Concat")
def _concat(w: NnpWriter, node: Node) -> None:
    _one(w, node, "Concatenate", {"axis": node.attrs["axis"] % node.input(0).type.rank})


@emitter("Transpose")
def _transpose(w: NnpWriter, node: Node) -> None:
    _one(w, node, "Transpose", {"axes": node.attrs["perm"]})


@emitter("Pad")
def _pad(w: NnpWriter, node: Node) -> None:
    pads, rank = node.attrs["pads"], node.input(0).type.rank
    mode = {"constant": "constant", "reflect": "reflect", "edge": "repeat"}[node.attrs["mode"]]
    width = [p for i in range(rank) for p in (pads[i], pads[i + rank])]
    _one(w, node, "Pad", {"pad_width": width, "mode": mode, "constant_value": node.attrs["value"]})


def _full_slice(w: NnpWriter, value: Value, slices: list[slice]) -> dict[str, list[int]]:
    start, stop, step = [], [], []
    for d, s in zip(value.type.shape, slices):
        size = d if isinstance(d, int) else w.batch
        lo, hi, st = s.indices(size)
        start.append(lo)
        stop.append(hi)
        step.append(st)
    return {"start": start, "stop": stop, "step": step}


@emitter("Slice")
def _slice(w: NnpWriter, node: Node) -> None:
    from qcc.ir.ops.tensor import Slice

    x = node.input(0)
    _one(w, node, "Slice", _full_slice(w, x, Slice._slices(x.type.shape, node.attrs)))


@emitter("Split")
def _split(w: NnpWriter, node: Node) -> None:
    x, axis = node.input(0), node.attrs["axis"] % node.input(0).type.rank
    squeezes = [p.consumers() for p in node.outputs]
    if all(s == 1 for s in node.attrs["split"]) and all(
            len(users) == 1 and users[0].op == "Squeeze" and [a % x.type.rank for a in users[0].attrs["axes"]] == [axis]
            and all(o is not p for o in w.model.graph.outputs) for users, p in zip(squeezes, node.outputs)):
        for users in squeezes:
            w.skip.add(id(users[0]))
        outs = [w.buffer(users[0].outputs[0]) for users in squeezes]
        w.function("Split", [w.operand(x)], outs, node.name, {"axis": axis})
        return
    begin = 0
    for size, part in zip(node.attrs["split"], node.outputs):
        slices = [slice(None)] * x.type.rank
        slices[axis] = slice(begin, begin + size)
        begin += size
        w.function("Slice", [w.operand(x)], [w.buffer(part)], f"{node.name}/{part.name}", _full_slice(w, x, slices))


# ----------------------------------------------------------------------------- quantization
def _restore(w: NnpWriter, node: Node, saved: bytes, inputs: list[str]) -> None:
    """Re-emit the nnabla function the node was imported from (with its own arguments)."""
    from nnabla.utils import nnabla_pb2

    original = nnabla_pb2.Function()
    original.ParseFromString(saved)
    f = w.function(original.type, inputs, [w.buffer(node.outputs[0])], node.name)
    field = original.WhichOneof("parameter")
    if field:
        getattr(f, field).CopyFrom(getattr(original, field))


def _affine_params(w: NnpWriter, node: Node, q: Affine) -> list[str]:
    """qr_min/qr_max (per channel along q.axis) and ql_min/ql_max for MinMaxQuantize."""
    lo_level, hi_level = AFFINE_RANGES[q.dtype]
    scale = np.asarray(q.scale, np.float64)
    zp = np.asarray(q.zero_point, np.float64)
    rank = node.input(0).type.rank
    shape = [1] * rank
    if q.axis is not None:
        shape[q.axis % rank] = len(q.scale)
    arrays = {"qr_min": ((lo_level - zp) * scale).reshape(shape), "qr_max": ((hi_level - zp) * scale).reshape(shape),
              "ql_min": np.full(shape, lo_level), "ql_max": np.full(shape, hi_level)}  # nnabla: equal shapes
    return [w.param(w.fresh(f"{node.name}/{k}"), v) for k, v in arrays.items()]


@emitter("Quantize")
def _quantize(w: NnpWriter, node: Node) -> None:
    x = w.operand(node.input(0))
    q = node.outputs[0].quant
    saved = node.meta.get("nnp.function")
    if saved is not None and q == node.meta.get("nnp.quant", q) and "nnp.params" in node.meta:
        names = [w.param(name, array) for name, array in node.meta["nnp.params"].items()]
        _restore(w, node, saved, [x, *names])
        return
    if isinstance(q, FixedPoint):
        _one(w, node, "FixedPointQuantize", {"sign": True, "n": q.bits, "delta": float(2.0 ** -q.frac),
                                             "ste_fine_grained": True}, [x])
    elif isinstance(q, Affine):
        params = _affine_params(w, node, q)
        width = float(np.min((AFFINE_RANGES[q.dtype][1] - AFFINE_RANGES[q.dtype][0]) * np.asarray(q.scale)))
        _one(w, node, "MinMaxQuantize", {"decay": 0.999, "x_min_max": False, "ema": False,
                                         "ste_fine_grained": True, "eps": min(0.01, width / 2)}, [x, *params])
    elif isinstance(q, Sign):
        _one(w, node, "Sign", {"alpha": 1.0}, [x])
    elif isinstance(q, Float32):
        _one(w, node, "Identity", inputs=[x])
    else:
        rank = node.input(0).type.rank
        params = [w.param(w.fresh(f"{node.name}/{k}"), np.full([1] * rank, v, np.float32))
                  for k, v in (("qr_min", -6.0), ("qr_max", 6.0), ("ql_min", 0.0), ("ql_max", 255.0))]
        _one(w, node, "MinMaxQuantize", {"decay": 0.999, "x_min_max": True, "ema": False,
                                         "ste_fine_grained": True, "eps": 0.01}, [x, *params])


def to_nnp_bytes(model: Model, batch_size: int | None = None, parameter_format: str = ".protobuf") -> bytes:
    """The model as .nnp bytes (network 'graph name', executor 'Runtime')."""
    writer = NnpWriter(model, batch_size)
    writer.build()
    return writer.to_bytes(parameter_format)


@attrs.frozen
class NnpOptions:
    batch_size: int | None = attrs.field(default=None, metadata={"help": "batch dimension written (none: the model's)"})
    parameter_format: Literal[".protobuf", ".h5"] = attrs.field(
        default=".protobuf", metadata={"help": "how parameters are stored in the archive"})

    def __attrs_post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")


class NnpBackend(Backend):
    """An NNabla .nnp archive (quantization as nnabla's quantize functions)."""

    name = "nnp"
    extensions = (".nnp",)
    Options = NnpOptions

    def constraints(self, options: NnpOptions) -> Constraints:
        # a quantized .nnp is converted to .nnb by nnabla: it keeps nnabla-c-runtime's positions
        return Constraints(self.name, fixed_point=NNABLA_C_RUNTIME)

    def runtime(self, out: str | os.PathLike[str], options: NnpOptions, model: Model | None = None) -> Runtime:
        """nnabla's forward of the written network (quantized: nnabla's quantize functions)."""
        from qcc.runtimes.base import FLOAT
        from qcc.runtimes.nnabla import NnablaRuntime

        return NnablaRuntime(out, tolerance=NNABLA_QUANTIZE if is_quantized(model) else FLOAT)

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: the IR ops EMITTERS writes as nnabla functions."""
        return {"nnp": dict.fromkeys(EMITTERS, "yes")}

    def serialize(self, model: Model, out: str | os.PathLike[str], options: NnpOptions) -> WriteResult:
        atomic_write_bytes(out, to_nnp_bytes(model, options.batch_size, options.parameter_format))
        return WriteResult()


BACKEND = NnpBackend()


def _member(name: str, compress_type: int = zipfile.ZIP_DEFLATED) -> zipfile.ZipInfo:
    """A zip entry with a fixed timestamp: the same model gives the same .nnp bytes at any time."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = compress_type
    info.external_attr = 0o644 << 16
    return info

importlib.import_module("qcc.backends.nnp_layers")  # it adds its emitters to EMITTERS
