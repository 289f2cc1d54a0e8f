"""IR -> ONNX graph conversion shared by the float and QDQ ONNX targets and the ONNX Runtime
calibration engine (`calibrate{engine=onnxruntime}`), hence a format module, not a backend.

One exporter per IR op in `EXPORTERS`; each appends ONNX nodes for one IR node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from qcc.errors import UnsupportedError
from qcc.ir.core import Model, Node, Value
from qcc.tables import registrar

OPSET = 13


class OnnxWriter:
    """Collects ONNX nodes/initializers while exporting; names stay the IR's names."""

    def __init__(self, model: Model, opset: int = OPSET) -> None:
        self.model = model
        self.opset = opset_for(model, opset)
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._names: set[str] = {v.name for v in model.graph.values()}
        self._counter = 0
        self.names: dict[int, str] = {}

    def fresh(self, base: str) -> str:
        name = base
        while name in self._names:
            self._counter += 1
            name = f"{base}__{self._counter}"
        self._names.add(name)
        return name

    def name(self, value: Value | None) -> str:
        if value is None:
            return ""
        return self.names.get(id(value), value.name)

    def const(self, base: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def reshaped(self, name: str, value: Value, shape: tuple[int, ...]) -> str:
        """A constant input under another shape (a new initializer); a computed one through a Reshape."""
        if value.const is not None:
            return self.const(f"{value.name}_{len(shape)}d", value.const.reshape(shape))
        out = self.fresh(f"{value.name}_{len(shape)}d")
        self.add("Reshape", [name, self.const(f"{out}_shape", np.array(shape, np.int64))], [out], f"{out}_reshape")
        return out

    def add(self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> None:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))

    def emit_constant(self, value: Value) -> None:
        """A constant as a float initializer (the QDQ writer stores quantized ones instead)."""
        from onnx import numpy_helper

        assert value.const is not None
        self.initializers.append(numpy_helper.from_array(value.const, value.name))

    def emit_node(self, node: Node) -> None:
        """One IR node's ONNX form (the QDQ writer adds quantization around it)."""
        EXPORTERS[node.op](self, node, [self.name(v) for v in node.inputs], [self.name(v) for v in node.outputs])


Exporter = Callable[[OnnxWriter, Node, list[str], list[str]], None]
EXPORTERS: dict[str, Exporter] = {}


exporter = registrar(EXPORTERS)


def _same(onnx_op: str) -> Exporter:
    def fn(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
        w.add(onnx_op, ins, outs, node.name)
    return fn


for _ir, _onnx in {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log",
                   "Sqrt": "Sqrt", "Neg": "Neg", "Abs": "Abs", "Erf": "Erf", "Reciprocal": "Reciprocal",
                   "Identity": "Identity", "Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div",
                   "Pow": "Pow", "Max": "Max", "Min": "Min", "MatMul": "MatMul",
                   "GlobalAvgPool": "GlobalAveragePool", "GlobalMaxPool": "GlobalMaxPool",
                   "Softplus": "Softplus", "PRelu": "PRelu"}.items():
    EXPORTERS[_ir] = _same(_onnx)


@exporter("Dropout")
def _dropout(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("Identity", ins[:1], outs, node.name)


@exporter("Quantize")
def _quantize(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("Identity", ins[:1], outs, node.name)


@exporter("HardSwish")
def _hardswish(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    if w.opset >= 14:
        w.add("HardSwish", ins, outs, node.name)
        return
    hs = w.fresh(f"{node.name}_hsig")
    w.add("HardSigmoid", ins, [hs], f"{node.name}_hsig", alpha=1.0 / 6, beta=0.5)
    w.add("Mul", [ins[0], hs], outs, node.name)


@exporter("LeakyRelu", "Elu")
def _alpha(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add(node.op, ins, outs, node.name, alpha=node.attrs["alpha"])


@exporter("HardSigmoid")
def _hardsigmoid(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("HardSigmoid", ins, outs, node.name, alpha=node.attrs["alpha"], beta=node.attrs["beta"])


@exporter("Silu")
def _silu(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    sig = w.fresh(f"{node.name}_sigmoid")
    w.add("Sigmoid", ins, [sig], f"{node.name}_sigmoid")
    w.add("Mul", [ins[0], sig], outs, node.name)


@exporter("Gelu")
def _gelu(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    x = ins[0]
    if node.attrs["approximate"] == "tanh":
        c = w.const(f"{node.name}_c", np.array(math.sqrt(2 / math.pi), np.float32))
        k = w.const(f"{node.name}_k", np.array(0.044715, np.float32))
        three = w.const(f"{node.name}_3", np.array(3.0, np.float32))
        cube, inner, inner2, t = (w.fresh(f"{node.name}_{s}") for s in ("cube", "in", "in2", "tanh"))
        w.add("Pow", [x, three], [cube], f"{node.name}_pow")
        w.add("Mul", [cube, k], [inner], f"{node.name}_mulk")
        w.add("Add", [x, inner], [inner2], f"{node.name}_add")
        scaled = w.fresh(f"{node.name}_scaled")
        w.add("Mul", [inner2, c], [scaled], f"{node.name}_mulc")
        w.add("Tanh", [scaled], [t], f"{node.name}_tanh")
        core = t
    else:
        r2 = w.const(f"{node.name}_sqrt2", np.array(math.sqrt(2), np.float32))
        div, erf = w.fresh(f"{node.name}_div"), w.fresh(f"{node.name}_erf")
        w.add("Div", [x, r2], [div], f"{node.name}_div")
        w.add("Erf", [div], [erf], f"{node.name}_erf")
        core = erf
    one = w.const(f"{node.name}_one", np.array(1.0, np.float32))
    half = w.const(f"{node.name}_half", np.array(0.5, np.float32))
    plus, xh = w.fresh(f"{node.name}_plus"), w.fresh(f"{node.name}_xh")
    w.add("Add", [core, one], [plus], f"{node.name}_plus")
    w.add("Mul", [x, half], [xh], f"{node.name}_xh")
    w.add("Mul", [xh, plus], outs, node.name)


@exporter("Clip")
def _clip(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    lo, hi = node.attrs["min"], node.attrs["max"]
    lo_name = w.const(f"{node.name}_min", np.array(lo, np.float32)) if lo is not None else ""
    hi_name = w.const(f"{node.name}_max", np.array(hi, np.float32)) if hi is not None else ""
    w.add("Clip", [ins[0], lo_name, hi_name], outs, node.name)


@exporter("Softmax", "LogSoftmax")
def _softmax(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add(node.op, ins, outs, node.name, axis=node.attrs["axis"])


@exporter("Conv", "ConvTranspose")
def _conv(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    weight = node.input(1)
    extra = {"output_padding": node.attrs["output_padding"]} if node.op == "ConvTranspose" else {}
    w.add(node.op, [i for i in ins], outs, node.name, kernel_shape=[int(d) for d in weight.type.shape[2:]],
          strides=node.attrs["strides"], pads=node.attrs["pads"], dilations=node.attrs["dilations"],
          group=node.attrs["group"], **extra)


@exporter("Dense")
def _dense(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("Gemm", [i for i in ins if i != ""], outs, node.name)


@exporter("BatchNorm")
def _bn(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("BatchNormalization", ins, outs, node.name, epsilon=node.attrs["epsilon"])


@exporter("MaxPool", "AvgPool")
def _pool(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    a = node.attrs
    extra = {"count_include_pad": int(a["count_include_pad"])} if node.op == "AvgPool" else {}
    strides = a["strides"] or [1, 1]
    w.add("MaxPool" if node.op == "MaxPool" else "AveragePool", ins, outs, node.name, kernel_shape=a["kernel"],
          strides=strides, pads=a["pads"], ceil_mode=int(a["ceil_mode"]), **extra)


@exporter("SumPool")
def _sumpool(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    """A depthwise Conv with an all-ones kernel: zero padding (and ceil-mode overhang) add nothing."""
    a = node.attrs
    x, y = node.input(0).type.shape, node.outputs[0].type.shape
    strides = a["strides"] or [1, 1]
    pads = list(a["pads"])
    for i in range(2):
        need = (int(y[2 + i]) - 1) * strides[i] + a["kernel"][i]
        pads[2 + i] += max(0, need - (int(x[2 + i]) + a["pads"][i] + a["pads"][2 + i]))
    channels = int(x[1])
    ones = w.const(f"{node.name}_ones", np.ones((channels, 1, *a["kernel"]), np.float32))
    w.add("Conv", [ins[0], ones], outs, node.name, kernel_shape=a["kernel"], strides=strides, pads=pads,
          group=channels)


@exporter("LRN")
def _lrn(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    a = node.attrs
    w.add("LRN", ins, outs, node.name, size=a["size"], alpha=a["alpha"], beta=a["beta"], bias=a["bias"])


@exporter("Concat")
def _concat(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("Concat", ins, outs, node.name, axis=node.attrs["axis"])


@exporter("Split")
def _split(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    split = w.const(f"{node.name}_split", np.array(node.attrs["split"], np.int64))
    w.add("Split", [ins[0], split], outs, node.name, axis=node.attrs["axis"])


@exporter("Reshape")
def _reshape(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    shape = list(node.attrs["shape"])
    out_shape = node.outputs[0].type.shape
    in_shape = node.input(0).type.shape
    # keep a symbolic batch symbolic: copy dim 0 instead of baking the traced size in
    if shape and in_shape and isinstance(in_shape[0], str) and out_shape and out_shape[0] == in_shape[0]:
        shape[0] = 0
    name = w.const(f"{node.name}_shape", np.array(shape, np.int64))
    w.add("Reshape", [ins[0], name], outs, node.name)


@exporter("Flatten")
def _flatten(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("Flatten", ins, outs, node.name, axis=node.attrs["axis"])


@exporter("Transpose")
def _transpose(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("Transpose", ins, outs, node.name, perm=node.attrs["perm"])


@exporter("Squeeze", "Unsqueeze")
def _squeeze(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    axes = w.const(f"{node.name}_axes", np.array(node.attrs["axes"], np.int64))
    w.add(node.op, [ins[0], axes], outs, node.name)


@exporter("Pad")
def _pad(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    pads = w.const(f"{node.name}_pads", np.array(node.attrs["pads"], np.int64))
    value = w.const(f"{node.name}_value", np.array(node.attrs["value"], np.float32))
    w.add("Pad", [ins[0], pads, value], outs, node.name, mode=node.attrs["mode"])


@exporter("Slice")
def _slice(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    a = node.attrs
    parts = [w.const(f"{node.name}_{k}", np.array(a[k], np.int64)) for k in ("starts", "ends", "axes")]
    if a["steps"]:
        parts.append(w.const(f"{node.name}_steps", np.array(a["steps"], np.int64)))
    w.add("Slice", [ins[0], *parts], outs, node.name)


@exporter("ReduceMean", "ReduceMax", "ReduceSum", "ReduceL2")
def _reduce(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    keep = int(node.attrs["keepdims"])
    if node.op == "ReduceSum" or w.opset >= 18:  # ReduceMean/ReduceMax take axes as an input from opset 18
        axes = w.const(f"{node.name}_axes", np.array(node.attrs["axes"], np.int64))
        w.add(node.op, [ins[0], axes], outs, node.name, keepdims=keep)
    else:
        w.add(node.op, ins, outs, node.name, axes=node.attrs["axes"], keepdims=keep)


@exporter("Mish")
def _mish(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    if w.opset >= 18:
        w.add("Mish", ins, outs, node.name)
        return
    soft, tanh = w.fresh(f"{node.name}_softplus"), w.fresh(f"{node.name}_tanh")
    w.add("Softplus", ins, [soft], f"{node.name}_softplus")
    w.add("Tanh", [soft], [tanh], f"{node.name}_tanh")
    w.add("Mul", [ins[0], tanh], outs, node.name)


@exporter("LayerNorm")
def _layer_norm(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    x = node.input(0)
    axis = node.attrs["axis"] % x.type.rank
    scale = ins[1] if len(ins) > 1 and ins[1] else w.const(
        f"{node.name}_scale", np.ones([int(d) for d in x.type.shape[axis:]], np.float32))
    w.add("LayerNormalization", [ins[0], scale, *ins[2:3]], outs, node.name, axis=axis,
          epsilon=node.attrs["epsilon"])


@exporter("InstanceNorm")
def _instance_norm(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    w.add("InstanceNormalization", ins, outs, node.name, epsilon=node.attrs["epsilon"])


@exporter("GroupNorm")
def _group_norm(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    """InstanceNormalization of the (N, groups, -1) view, then the per-channel scale and bias
    (ONNX's GroupNormalization changed its scale's meaning between opsets 18 and 21)."""
    x = node.input(0)
    groups, rank = int(node.attrs["num_groups"]), x.type.rank
    channel = (-1,) + (1,) * (rank - 2)
    grouped, normed, flat, scaled = (w.fresh(f"{node.name}_{s}") for s in ("grouped", "normed", "flat", "scaled"))
    w.add("Reshape", [ins[0], w.const(f"{node.name}_groups", np.array([0, groups, -1], np.int64))], [grouped],
          f"{node.name}_group")
    w.add("InstanceNormalization", [grouped, w.const(f"{node.name}_ones", np.ones(groups, np.float32)),
                                    w.const(f"{node.name}_zeros", np.zeros(groups, np.float32))], [normed],
          f"{node.name}_normalize", epsilon=node.attrs["epsilon"])
    shape = [0, *(int(d) for d in x.type.shape[1:])]
    w.add("Reshape", [normed, w.const(f"{node.name}_shape", np.array(shape, np.int64))], [flat], f"{node.name}_ungroup")
    w.add("Mul", [flat, w.reshaped(ins[1], node.input(1), channel)], [scaled], f"{node.name}_scale")
    w.add("Add", [scaled, w.reshaped(ins[2], node.input(2), channel)], outs, node.name)


@exporter("Resize")
def _resize(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    """Scales when they give the output sizes (ONNX Runtime then uses them as they are), else sizes."""
    a = node.attrs
    shape = node.input(0).type.shape
    exact = all(size == 0 or (isinstance(d, int) and math.floor(np.float32(s) * np.float32(d)) == size)
                for d, size, s in zip(shape, a["sizes"], a["scales"]))
    if exact:
        inputs = [ins[0], "", w.const(f"{node.name}_scales", np.array(a["scales"], np.float32))]
    else:
        inputs = [ins[0], "", "", w.const(f"{node.name}_sizes", np.array(a["sizes"], np.int64))]
    w.add("Resize", inputs, outs, node.name, mode=a["mode"], coordinate_transformation_mode=a["coordinate_transformation_mode"],
          nearest_mode=a["nearest_mode"])


@exporter("DepthToSpace", "SpaceToDepth")
def _depth_space(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    extra = {"mode": node.attrs["mode"]} if node.op == "DepthToSpace" else {}
    w.add(node.op, ins, outs, node.name, blocksize=node.attrs["blocksize"], **extra)


@exporter("ArgMax")
def _argmax(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    a = node.attrs
    w.add("ArgMax", ins, outs, node.name, axis=a["axis"], keepdims=int(a["keepdims"]),
          select_last_index=int(a["select_last_index"]))


@exporter("TopK")
def _topk(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    k = w.const(f"{node.name}_k", np.array([node.attrs["k"]], np.int64))
    w.add("TopK", [ins[0], k], outs, node.name, axis=node.attrs["axis"], largest=int(node.attrs["largest"]), sorted=1)


@exporter("Gather")
def _gather(w: OnnxWriter, node: Node, ins: list[str], outs: list[str]) -> None:
    from qcc.ir.ops.indexing import gather_indices

    indices = w.const(f"{node.name}_indices", gather_indices(node))
    w.add("Gather", [ins[0], indices], outs, node.name, axis=node.attrs["axis"])


OPSET_NEEDED = {"LayerNorm": 17}
"""IR ops whose ONNX form needs a newer opset than the writer's default."""


def opset_for(model: Model, opset: int) -> int:
    """The opset to write `model` at: at least `opset` and what its ops need."""
    needed = [OPSET_NEEDED.get(n.op, 0) for n in model.graph.nodes]
    needed += [19 for n in model.graph.nodes
               if n.op == "Resize" and n.attrs["coordinate_transformation_mode"] == "half_pixel_symmetric"]
    return max([opset, *needed])


def value_info(value: Value) -> Any:
    from onnx import helper

    dims = [d if isinstance(d, int) else str(d) for d in value.type.shape]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(value.type.dtype))
    return helper.make_tensor_value_info(value.name, elem, dims)


def export_graph(w: OnnxWriter, skip: Callable[[Node], bool] | None = None) -> None:
    """Append every node's ONNX form (constants become initializers)."""
    graph = w.model.graph
    unsupported = sorted({n.op for n in graph.nodes if n.op not in EXPORTERS})
    if unsupported:
        raise UnsupportedError(f"ONNX backend: no ONNX mapping for IR op(s) {', '.join(unsupported)}")
    for value in graph.constants:
        w.emit_constant(value)
    for node in graph.nodes:
        if skip is not None and skip(node):
            continue
        w.emit_node(node)


def finish(w: OnnxWriter, pipeline: str = "") -> Any:
    """Build the ModelProto with qcc's version and pipeline in metadata_props."""
    from onnx import helper

    from qcc import __version__

    graph = w.model.graph
    g = helper.make_graph(
        w.nodes, graph.name, [value_info(v) for v in graph.inputs], [value_info(v) for v in graph.outputs],
        initializer=w.initializers,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", w.opset)], producer_name="qcc",
                              producer_version=__version__)
    proto.ir_version = 8 if w.opset < 19 else 9 if w.opset < 21 else 10
    passes = pipeline or ",".join(w.model.passes_run)
    helper.set_model_props(proto, {"qcc.version": __version__, "qcc.pipeline": passes,
                                   "qcc.source": str(w.model.metadata.get("source", ""))})
    return proto


def to_onnx(model: Model, opset: int = OPSET) -> Any:
    w = OnnxWriter(model, opset)
    export_graph(w)
    return finish(w)
