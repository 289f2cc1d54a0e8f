"""The `sensitivity` pass: per-layer SQNR, and mixed precision for the layers that need it.

1. Per layer (each node computing a quantized output: Conv, Dense, Add, AvgPool, ... and each
   graph input), the output SQNR of the model when only that layer's annotations (its outputs,
   and its weights and bias) are applied: the layer at fault is the one with the lowest. This
   runs the fake-quantizing interpreter (storage rounding, not a target's integer kernels).
2. With `max_layers` or `target_sqnr`, the most sensitive layers are promoted one by one (to 16
   bits or to float, `promote_to`), re-running the annotation pass that ran before this one
   (quantize-affine or assign-fixed-point, which honour the promotion like a user override;
   affine 16 bits: int16 activations and weights),
   and the whole model's output SQNR is measured (bit-exact integer kernels for an all fixed-point
   model). It stops when the target is met or the layers run out, and always leaves the model
   with the best output SQNR it saw, never a half-finished one (Neural Compressor #2261).

Results are in the report section `sensitivity` and, per layer output, `layer_sqnr_db`.
Data: the first `samples` calibration samples. The output SQNR is that of all graph outputs
together against the same model run in float.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Literal

import attrs
import numpy as np
from qcc.passes.quantutil import (
    annotation_pass,
    calibration_feeds,
    check_choices,
    inherits,
    is_bias_use,
    is_float,
    reannotate,
    sharing_classes,
    weight_uses,
)

from qcc.errors import QccError
from qcc.ir.core import Model, Value
from qcc.ir.types import Float32
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.pm.parallel import Workers
from qcc.sim.compare import compare, passthrough, quantized_runner
from qcc.sim.interpreter import Interpreter

SECTION = "sensitivity"


class LayerInterpreter(Interpreter):
    """Applies only the annotations of `active` values (Quantize nodes pass through otherwise)."""

    def __init__(self, model: Model, active: set[int], observer: Any = None) -> None:
        self.active = active
        super().__init__(model, quantized=True, observer=observer, kernels={"Quantize": passthrough})

    def _store(self, value: Value, array: np.ndarray) -> np.ndarray:
        return super()._store(value, array) if id(value) in self.active else array


def _positive(name: str) -> Any:
    def check(_: Any, attribute: Any, value: int) -> None:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return check


def _non_negative(_: Any, attribute: Any, value: int) -> None:
    if value < 0:
        raise ValueError(f"max_layers must be >= 0, got {value}")


@attrs.frozen
class Sensitivity(Pass):
    """Per-layer SQNR; optionally promote the most sensitive layers until a target SQNR."""

    name = "sensitivity"
    requires = ("calibrate",)

    samples: int = attrs.field(default=256, validator=_positive("samples"),
                               metadata={"help": "calibration samples to measure on"})
    batch_size: int = attrs.field(default=32, validator=_positive("batch_size"), metadata={"help": "batch"})
    max_layers: int = attrs.field(default=0, validator=_non_negative,
                                  metadata={"help": "layers to promote at most (0: none, or all with a target)"})
    target_sqnr: float | None = attrs.field(default=None, metadata={"help": "stop once output SQNR (dB) >= this"})
    promote_to: Literal["16", "float"] = attrs.field(default="16", metadata={"help": "16-bit or float"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        assign = annotation_pass(model, self.name)
        feeds, batch = calibration_feeds(model, ctx, self.name, self.samples, self.batch_size)
        layers = find_layers(model)
        scores = list(zip([name for name, _ in layers], layer_scores(model, layers, feeds, batch, ctx.progress, ctx.workers)))
        baseline = self._measure(model, feeds, batch)
        ranking = sorted(range(len(layers)), key=lambda i: _key(scores[i][1]))
        section: dict[str, Any] = {
            "layers": [{"layer": n, "sqnr_db": _round(s)} for n, s in scores],
            "baseline_output_sqnr_db": _round(baseline),
            "promote_to": self.promote_to,
        }
        limit = self.max_layers or (len(layers) if self.target_sqnr is not None else 0)
        best, chosen = baseline, list[int]()
        if limit:
            best, chosen = self._search(model, ctx, assign, layers, ranking[:limit], feeds, baseline, batch)
        section.update({"promoted": [layers[i][0] for i in chosen], "output_sqnr_db": _round(best),
                        "target_sqnr_db": self.target_sqnr,
                        "target_met": None if self.target_sqnr is None else _key(best) >= self.target_sqnr})
        ctx.report[SECTION] = section
        for (_, values), (_, score) in zip(layers, scores):
            for v in values:
                if not v.is_const:
                    v.meta.setdefault("report", {})["layer_sqnr_db"] = _round(score)
        return PassResult(model, bool(chosen), frozenset({"*"}))

    def _measure(self, model: Model, feeds: dict[str, np.ndarray], batch: int) -> float | None:
        return compare(model, model, feeds, batch_size=batch, tensors=False,
                       make_interpreter=quantized_runner).output_sqnr()

    def _search(self, model: Model, ctx: PassContext, assign: Pass, layers: list[tuple[str, list[Value]]],
                order: list[int], feeds: dict[str, np.ndarray], baseline: float | None,
                batch: int) -> tuple[float | None, list[int]]:
        """Greedy: promote the next most sensitive layer, re-annotate, measure; keep the best."""
        saved = save_annotations(model)
        scratch = attrs.evolve(ctx, report={})
        best, best_set = baseline, []
        promoted: list[int] = []
        for index in order:
            if self.target_sqnr is not None and _key(best) >= self.target_sqnr:
                break
            promoted.append(index)
            try:
                self._apply(model, assign, layers, promoted, saved, scratch)
            except QccError as exc:  # a promotion that breaks a user pin: skip that layer
                ctx.note(SECTION, f"layer {layers[index][0]!r} not promoted: {exc}")
                promoted.pop()
                continue
            score = self._measure(model, feeds, batch)
            if _key(score) > _key(best):
                best, best_set = score, list(promoted)
        self._apply(model, assign, layers, best_set, saved, ctx)
        return best, best_set

    def _apply(self, model: Model, assign: Pass, layers: list[tuple[str, list[Value]]], chosen: list[int],
               saved: dict[int, tuple[Value, Any, dict[str, Any]]], ctx: PassContext) -> None:
        promote(model, assign, layers, {i: self.promote_to for i in chosen}, saved, ctx)


def save_annotations(model: Model) -> dict[int, tuple[Value, Any, dict[str, Any]]]:
    """Every value's annotation and metadata, to promote from (promote restores them first)."""
    return {id(v): (v, v.quant, copy.copy(v.meta)) for v in model.graph.values()}


def promote(model: Model, assign: Pass, layers: list[tuple[str, list[Value]]], levels: dict[int, str],
            saved: dict[int, tuple[Value, Any, dict[str, Any]]], ctx: PassContext) -> None:
    """Annotations as saved, then layer i promoted to levels[i] ('16' or 'float'), re-annotated
    with every refinement (bias-correct) re-applied: always a finished model."""
    for value, quant, meta in saved.values():
        value.quant, value.meta = quant, copy.copy(meta)
    rules_for = getattr(assign, "rules_for", None)
    fixed = rules_for is not None  # a fixed-point assignment: promote widths, not dtypes
    one_type = rules_for(ctx).one_type_ops if rules_for is not None else frozenset()
    for index, level in levels.items():
        for v in promotion_set(model, layers[index][1], one_type):
            if v.meta.get("pinned"):
                continue
            if level == "float":
                v.quant = Float32()
                v.meta["pinned"] = True
                v.meta["float_reason"] = f"layer {layers[index][0]!r} kept in float (promoted)"
            elif fixed:
                v.meta["bits"] = 16
            elif not any(is_bias_use(n, i) for n, i in weight_uses(v)):  # activations and weights; a bias stays int32
                v.meta["affine_dtype"] = "int16"
    reannotate(model, ctx)


def layer_scores(model: Model, layers: list[tuple[str, list[Value]]], feeds: dict[str, np.ndarray],
                 batch_size: int, progress: bool = False, workers: Workers | None = None) -> list[float | None]:
    """Output SQNR of the model with only each layer's annotations applied (lowest: most sensitive).

    On `workers`, contiguous runs of layers are scored in parallel: each score is the same
    computation on the same data wherever it runs, so the ranking is identical."""
    from qcc.progress import progress_bar

    if workers is not None and workers.parallel and len(layers) > 1:
        slots = min(workers.slots(), len(layers))
        bounds = [len(layers) * i // slots for i in range(slots + 1)]
        job = _LayerScores(model, layers, feeds, batch_size)
        parts = workers.map(job, [range(a, b) for a, b in itertools.pairwise(bounds)])
        return [score for part in parts for score in part]
    scores: list[float | None] = []
    with progress_bar(len(layers), "sensitivity", progress, unit="layer") as bar:
        for _, values in layers:
            scores.append(_layer_score(model, values, feeds, batch_size))
            if bar:
                bar(1)
    return scores


@attrs.frozen(eq=False)
class _LayerScores:
    """Scores of a range of layers (what one worker computes; pickled whole for a cluster, so the
    layers' values stay those of the model it carries)."""

    model: Model
    layers: list[tuple[str, list[Value]]]
    feeds: dict[str, np.ndarray]
    batch_size: int

    def __call__(self, indices: range) -> list[float | None]:
        return [_layer_score(self.model, self.layers[i][1], self.feeds, self.batch_size) for i in indices]


def _layer_score(model: Model, values: list[Value], feeds: dict[str, np.ndarray], batch_size: int) -> float | None:
    """At one BLAS thread wherever it runs: OpenBLAS's sums depend on its thread count, and a
    worker's score must be this process's (`qcc.sim.split.one_blas_thread`)."""
    from qcc.sim.split import one_blas_thread

    active = {id(v) for v in values}

    def only_layer(m: Model, obs: Any) -> LayerInterpreter:
        return LayerInterpreter(m, active, obs)

    with one_blas_thread():
        return compare(model, model, feeds, batch_size=batch_size, tensors=False,
                       make_interpreter=only_layer).output_sqnr()


def sensitivity_order(scores: list[float | None]) -> list[int]:
    """Layer indices, most sensitive (lowest SQNR) first."""
    return sorted(range(len(scores)), key=lambda i: _key(scores[i]))


def find_layers(model: Model) -> list[tuple[str, list[Value]]]:
    """(layer name, annotated values) per graph input and per non-inheriting node."""
    graph = model.graph
    layers = [(v.name, [v]) for v in graph.inputs if v.quant is not None]
    for node in graph.nodes:
        if inherits(node) or node.op == "Quantize":
            continue
        values = [v for v in node.outputs if v.quant is not None and is_float(v)]
        values += [v for v in node.inputs if v is not None and v.is_const and v.quant is not None]
        if any(not v.is_const for v in values):
            layers.append((node.name, values))
    return layers


def promotion_set(model: Model, values: list[Value], one_type_ops: frozenset[str] = frozenset()) -> list[Value]:
    """A layer's values plus those sharing their annotation, and the input of a `one_type_ops`
    layer (a target rule: nnabla-c-runtime runs x, W, b, y of a Convolution in one type)."""
    graph = model.graph
    floats = [v for v in graph.values() if is_float(v)]
    classes = sharing_classes(graph, floats)
    wanted = {classes.find(v) for v in values}
    out = [v for v in floats if classes.find(v) in wanted]
    ids = {id(v) for v in values}
    for node in graph.nodes:
        if node.op in one_type_ops and any(id(o) in ids for o in node.outputs):
            out.append(node.input(0))
    return out


def _key(sqnr: float | None) -> float:
    return float("inf") if sqnr is None else sqnr


def _round(sqnr: float | None) -> float | None:
    return None if sqnr is None else round(sqnr, 3)
