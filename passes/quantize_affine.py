"""The `quantize-affine` pass: int8/uint8 annotations from calibration statistics (ONNX QDQ).

- Activations (graph inputs, node outputs): per tensor, range by `method` on the histogram,
  scale/zero point exactly as ONNX Runtime computes them (qcc.quant.affine). Values that carry
  one annotation (views, Relu, MaxPool, a Concat output and the inputs only it reads) share the
  union of their ranges; a Concat input read elsewhere too keeps its own range, as ONNX
  Runtime's QLinearConcat rescales each input (DenseNet: an early layer's output is not
  quantized at the range of the whole block's last Concat). A tensor read only by Relu takes
  its range from the Relu's output (its negative half is zeroed anyway: ONNX Runtime's
  Conv+Relu fusion does the same).
- Weights (input 1 of Conv/ConvTranspose/Dense): per channel on the output-channel axis or per
  tensor, symmetric by default; `weight_bits=7` is ORT's reduce_range (AVX2 without VNNI
  saturates full 8-bit weights, docs/quantization.md).
- Bias: int32, scale = s_x * s_w, zero point 0 (per channel when the weight is). Where a bias
  would not fit (a channel whose weights are all near zero but whose bias is not: PP-OCR's
  detector and recognizer), the weight's scale of that channel grows until |b| / (s_x * s_w)
  is at most 2**30, as onnxruntime's quantize_static does (to the full int32 there; qcc keeps
  half the accumulator for the products, so target c's int32 sums cannot overflow).
- Other constants feeding arithmetic: per tensor from their exact min/max. BatchNorm
  parameters (a BatchNorm fold-bn could neither fold nor, with standalone=conv as in the
  default per-channel pipelines, turn into a depthwise Conv) stay float, with the reason recorded.

Pinned values (apply-overrides) keep their annotation; INT8/UINT8/INT16 overrides choose the
dtype. Constant tensors get the documented zero-range rule of qcc.quant.ranges.
"""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np
from qcc.passes.quantreport import activation_entry, parameter_entry, positive_part, without_zeros
from qcc.passes.quantutil import (
    RangeMethod,
    activations_option,
    bias_of,
    check_choices,
    is_bias_use,
    is_float,
    is_param,
    is_weight_use,
    keep_unmarked_float,
    param_data,
    percentile_option,
    pinned,
    relu_only,
    set_float,
    sharing_classes,
    start_annotation,
    weight_axis,
    weight_uses,
)
from qcc.passes.statistics import Calibration

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.types import Affine, FixedPoint, QuantType
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.quant.affine import affine_params, weight_affine_params
from qcc.quant.ranges import auto, choose_range
from qcc.quant.stats import TensorStats


@attrs.frozen
class QuantizeAffine(Pass):
    """Affine int8/uint8 annotations: activations per tensor, weights per channel, int32 bias."""

    name = "quantize-affine"
    requires = ("calibrate",)

    dtype: Literal["int8", "uint8"] = attrs.field(default="int8", metadata={"help": "activation dtype"})
    weight_dtype: Literal["int8", "uint8", "int4", "uint4"] = attrs.field(
        default="int8", metadata={"help": "weight dtype (int4/uint4: W4A8)"})
    per_channel: bool = attrs.field(default=True, metadata={"help": "per-output-channel weight scales"})
    symmetric: bool = attrs.field(default=False, metadata={"help": "symmetric activation ranges"})
    weight_symmetric: bool = attrs.field(default=True, metadata={"help": "symmetric weight ranges"})
    method: RangeMethod = attrs.field(default="minmax", metadata={"help": "activation range estimator"})
    percentile: float = percentile_option()
    weight_bits: Literal[8, 7] = attrs.field(default=8, metadata={"help": "7 = ORT reduce_range"})
    activations: Literal["all", "marked"] = activations_option()

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        calib = start_annotation(model, ctx, self)
        graph = model.graph
        acts = [v for v in graph.values() if is_float(v) and not is_param(v) and not pinned(v)]
        if not ctx.target.integer_affine:  # float tensors between QDQ pairs run as written
            kept = set(map(id, keep_root_inputs_float(acts)))
            acts = [v for v in acts if id(v) not in kept]
        if self.activations == "marked":
            keep_unmarked_float(acts)
            acts = [v for v in acts if v.quant is None]
        same = lambda a, b: a.meta.get("affine_dtype") == b.meta.get("affine_dtype")  # noqa: E731
        for members in sharing_classes(graph, acts, same, concat_requantizes=True).classes():
            self._annotate_class(members, calib, graph)
        params = [v for v in graph.values() if is_float(v) and is_param(v) and not pinned(v)]
        for value in params:
            self._annotate_param(value)
        for node in graph.nodes:
            if bias_of(node) is not None:
                annotate_bias(node)
        for value in params:
            _copy_from_quantize(value)
        return PassResult(model, True, frozenset({"*"}))

    # ------------------------------------------------------------------ activations
    def _range(self, stats: TensorStats, dtype: str) -> tuple[float, float, str]:
        """(lo, hi, what chose it): `auto` names its pick per tensor (minmax or mse)."""
        if self.method == "auto":
            (lo, hi), choice = auto(stats, dtype=dtype, symmetric=self.symmetric)
            return lo, hi, choice
        if self.method == "percentile":
            return (*choose_range(stats, "percentile", pct=self.percentile), "percentile")
        if self.method == "mse":
            return (*choose_range(stats, "mse", dtype=dtype, symmetric=self.symmetric), "mse")
        if self.method == "entropy":
            return (*choose_range(without_zeros(stats), "entropy", dtype=dtype, symmetric=self.symmetric), "entropy")
        return (*choose_range(stats, self.method), self.method)

    def _annotate_class(self, members: list[Value], calib: Calibration, graph: Graph) -> None:
        dtype = members[0].meta.get("affine_dtype") or self.dtype
        ranges = [self._range(positive_part(st) if relu_only(m, graph) else st, dtype)
                  for m in members if (st := calib.get(m.name)) is not None and st.count]
        if not ranges:
            for m in members:
                set_float(m, "no calibration statistics (the value was never computed)")
            return
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        scale, zp = affine_params(lo, hi, dtype, self.symmetric, name=members[0].name)
        quant = Affine((scale,), (zp,), dtype)
        chosen = sorted({r[2] for r in ranges})
        for m in members:
            m.quant = quant
            m.meta["report"] = activation_entry(calib.get(m.name), quant, self.method,
                                                relu_only=relu_only(m, graph))
            if self.method == "auto":
                m.meta["report"]["chosen"] = "+".join(chosen)

    # ------------------------------------------------------------------ parameters
    def _annotate_param(self, value: Value) -> None:
        data = param_data(value)
        assert data is not None
        uses = value.uses()
        if value.is_const and uses and all(n.op == "Quantize" for n, _ in uses):
            return  # annotated like the Quantize output it feeds (_copy_from_quantize)
        weights = [(n, i) for n, i in weight_uses(value) if is_weight_use(n, i)]
        if weights and len(weights) == len(uses):
            axes = {weight_axis(n) for n, _ in weights}
            axis = axes.pop() if self.per_channel and len(axes) == 1 and data.ndim > 1 else None
            dtype = value.meta.get("affine_dtype") or self.weight_dtype
            scales, zps = weight_affine_params(data, axis, dtype, self.weight_symmetric,
                                               reduce_range=self.weight_bits == 7, name=value.name)
            value.quant = Affine(tuple(float(s) for s in np.atleast_1d(scales)),
                                 tuple(int(z) for z in np.atleast_1d(zps)), dtype, axis)
            value.meta["report"] = parameter_entry(data, value.quant)
            return
        if any(is_bias_use(n, i) for n, i in weight_uses(value)):
            return  # biases: after their inputs and weights (annotate_bias)
        other = [n for n, _ in uses if not get_schema(n.op).has("quantizes_constants")]
        if other:
            set_float(value, f"parameter of {other[0].op} {other[0].name!r}"
                      + (" (not folded by fold-bn; fold-bn{standalone=conv} would make it an integer Conv)"
                         if other[0].op == "BatchNorm" else ""))
            return
        dtype = value.meta.get("affine_dtype") or self.dtype
        lo, hi = (float(data.min()), float(data.max())) if data.size else (0.0, 0.0)
        scale, zp = affine_params(lo, hi, dtype, self.symmetric, name=value.name)
        value.quant = Affine((scale,), (zp,), dtype)
        value.meta["report"] = parameter_entry(data, value.quant)


SQRT_REASON = ("read by Sqrt: an int8 step at the bottom of its range becomes sqrt(step) at its output "
               "(a magnitude's small bins are lost), so it stays float up to the linear values it squares")


def keep_root_inputs_float(acts: list[Value]) -> list[Value]:
    """The input of each Sqrt, and back through the elementwise ops that only compute it (an STFT
    magnitude's re^2 + im^2, a variance plus eps), kept float with a report line; the linear
    values they start from stay quantized. Only where float tensors can run between quantized
    ones (QDQ): an integer-only target (C affine) keeps every activation int8."""
    candidates = {id(v) for v in acts}
    kept: list[Value] = []
    todo = [n.inputs[0] for v in acts for n, _ in v.uses() if n.op == "Sqrt" and n.inputs[0] is v]
    while todo:
        value = todo.pop()
        if id(value) not in candidates or any(k is value for k in kept):
            continue
        set_float(value, SQRT_REASON)
        kept.append(value)
        producer = value.producer()
        if (producer is not None and get_schema(producer.op).has("elementwise") and len(value.uses()) == 1
                and not _squares(producer)):
            todo += [v for v in producer.inputs if v is not None and not v.is_const]
    return kept


def _squares(node: Node) -> bool:
    """x ** 2 or x * x: its input is the linear value, which int8 holds well."""
    return node.op == "Pow" or (node.op == "Mul" and len(node.inputs) == 2 and node.inputs[0] is node.inputs[1])


def scales_of(quant: QuantType | None) -> np.ndarray | None:
    """Per-channel (or one) scale of an affine or fixed-point annotation."""
    if isinstance(quant, Affine):
        return np.asarray(quant.scale, dtype=np.float64)
    if isinstance(quant, FixedPoint):
        return np.asarray([2.0 ** -quant.frac])
    return None


def annotate_bias(node: Node) -> None:
    """int32 at s_x * s_w (per weight channel), zero point 0: how integer kernels add a bias."""
    bias = bias_of(node)
    assert bias is not None
    if pinned(bias) or not is_float(bias) or bias.quant is not None:
        return
    data = param_data(bias)
    if data is None:
        return
    sx, sw = scales_of(node.input(0).quant), scales_of(node.input(1).quant)
    if sx is None or sw is None or len(sx) != 1:
        missing = node.input(0) if sx is None or len(sx) != 1 else node.input(1)
        set_float(bias, f"{missing.name!r} ({'input' if missing is node.inputs[0] else 'weight'} of "
                  f"{node.op} {node.name!r}) is not quantized per tensor: no int32 bias scale")
        return
    sw = _fit_bias(node, data, sx[0], sw)
    scale = np.maximum(sx[0] * sw, float(np.finfo(np.float32).tiny)).astype(np.float32)
    if len(scale) not in (1, data.shape[0]):
        set_float(bias, f"bias of {node.name!r}: {len(scale)} weight scales for {data.shape[0]} channels")
        return
    axis = 0 if len(scale) > 1 else None
    bias.quant = Affine(tuple(float(s) for s in scale), (0,) * len(scale), "int32", axis)
    bias.meta["report"] = parameter_entry(data, bias.quant)


BIAS_LIMIT = 2.0**30
"""The largest |bias| on the accumulator scale: int32 sums keep half their range for the products."""


def _fit_bias(node: Node, bias: np.ndarray, sx: float, sw: np.ndarray) -> np.ndarray:
    """The weight scales, raised where the bias would exceed BIAS_LIMIT on the scale sx * sw (the
    weight's annotation follows; a weight read by other nodes too is left alone)."""
    weight = node.input(1)
    need = np.abs(bias.astype(np.float64)).reshape(-1) / (sx * BIAS_LIMIT) * 1.0001
    if len(sw) == 1:
        need = np.array([need.max(initial=0.0)])
    if len(need) != len(sw) or np.all(sw >= need) or not isinstance(weight.quant, Affine) \
            or len(weight.uses()) != 1 or pinned(weight):
        return sw
    fitted = np.maximum(sw, need)
    weight.quant = attrs.evolve(weight.quant, scale=tuple(float(s) for s in fitted))
    data = param_data(weight)
    if data is not None:
        weight.meta["report"] = parameter_entry(data, weight.quant)
    return fitted


def _copy_from_quantize(value: Value) -> None:
    """A constant read only through Quantize nodes carries their annotation (insert-quantize weights)."""
    uses = value.uses()
    if value.is_const and uses and all(n.op == "Quantize" for n, _ in uses) and value.quant is None:
        value.quant = uses[0][0].outputs[0].quant
        if value.quant is not None and value.const is not None:
            value.meta["report"] = parameter_entry(value.const, value.quant)
