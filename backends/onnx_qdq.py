"""Target `onnx-qdq`: the annotated IR as ONNX QuantizeLinear/DequantizeLinear (QDQ) pairs.

Lowering, one rule per annotation (docs/quantized-ir.md, docs/backends.md):
- an annotated activation (graph input or node output) gets QuantizeLinear -> DequantizeLinear
  right after its producer; the DequantizeLinear output carries the IR value's name, so every
  ONNX tensor named like an IR value holds what the simulator computes for it;
- an annotated constant is stored already quantized (integer initializer) + DequantizeLinear;
- the bias of Conv/ConvTranspose/Dense whose input and weight are quantized is stored int32 at
  scale s_x * s_w (ONNX Runtime's QLinearConv/QGemm read the integers and assume that scale);
- FixedPoint(bits, frac) is affine with scale 2^-frac and zero point 0;
- a Relu whose quantized output clamps at zero anyway (zero point = the type's minimum) is
  dropped, its quantization applied to its input (exact); when that input has no other reader
  and no other quantization, the producer's output goes straight into it and ORT fuses both;
- a Relu between two equal signed, zero-point-0 quantizations (fixed point) becomes an exact
  requantization to the unsigned type of the same width (storages that write uint8 only);
- `storage` (STORAGES) chooses how int8 is written for the runtime, never the values.
ONNX Runtime turns DQ -> op -> Q groups into integer kernels (QLinearConv, QGemm, QLinearAdd...).
Every tensor that stays float without a decision (no annotation) becomes a report line; see
docs/backends.md for what ORT fuses and the measurements behind the choices.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import attrs
import numpy as np

from qcc.errors import UnsupportedError, UsageError
from qcc.formats.onnx_export import EXPORTERS, OPSET, OnnxWriter, export_graph, finish
from qcc.io import atomic_write_bytes
from qcc.ir.core import Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.types import Affine, FixedPoint, Float32, QuantType, Sign
from qcc.runtimes.base import Runtime
from qcc.target import Backend, WriteResult

"""Ops with (x, weight, bias) inputs; a per-channel bias runs along its axis 0."""

ACTIVATION_DTYPES = {"int8": 13, "uint8": 13, "int16": 21, "uint16": 21}
"""QuantizeLinear output types -> the opset that first allows them."""

CONSTANT_DTYPES = {"int8": 13, "uint8": 13, "int32": 13, "int16": 21, "uint16": 21, "int4": 21, "uint4": 21}
"""DequantizeLinear input types -> the opset that first allows them."""

FOUR_BIT = {"int4": "int8", "uint4": "uint8"}
"""4-bit weights: ONNX INT4/UINT4 initializers (opset 21, packed two per byte), which ONNX Runtime
1.23 dequantizes per tensor and per axis; any other 4-bit constant is stored in the 8-bit type
of the same sign (same values) with a report line."""

STORAGES: dict[str, tuple[bool, bool]] = {"ort": (True, True), "ort-vnni": (True, False),
                                         "annotated": (False, False)}
"""How int8 is written: (activations and other constants as uint8, weights as uint8); the
values never change.

uint8 storage holds q + 128 with zero point + 128, which dequantizes to exactly the same values.
- 'ort' (default): ONNX Runtime on any CPU. Its x86 kernels take only uint8 activations (it
  converts an int8 Q/DQ pair itself only when the Q feeds a single DequantizeLinear, so a tensor
  with two consumers would stay float), and uint8 weights run its u8u8 kernels, which cannot
  overflow the int16 pair sums its u8s8 kernels saturate on AVX2 without VNNI.
- 'ort-vnni': int8 weights (u8s8 kernels): about 20% faster on CPUs with VNNI (or ARM), but
  full 8-bit weights can saturate on x86 AVX2 without VNNI.
- 'annotated': every type exactly as annotated (runtimes that require int8, e.g. TensorRT).
Measurements: docs/backends.md."""

_FIXED_DTYPES = {4: "int4", 8: "int8", 16: "int16", 32: "int32"}
"""fixed4's 4-bit weights are int4 (opset 21) as the int4 scheme's are; other 4-bit constants int8."""

ORT_INTEGER_OPS = frozenset({
    "Conv", "Dense", "Add", "Mul", "AvgPool", "GlobalAvgPool", "SumPool", "MaxPool", "Concat", "LeakyRelu",
    "Sigmoid", "Softmax", "Relu", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Split",
    "Identity", "Dropout", "Quantize", "Resize", "DepthToSpace", "Gather", "MatMul", "ReduceMax", "ArgMax",
})
"""IR ops ONNX Runtime (1.23, CPU) runs on integers when this backend writes them quantized, uint8
activations (storage 'ort'): QLinear* kernels, QGemm, value moves on uint8, a Relu folded into its
quantization, or no node at all. Every other op the writer supports computes in float between
DequantizeLinear and QuantizeLinear (which is how ORT simulates it). tests/test_op_tables.py
checks both sides against ORT's optimized graph; the matrix (docs/ops.md) shows them as int/float."""


@attrs.frozen(eq=False)
class QParams:
    """Integer type, scale(s), zero point(s) and axis of one QuantizeLinear/DequantizeLinear."""

    dtype: str
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None

    def same(self, other: QParams) -> bool:
        return (self.dtype == other.dtype and self.axis == other.axis
                and np.array_equal(self.scale, other.scale) and np.array_equal(self.zero_point, other.zero_point))

    @property
    def clamps_at_zero(self) -> bool:
        """Quantizing with these parameters already maps every negative value to 0."""
        from qcc.quant import AFFINE_DTYPES

        return self.axis is None and int(self.zero_point) == AFFINE_DTYPES[self.dtype][0]


def qparams(quant: QuantType | None, name: str) -> QParams | None:
    """The QDQ parameters an annotation stands for (None: the value stays float)."""
    if quant is None or isinstance(quant, Float32):
        return None
    if isinstance(quant, Affine):
        from qcc.quant.numerics import NUMPY_STORAGE

        scale = np.asarray(quant.scale, np.float32)
        zp = np.asarray(quant.zero_point, np.int64).astype(NUMPY_STORAGE.get(quant.dtype, quant.dtype))
        if quant.axis is None:
            scale, zp = scale.reshape(()), zp.reshape(())
        return QParams(quant.dtype, scale, zp, quant.axis)
    if isinstance(quant, FixedPoint):
        dtype = _FIXED_DTYPES[quant.bits]
        return QParams(dtype, np.asarray(quant.step, np.float32), np.zeros((), numpy_dtype(dtype)))
    if isinstance(quant, Sign):
        return QParams("int8", np.ones((), np.float32), np.zeros((), np.int8))
    raise UnsupportedError(f"onnx-qdq: tensor {name!r} has annotation {quant!r} with no QDQ form")


def numpy_dtype(dtype: str) -> str:
    return FOUR_BIT.get(dtype, dtype)


def integers(value: Value, params: QParams) -> np.ndarray:
    """A constant's stored integers: its simulated value (annotation applied) at `params`."""
    from qcc.ir.fakequant import apply_annotation
    from qcc.quant import quantize_affine

    assert value.const is not None
    quant = value.quant
    if isinstance(quant, Affine) and quant.axis == params.axis and \
            np.array_equal(np.asarray(quant.scale, np.float32).reshape(params.scale.shape), params.scale):
        # same scales: the annotation's integers moved to the storage's zero point (one pass)
        zp = np.asarray(quant.zero_point).reshape(params.zero_point.shape)
        shift = params.zero_point.astype(np.int64) - zp
        if _same_grid(quant.dtype, params.dtype, shift):  # int8 as uint8 (+128), or as annotated
            # clip(round(x/s) + zp, lo, hi) + c == clip(round(x/s) + zp + c, lo + c, hi + c), exact in
            # float32: quantized at the storage's zero point, without the int64 copies
            return quantize_affine(value.const, params.scale, params.zero_point, params.dtype, params.axis)
        q = quantize_affine(value.const, params.scale, zp, quant.dtype, params.axis).astype(np.int64)
        shape = [1] * q.ndim
        if params.axis is not None:
            shape[params.axis] = -1
        return (q + shift.reshape(shape if params.axis is not None else ())).astype(numpy_dtype(params.dtype))
    stored = apply_annotation(value.const.astype(np.float32), quant)
    return quantize_affine(stored, params.scale, params.zero_point, params.dtype, params.axis)


def _same_grid(annotated: str, storage: str, shift: np.ndarray) -> bool:
    """Whether every channel's zero-point shift maps the annotated dtype's integers onto the storage
    dtype's exactly (bounds included), so that clipping in either gives the same values."""
    from qcc.quant.numerics import AFFINE_DTYPES, NUMPY_STORAGE

    if NUMPY_STORAGE.get(storage, storage) != numpy_dtype(storage) or shift.size == 0:
        return False
    c = int(shift.flat[0])
    (lo, hi), (slo, shi) = AFFINE_DTYPES[annotated], AFFINE_DTYPES[storage]
    return bool(np.all(shift == c)) and (lo + c, hi + c) == (slo, shi)


@attrs.define
class Lowering:
    """What the writer emits for each value, decided once from the annotations."""

    activations: dict[int, QParams] = attrs.field(factory=dict)  # value id -> its Q/DQ pair
    constants: dict[int, QParams] = attrs.field(factory=dict)  # constant id -> stored integers
    folded: set[int] = attrs.field(factory=set)  # ids of Relu nodes replaced by their quantization
    absorbed: set[int] = attrs.field(factory=set)  # Relu inputs whose producer feeds that quantization
    fallbacks: list[dict[str, str]] = attrs.field(factory=list)
    opset: int = OPSET

    def need(self, dtype: str, table: dict[str, int], name: str) -> None:
        if dtype not in table:
            raise UnsupportedError(f"onnx-qdq: tensor {name!r} is annotated {dtype}, which ONNX QDQ cannot "
                                   f"express here (allowed: {', '.join(table)})")
        self.opset = max(self.opset, table[dtype])

    def fallback(self, value: Value, reason: str) -> None:
        """One float_fallbacks entry, shaped like the quantization passes' ones."""
        kind = "parameter" if value.is_const else "activation"
        self.fallbacks.append({"tensor": value.name, "kind": kind, "reason": reason})


def stored(p: QParams, to_uint8: bool) -> QParams:
    """p as the file stores it: int8 as uint8 (q + 128, zero point + 128) when asked; same values."""
    if not to_uint8 or p.dtype != "int8":
        return p
    return QParams("uint8", p.scale, (p.zero_point.astype(np.int64) + 128).astype(np.uint8), p.axis)


def _activation_params(value: Value, low: Lowering, to_uint8: bool) -> QParams | None:
    if isinstance(value.quant, FixedPoint) and value.quant.bits not in (8, 16):
        raise UnsupportedError(f"onnx-qdq: activation {value.name!r} is {value.quant}; QuantizeLinear has no "
                               f"{value.quant.bits}-bit saturating form here (use FIXED8 or FIXED16)")
    params = qparams(value.quant, value.name)
    if params is None:
        return None
    params = stored(params, to_uint8)
    low.need(params.dtype, ACTIVATION_DTYPES, value.name)
    return params


def _bias_params(node: Node, low: Lowering) -> QParams | None:
    """int32 at s_x * s_w when the node's input and weight are quantized (what ORT assumes)."""
    x = low.activations.get(id(node.input(0)))
    wq = low.constants.get(id(node.input(1)))
    if x is None or wq is None or x.axis is not None:
        return None
    scale = (x.scale * wq.scale).astype(np.float32)
    if scale.ndim == 1 and scale.shape[0] != node.input(2).type.shape[0]:  # grouped ConvTranspose
        return None
    axis = 0 if scale.ndim == 1 else None
    return QParams("int32", scale, np.zeros(scale.shape, np.int32), axis)


UNSIGNED = {"int8": "uint8", "int16": "uint16"}
"""Signed activation types and the unsigned type of the same width (a Relu output's QDQ form)."""


def _fold_relu(node: Node, low: Lowering, outputs: set[int], unsigned_ok: bool) -> None:
    """Drop a Relu whose output quantization maps every negative value to zero anyway (exact).

    When its input is read only by the Relu and carries no other quantization, the producer's
    output goes straight into the Relu's QuantizeLinear, so ORT fuses producer and Relu.
    """
    x, y = node.inputs[0], node.outputs[0]
    py = low.activations.get(id(y))
    if x is None or py is None:
        return
    if not py.clamps_at_zero:
        if unsigned_ok:
            _fold_signed_relu(node, low)
        return
    low.folded.add(id(node))
    px = low.activations.get(id(x))
    if x.producer() is not None and id(x) not in outputs and len(x.uses()) == 1 and (px is None or px.same(py)):
        low.activations.pop(id(x), None)
        low.absorbed.add(id(x))


def _fold_signed_relu(node: Node, low: Lowering) -> None:
    """Relu between two equal signed, zero-point-0 quantizations (fixed point): requantize instead.

    Its input's QDQ already holds integers q in [min, max] on the grid; Relu keeps max(q, 0),
    which QuantizeLinear to the unsigned type of the same width and scale, zero point 0,
    computes exactly (q <= max < the unsigned maximum). The Relu's consumers read that unsigned
    tensor: same values, and ORT's integer kernels take uint8 where int8 would stay float.

    The input's pair stays signed: ORT's DoubleQDQPairsRemover would merge two uint8 pairs
    Q -> DQ -> Q -> DQ into one with a new scale (other values, and ORT 1.23 then fails to load
    the model); it leaves pairs of different types alone, and ORT still converts the int8 pair to
    uint8 for the producer's integer kernel (QDQS8ToU8Transformer: its Q feeds one DQ).
    """
    x, y = node.inputs[0], node.outputs[0]
    assert x is not None
    px, py = qparams(x.quant, x.name), qparams(y.quant, y.name)
    if (id(x) not in low.activations or px is None or py is None or not px.same(py) or py.axis is not None
            or py.dtype not in UNSIGNED or int(py.zero_point) != 0):
        return
    dtype = UNSIGNED[py.dtype]
    low.need(dtype, ACTIVATION_DTYPES, y.name)
    low.activations[id(x)] = px
    low.activations[id(y)] = QParams(dtype, py.scale, np.zeros((), dtype))
    low.folded.add(id(node))


def plan(model: Model, storage: str = "ort") -> Lowering:
    """Decide every value's ONNX form and the report lines for what stays float."""
    if storage not in STORAGES:
        raise UsageError(f"onnx-qdq: storage {storage!r}: choose one of {', '.join(STORAGES)}")
    uint8_activations, uint8_weights = STORAGES[storage]
    graph = model.graph
    low = Lowering()
    outputs = {id(v) for v in graph.outputs}
    for value in list(graph.inputs) + [o for n in graph.nodes for o in n.outputs]:
        params = _activation_params(value, low, uint8_activations)
        if params is not None:
            low.activations[id(value)] = params
    for value in graph.constants:
        params = qparams(value.quant, value.name)
        if params is not None:
            weight = all(get_schema(n.op).role(i).kind == "weight" for n, i in value.uses())
            if params.dtype in FOUR_BIT and not weight:
                params = attrs.evolve(params, dtype=FOUR_BIT[params.dtype])
                low.fallback(value, f"{value.quant}: ONNX Runtime dequantizes 4-bit integers only as weights; "
                             f"stored as {params.dtype} (same values)")
            params = stored(params, uint8_weights if weight else uint8_activations)
            low.need(params.dtype, CONSTANT_DTYPES, value.name)
            low.constants[id(value)] = params
    for node in graph.nodes:
        bias_index = get_schema(node.op).bias_input
        bias = node.inputs[bias_index] if bias_index is not None and bias_index < len(node.inputs) else None
        if bias is not None and bias.is_const:
            if not isinstance(bias.quant, Float32):
                params = _bias_params(node, low)
                if params is not None:
                    low.constants[id(bias)] = params
        if node.op == "Relu":
            _fold_relu(node, low, outputs, uint8_activations)
    for value in graph.values():
        if value.quant is not None or id(value) in low.absorbed or value.type.dtype != "float32":
            continue
        if id(value) in low.activations or id(value) in low.constants:
            continue
        users = ", ".join(sorted({n.name for n in value.consumers()})) or "graph output"
        low.fallback(value, f"not annotated by the pipeline: stays float (read by {users})")
    return low


class QdqWriter(OnnxWriter):
    """OnnxWriter that quantizes what the Lowering says while the shared exporters run."""

    def __init__(self, model: Model, low: Lowering) -> None:
        super().__init__(model, low.opset)
        self.low = low
        self.ahead: dict[int, Future[np.ndarray]] = {}
        self._refill: Callable[[], None] | None = None

    @contextlib.contextmanager
    def quantizing_ahead(self) -> Iterator[None]:
        """The quantized constants' integers computed on the cores' threads, a few constants ahead of
        the one being written (numpy releases the GIL; each constant's integers are a function of it
        alone, so the values are those `integers` gives in this thread). ResNet-50's 25.6 M weights:
        0.09 s of rounding beside the proto building. At most 2 per thread wait to be written."""
        from qcc.pm.parallel import worker_threads
        from qcc.sim.split import product_threads

        threads = min(product_threads(worker_threads()), 4)
        values = [v for v in self.model.graph.constants if id(v) in self.low.constants]  # export_graph's order
        if threads < 2 or len(values) < 2:
            yield
            return
        with ThreadPoolExecutor(threads, thread_name_prefix="qcc-qdq") as pool:
            pending = iter(values)

            def refill() -> None:
                while len(self.ahead) < 2 * threads:
                    value = next(pending, None)
                    if value is None:
                        return
                    self.ahead[id(value)] = pool.submit(integers, value, self.low.constants[id(value)])

            self._refill = refill
            refill()
            try:
                yield
            finally:
                self._refill = None
                for future in self.ahead.values():
                    future.cancel()
                self.ahead.clear()

    def params(self, base: str, p: QParams) -> list[str]:
        return [self.const(f"{base}_scale", p.scale), self.integer_const(f"{base}_zero_point", p.zero_point, p.dtype)]

    def integer_const(self, base: str, array: np.ndarray, dtype: str) -> str:
        """An integer initializer of the ONNX type `dtype` (INT4/UINT4: packed by onnx.helper)."""
        if dtype not in FOUR_BIT:
            return self.const(base, array)
        from onnx import TensorProto, helper

        name = self.fresh(base)
        kind = TensorProto.INT4 if dtype == "int4" else TensorProto.UINT4
        values = np.asarray(array).astype(np.int64)
        self.initializers.append(helper.make_tensor(name, kind, list(values.shape), values.reshape(-1).tolist()))
        return name

    def dequantize(self, q: str, out: str, base: str, p: QParams) -> None:
        axis = {} if p.axis is None else {"axis": p.axis}
        self.add("DequantizeLinear", [q, *self.params(base, p)], [out], self.fresh(f"{base}_DequantizeLinear"),
                 **axis)

    def qdq(self, src: str, out: str, base: str, p: QParams) -> None:
        """src (float) -> QuantizeLinear -> DequantizeLinear -> out."""
        q = self.fresh(f"{base}_quantized")
        axis = {} if p.axis is None else {"axis": p.axis}
        scale_zp = self.params(base, p)
        self.add("QuantizeLinear", [src, *scale_zp], [q], self.fresh(f"{base}_QuantizeLinear"), **axis)
        self.add("DequantizeLinear", [q, *scale_zp], [out], self.fresh(f"{base}_DequantizeLinear"), **axis)

    def emit_inputs(self) -> None:
        for value in self.model.graph.inputs:
            p = self.low.activations.get(id(value))
            if p is not None:
                deq = self.fresh(f"{value.name}_dequantized")
                self.qdq(value.name, deq, value.name, p)
                self.names[id(value)] = deq

    def emit_constant(self, value: Value) -> None:
        p = self.low.constants.get(id(value))
        if p is None:
            super().emit_constant(value)
            return
        ahead = self.ahead.pop(id(value), None)
        if self._refill is not None:
            self._refill()
        q = self.integer_const(f"{value.name}_quantized", integers(value, p) if ahead is None else ahead.result(), p.dtype)
        self.dequantize(q, value.name, value.name, p)

    def emit_node(self, node: Node) -> None:
        acts = self.low.activations
        if id(node) in self.low.folded or (node.op == "Quantize" and id(node.outputs[0]) in acts):
            y = node.outputs[0]
            self.qdq(self.name(node.inputs[0]), y.name, y.name, acts[id(y)])
            return
        raw = [self.fresh(f"{o.name}_float") if id(o) in acts else o.name for o in node.outputs]
        EXPORTERS[node.op](self, node, [self.name(v) for v in node.inputs], raw)
        for value, src in zip(node.outputs, raw):
            if id(value) in acts:
                self.qdq(src, value.name, value.name, acts[id(value)])


def float_islands(model: Model, low: Lowering) -> list[dict[str, str]]:
    """Nodes ONNX Runtime computes in float between DequantizeLinear and QuantizeLinear: every
    exported op outside ORT_INTEGER_OPS that reads or writes a quantized tensor (report lines)."""
    quantized = set(low.activations) | set(low.constants)
    out = []
    for node in model.graph.nodes:
        if node.op in ORT_INTEGER_OPS or id(node) in low.folded:
            continue
        if any(v is not None and id(v) in quantized for v in (*node.inputs, *node.outputs)):
            out.append({"node": node.name, "op": node.op, "reason": "onnxruntime computes it in float between "
                        "DequantizeLinear and QuantizeLinear (no integer kernel for this op)"})
    return out


def to_qdq(model: Model, storage: str = "ort", low: Lowering | None = None) -> tuple[Any, list[dict[str, str]]]:
    """The QDQ ModelProto and the report lines for tensors left in float (`low`: `plan(model, storage)`
    when the caller has it already)."""
    low = plan(model, storage) if low is None else low
    w = QdqWriter(model, low)
    w.emit_inputs()
    with w.quantizing_ahead():
        export_graph(w)
    proto = finish(w)
    entry = proto.metadata_props.add()
    entry.key, entry.value = "qcc.qdq_storage", storage
    return proto, low.fallbacks


@attrs.frozen
class QdqOptions:
    storage: Literal["ort", "ort-vnni", "annotated"] = attrs.field(
        default="ort", metadata={"help": "how int8 is written for the runtime (STORAGES), never the values"})


class OnnxQdqBackend(Backend):
    """ONNX with QuantizeLinear/DequantizeLinear pairs, fused by ONNX Runtime into integer kernels."""

    name = "onnx-qdq"
    extensions = ()  # .onnx with a quantizing scheme, or ask for it by name
    file_extensions = (".onnx",)
    Options = QdqOptions

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: every exported op, integer or float in ONNX Runtime."""
        return {"onnx-qdq": {op: "int" if op in ORT_INTEGER_OPS else "float" for op in EXPORTERS}}

    def runtime(self, out: str | os.PathLike[str], options: QdqOptions, model: Model | None = None) -> Runtime:
        """onnxruntime with graph optimizations on: the integer kernels the file is written for."""
        from qcc.runtimes.onnxruntime import QDQ, OrtRuntime

        return OrtRuntime(out, QDQ)

    def serialize(self, model: Model, out: str | os.PathLike[str], options: QdqOptions) -> WriteResult:
        """Write atomically; the tensors left in float are the report's float fallbacks."""
        low = plan(model, options.storage)
        islands = float_islands(model, low)  # before the export: what plan() says, as the report always had it
        proto, fallbacks = to_qdq(model, options.storage, low)
        atomic_write_bytes(out, proto.SerializeToString())
        return WriteResult(tuple(fallbacks), {"float_islands": islands} if islands else {})


BACKEND = OnnxQdqBackend()
