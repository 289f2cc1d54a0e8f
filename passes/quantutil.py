"""What the quantization passes share: tensor roles, sharing classes, calibration access.

Not a pass. The roles and the classes are the conventions of docs/quantized-ir.md turned into
code, so `quantize-affine`, `assign-fixed-point` and `sensitivity` cannot disagree on which
tensor is a weight, which bias belongs to which output, or which values share an annotation.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import attrs
import numpy as np

from qcc.errors import InternalError, InvalidInputError, UsageError
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.types import Sign
from qcc.pm.base import PassContext


def canonical_op(name: str) -> str:
    """An IR op name, accepting nnabla's function names (seed 000 says ReLU/AveragePooling/Affine).

    An IR name wins where both exist (IR `Max` is nnabla's Maximum2; nnabla's `Max` is ReduceMax).
    """
    from qcc.formats.nnabla_functions import ir_op
    from qcc.ir.registry import has_op

    op = name if has_op(name) else ir_op(name)
    if op is None or not has_op(op):
        raise ValueError(f"unknown op type {name!r}")
    return op


def is_float(value: Value) -> bool:
    return value.type.dtype in ("float32", "float64", "float16")


def is_view(node: Node) -> bool:
    return get_schema(node.op).has("view")


def inherits(node: Node) -> bool:
    """Whether the node's outputs carry its (first) input's annotation (registry trait)."""
    return get_schema(node.op).has("keeps_annotation")


def param_data(value: Value) -> np.ndarray | None:
    """The exact values of a parameter: a constant, or a Quantize/view of one."""
    seen = 0
    while value.const is None:
        producer = value.producer()
        if producer is None or seen > 8 or not (producer.op == "Quantize" or is_view(producer)):
            return None
        value = producer.input(0)
        seen += 1
    return value.const


def is_param(value: Value) -> bool:
    return param_data(value) is not None


def weight_uses(value: Value) -> list[tuple[Node, int]]:
    """(node, input index) where the value is the weight (1) or bias (2) of a weighted op.

    The roles come from the op registry; callers test the index against the node's schema
    (`is_weight_use` / `is_bias_use`), never against op names.
    """
    return [(n, i) for n, i in value.uses() if get_schema(n.op).role(i).kind in ("weight", "bias")]


def is_weight_use(node: Node, index: int) -> bool:
    return get_schema(node.op).role(index).kind == "weight"


def is_bias_use(node: Node, index: int) -> bool:
    return get_schema(node.op).role(index).kind == "bias"


def has_weight(node: Node) -> bool:
    return get_schema(node.op).weight_input is not None


def bias_of(node: Node) -> Value | None:
    """The node's bias input, if its op has one and it is connected."""
    index = get_schema(node.op).bias_input
    return node.inputs[index] if index is not None and index < len(node.inputs) else None


def weight_axis(node: Node) -> int:
    """The output-channel axis of the node's weight (a registry role)."""
    axis = get_schema(node.op).weight_axis
    if axis is None:
        raise ValueError(f"{node.op} has no weight input")
    return axis


def clamp_bounds(node: Node) -> tuple[float | None, float | None] | None:
    """(lower, upper) of a clamping op (the registry's `clamp` trait: Relu (0, None), Relu6 = Clip
    (0, 6)); None for any other op.

    A clamp with lower bound 0 commutes with a positive per-channel scale as long as the upper
    bound is never reached, which is what cross-layer equalization needs to know.
    """
    schema = get_schema(node.op)
    if not schema.has("clamp") or schema.bounds is None:
        return None
    return schema.bounds(node.attrs)


def folds_channels(node: Node) -> bool:
    """A weighted layer that gathers its inputs (Conv, Dense: not a `scatters` op) with a constant,
    unshared weight and bias: per-channel maps fold into it on both sides (passes/channel_fold.py
    reads the layouts from the weight's role)."""
    schema = get_schema(node.op)
    index = schema.weight_input
    if index is None or schema.has("scatters") or len(node.inputs) <= index or node.inputs[index] is None:
        return False
    params = [v for v in (node.inputs[index], bias_of(node)) if v is not None]
    return all(v.const is not None and len(v.uses()) == 1 and not isinstance(v.quant, Sign)
               and not v.meta.get("pinned") for v in params)


def commutes_with_channel_scale(node: Node) -> bool:
    """f(x * s) == f(x) * s for a positive per-channel s on axis 1, channel c staying channel c:
    pooling (the `channel_pool` trait), and views of an (N, C, 1, ...) tensor to (N, C)."""
    if get_schema(node.op).has("channel_pool"):
        return True
    if not is_view(node) or not node.inputs or node.inputs[0] is None:
        return False
    src, dst = node.input(0).type.shape, node.outputs[0].type.shape
    return (len(src) >= 2 and len(dst) >= 2 and src[1] == dst[1]
            and all(d == 1 for d in (*src[2:], *dst[2:])))


def check_finite_params(model: Model) -> None:
    """NaN/Inf in a parameter would give NaN ranges downstream: refuse up front, naming it."""
    for value in model.graph.constants:
        data = value.const
        if data is not None and data.dtype.kind == "f" and not np.isfinite(data).all():
            bad = int(np.count_nonzero(~np.isfinite(data)))
            raise InvalidInputError(f"parameter {value.name!r} contains {bad} NaN/Inf value(s)")


def relu_only(value: Value, graph: Graph) -> bool:
    """Consumed only by Relu (not a graph output): its negative half never matters."""
    users = value.consumers()
    return bool(users) and all(n.op == "Relu" for n in users) and not any(v is value for v in graph.outputs)


class UnionFind:
    """Classes of values that must share an annotation, keyed by value identity."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.values: dict[int, Value] = {}

    def add(self, value: Value) -> None:
        if id(value) not in self.parent:
            self.parent[id(value)] = id(value)
            self.values[id(value)] = value

    def find(self, value: Value) -> int:
        self.add(value)
        key = id(value)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: Value, b: Value) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def classes(self) -> list[list[Value]]:
        groups: dict[int, list[Value]] = {}
        for value in self.values.values():
            groups.setdefault(self.find(value), []).append(value)
        return list(groups.values())


def sharing_classes(graph: Graph, candidates: Iterable[Value],
                    same: Callable[[Value, Value], bool] = lambda a, b: True,
                    shared_inputs: frozenset[str] = frozenset(), concat_requantizes: bool = False) -> UnionFind:
    """Union values that carry one annotation: inherit-op inputs/outputs, Concat inputs, and the
    two inputs of `shared_inputs` ops (a target rule: nnabla-c-runtime's in-place Add2/Sub2);
    `same(a, b)` can veto a link (e.g. different widths).

    concat_requantizes: the runtime's Concat rescales each input (ONNX Runtime's QLinearConcat),
    so only an input that nothing else reads joins the output's class; one read elsewhere keeps
    its own range (DenseNet: an early block output is not quantized at the block's final range).
    """
    uf = UnionFind()
    wanted = {id(v) for v in candidates}
    for value in graph.values():
        if id(value) in wanted:
            uf.add(value)

    def link(a: Value | None, b: Value | None) -> None:
        if a is not None and b is not None and id(a) in wanted and id(b) in wanted and same(a, b):
            uf.union(a, b)

    for node in graph.nodes:
        if node.op == "Concat":
            for other in node.inputs:
                if not concat_requantizes or _sole_reader(graph, other, node):
                    link(node.outputs[0], other)
        elif inherits(node) and node.inputs:
            for out in node.outputs:
                link(node.inputs[0], out)
        elif node.op in shared_inputs and len(node.inputs) == 2:
            link(node.inputs[0], node.inputs[1])
    return uf


def _sole_reader(graph: Graph, value: Value | None, node: Node) -> bool:
    """node is the only reader of value, which is not a graph output."""
    return value is not None and all(n is node for n in value.consumers()) and not any(
        v is value for v in graph.outputs)


def calibration(ctx: PassContext, model: Model, who: str) -> Any:
    """The statistics `calibrate` computed for this graph, or a usage error naming the pass that needs them."""
    from qcc.passes.statistics import CalibrationStats

    return ctx.analyses.get(CalibrationStats(who), model)


def annotation_pass(model: Model, who: str) -> Any:
    """The annotation pass that ran last on the model, or a usage error naming the pass that needs it."""
    last = model.products.get(LastAnnotation)
    if last is None:
        raise UsageError(f"pass {who!r} needs an annotation pass before it (quantize-affine or assign-fixed-point)")
    return last.annotation_pass


def calibration_data(ctx: PassContext, who: str, samples: int | None = None,
                     model: Model | None = None) -> dict[str, Any]:
    """--calib's arrays (the first `samples` of a Python stream), or a usage error naming the
    pass that needs them."""
    if ctx.calib_data is None:
        raise UsageError(f"pass {who!r} needs calibration data (--calib DATA.npz)")
    if isinstance(ctx.calib_data, dict):
        return ctx.calib_data
    if samples is None:
        raise InternalError(f"pass {who!r} reads a calibration stream without a sample count")
    return ctx.calib_data.take(samples, model)


def calibration_feeds(model: Model, ctx: PassContext, who: str, samples: int,
                      batch_size: int) -> tuple[dict[str, np.ndarray], int]:
    """The first `samples` calibration samples bound to the model's inputs, and the batch to run
    them in (a static batch dimension, e.g. torchvision exports' 1, wins as in calibrate)."""
    from qcc.data import batching, bind_inputs

    feeds, _ = bind_inputs(model, dict(calibration_data(ctx, who, samples, model)), ctx.calib_name)
    count = min(samples, len(next(iter(feeds.values()))) if feeds else 0)
    batch, count = batching(model, count, batch_size, ctx.calib_name, f"pass {who!r}")
    return {k: v[:count] for k, v in feeds.items()}, batch


def start_annotation(model: Model, ctx: PassContext, annotation_pass: Any) -> Any:
    """Common start of quantize-affine / assign-fixed-point: their statistics, finite parameters,
    previous (non-pinned) decisions forgotten, and the pass recorded for `sensitivity`."""
    calib = calibration(ctx, model, annotation_pass.name)
    check_finite_params(model)
    model.products.put(LastAnnotation(annotation_pass))
    for value in model.graph.values():
        clear_decision(value)
    return calib


@attrs.frozen
class LastAnnotation:
    """The annotation pass (with its options) that ran last on the model: `sensitivity` and
    `accuracy-control` re-run it with some layers promoted."""

    annotation_pass: Any


@attrs.frozen
class Refinements:
    """Passes that adjusted the parameters of the annotated model (bias-correct), in pipeline
    order: undone before the annotation pass runs again and re-applied after it (`reannotate`),
    each through its `undo(model)` and `run(model, ctx)`."""

    passes: tuple[Any, ...] = ()


def calibration_batches(model: Model, ctx: PassContext, samples: int, batch_size: int,
                        input_values: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The first `samples` calibration samples in batches (a static batch dimension wins; a
    remainder it cannot hold is dropped); fewer when they hold more than `input_values` input
    values in all (`qcc.quant.samples.sample_count`)."""
    from qcc.data import bind_inputs, cut_batches
    from qcc.quant.samples import sample_count, values_per_sample

    if ctx.calib_data is None:
        return
    feeds, _ = bind_inputs(model, dict(calibration_data(ctx, "calibration", samples, model)),
                          ctx.calib_name)
    if input_values is not None:
        samples = sample_count(samples, values_per_sample(feeds), input_values)
    first = {k: v[:samples] for k, v in feeds.items()}
    for batch, _ in cut_batches(model, first, None, ctx.calib_name, batch_size, "post-training calibration"):
        yield batch


def register_refinement(model: Model, refinement: Any) -> None:
    """Record a pass that refines the annotated model, once per name, in pipeline order."""
    known = model.products.get(Refinements) or Refinements()
    model.products.put(Refinements((*(p for p in known.passes if p.name != refinement.name), refinement)))


def reannotate(model: Model, ctx: PassContext) -> None:
    """Run the annotation pass again (it honours changed width/dtype requests), with every
    refinement undone before and re-applied after, so the model is never half-finished."""
    refinements = (model.products.get(Refinements) or Refinements()).passes
    for refinement in reversed(refinements):
        refinement.undo(model)
    annotation_pass(model, "reannotate").run(model, ctx)
    for refinement in refinements:
        refinement.run(model, ctx)


ORIGINAL_KEYS = ("weight_before_rounding", "bias_before_rounding", "bias_before_correction")
"""value.meta keys where refinements keep a parameter's float values from before they changed it."""


@contextlib.contextmanager
def original_parameters(model: Model) -> Iterator[None]:
    """The parameters as the float model had them (before bias-correct / learned-rounding), for a
    float reference run; the refined ones are back afterwards."""
    swapped = []
    for value in model.graph.constants:
        original = recorded_original(value)
        if original is not None:
            swapped.append((value, value.const))
            value.const = original
    try:
        yield
    finally:
        for value, const in swapped:
            value.const = const


def recorded_original(value: Value) -> np.ndarray | None:
    """The float values a refinement recorded before it changed this parameter (ORIGINAL_KEYS), if any."""
    return next((value.meta[key] for key in ORIGINAL_KEYS if key in value.meta), None)


def keep_unmarked_float(values: Iterable[Value]) -> None:
    """activations=marked: every activation that is not a Quantize output stays float."""
    for v in values:
        producer = v.producer()
        if not pinned(v) and not is_param(v) and (producer is None or producer.op != "Quantize"):
            set_float(v, "not marked by insert-quantize (activations=marked)")


def match_globs(patterns: Iterable[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def node_selected(node: Node, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """Node-name filter shared by the passes: include (empty = all) minus exclude."""
    if include and not match_globs(include, node.name):
        return False
    return not match_globs(exclude, node.name)


def note_once(ctx: PassContext, section: str, entry: Any) -> None:
    """ctx.note, but annotation passes are re-run by `sensitivity`: no duplicate lines."""
    if entry not in ctx.report.get(section, []):
        ctx.note(section, entry)


def set_float(value: Value, reason: str) -> None:
    """Decide to keep a value in float, recording why (the report's float_fallbacks)."""
    from qcc.ir.types import Float32

    value.quant = Float32()
    value.meta["float_reason"] = reason
    value.meta.pop("report", None)


def clear_decision(value: Value) -> None:
    """Forget a previous pass's annotation (not a user's pin) before deciding again."""
    if value.meta.get("pinned"):
        return
    value.quant = None
    for key in ("float_reason", "report"):
        value.meta.pop(key, None)


def check_choices(options: Any) -> None:
    """Literal-typed options hold one of their choices (the spec parser checks strings; this
    checks Python callers too). Call from __attrs_post_init__."""
    import typing

    hints = typing.get_type_hints(type(options))
    for field in attrs.fields(type(options)):
        value = getattr(options, field.name)
        hint = hints.get(field.name)
        args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
            typing.Union, getattr(__import__("types"), "UnionType", typing.Union)) else [hint]
        choices = [c for a in args if typing.get_origin(a) is typing.Literal for c in typing.get_args(a)]
        if choices and value not in choices and not (value is None and type(None) in typing.get_args(hint)):
            raise ValueError(f"option {field.name} must be one of {'|'.join(map(str, choices))}, not {value!r}")


RangeMethod = Literal["minmax", "percentile", "entropy", "mse", "auto"]
"""The --method choices, shared by quantize-affine and assign-fixed-point."""


def _percent(_: object, attribute: object, value: float) -> None:
    if not 0.0 < value <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], got {value}")


def at_least(minimum: float) -> Callable[[Any, Any, float], None]:
    """attrs validator: the option is >= minimum (the passes' sample counts, iterations, rates)."""
    def check(_: Any, attribute: Any, value: float) -> None:
        if not value >= minimum:
            raise ValueError(f"{attribute.name} must be >= {minimum:g}, got {value}")
    return check


def percentile_option() -> Any:
    return attrs.field(default=99.99, validator=_percent, metadata={"help": "for method=percentile"})


def activations_option() -> Any:
    return attrs.field(default="all", metadata={"help": "all activations, or only Quantize outputs"})


def pinned(value: Value) -> bool:
    return bool(value.meta.get("pinned")) and value.quant is not None
