"""The `accuracy-control` pass: promote the most sensitive layers until the accuracy drop is met.

Like NNCF's quantize_with_accuracy_control, with qcc's sensitivity ranking: the metric (top-1
on labelled `--eval` data, or a callable given to `qcc.compile(..., metric=...)`) is measured
on the float model and on the quantized one as `run_model(quantized=True)` runs it. While the
drop exceeds `max_drop`, the next most sensitive layer (lowest output SQNR with only its own
annotations applied, passes/sensitivity.py) is promoted to 16 bits; when every layer is at 16
bits, layers go to float in the same order. Each step re-runs the annotation pass and the
refinements after it (bias-correct), so every model measured is a finished one; the pass ends
with the first configuration that meets the target, or the best one it measured, never with a
half-applied step (Neural Compressor #2261). The data it tunes on is the data it reports on:
keep a separate test set for a final, unbiased number.

Report section `accuracy_control`: the metric, float and quantized values before and after,
the drop, whether it was met, every promotion (layer, to), and how many evaluations it took.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
from qcc.passes.quantutil import (
    annotation_pass,
    at_least,
    calibration_data,
    calibration_feeds,
    original_parameters,
)
from qcc.passes.sensitivity import (
    find_layers,
    layer_scores,
    promote,
    save_annotations,
    sensitivity_order,
)

from qcc.errors import QccError, UsageError
from qcc.ir.core import Model
from qcc.pm.base import Pass, PassContext, PassResult

SECTION = "accuracy_control"
STAGES = ("16", "float")

Predict = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Metric = Callable[[Predict], float]
"""A user metric: called with a function that runs the model on feeds (arrays by input name)
and returns its outputs by name; returns a score, higher is better (e.g. top-1 accuracy)."""


@attrs.frozen
class AccuracyControl(Pass):
    """Promote the most sensitive layers (16-bit, then float) until the metric drop is at most max_drop."""

    name = "accuracy-control"
    requires = ("calibrate",)

    max_drop: float = attrs.field(default=0.01, validator=at_least(0),
                                  metadata={"help": "largest allowed metric drop (0.01: one point of top-1)"})
    samples: int = attrs.field(default=128, validator=at_least(1),
                               metadata={"help": "calibration samples for the sensitivity ranking"})
    batch_size: int = attrs.field(default=64, validator=at_least(1), metadata={"help": "batch"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        assign = annotation_pass(model, self.name)
        if ctx.calib_data is None:  # refused before the first measurement
            calibration_data(ctx, self.name)
        measure, what = self._metric(model, ctx)
        with original_parameters(model):
            reference = measure(False)
        start = measure(True)
        section: dict[str, Any] = {"metric": what, "max_drop": self.max_drop, "float": reference,
                                   "quantized_before": start}
        evaluations, promoted = 2, dict[int, str]()
        score = start
        layers = find_layers(model)
        if reference - start > self.max_drop and layers:
            feeds, batch = calibration_feeds(model, ctx, self.name, self.samples, self.batch_size)
            order = sensitivity_order(layer_scores(model, layers, feeds, batch, ctx.progress, ctx.workers))
            saved = save_annotations(model)
            scratch = attrs.evolve(ctx, report={})
            best, best_levels = start, dict[int, str]()
            for levels, notes, current in self._search(model, ctx, assign, layers, order, saved, scratch, measure):
                for note in notes:
                    ctx.note(SECTION + "_notes", note)
                if levels is None:
                    continue
                evaluations += 1
                if current > best:
                    best, best_levels = current, dict(levels)
                if reference - current <= self.max_drop:
                    best, best_levels = current, dict(levels)
                    break
            promoted = best_levels
            promote(model, assign, layers, promoted, saved, ctx)
            score = best
        section.update({"quantized_after": score, "drop": reference - score, "met": reference - score <= self.max_drop,
                        "promoted": [{"layer": layers[i][0], "to": level} for i, level in promoted.items()],
                        "evaluations": evaluations})
        ctx.report[SECTION] = section
        return PassResult(model, bool(promoted), frozenset({"*"}))

    def _search(self, model: Model, ctx: PassContext, assign: Pass, layers: list[Any], order: list[int],
                saved: Any, scratch: PassContext, measure: Callable[[bool], float]) -> Iterator[
                    tuple[dict[int, str] | None, list[str], float]]:
        """(levels, notes, metric) of each configuration in the order the greedy search tries
        them (every layer to 16 bits in ranking order, then to float; a promotion that breaks a
        user pin is left out with a note); the caller stops at the first that meets the target.

        The configurations do not depend on the measurements, so on several workers they are
        measured in waves of one per worker and handed over in the same order: the search stops
        where the single process stops, with the same result (a wave may measure a few
        configurations past the stop, which are dropped)."""
        candidates = _configurations(model, assign, layers, order, saved, scratch)
        if not ctx.workers.parallel:
            for levels, notes in candidates:
                yield levels, notes, (measure(True) if levels is not None else 0.0)
            return
        wave_size = ctx.workers.slots()
        job = _Measure(model, assign, layers, saved, scratch, measure)
        wave: list[tuple[dict[int, str] | None, list[str]]] = []
        for candidate in [*candidates, None]:
            if candidate is not None:
                wave.append(candidate)
                if sum(levels is not None for levels, _ in wave) < wave_size:
                    continue
            scores = iter(ctx.workers.map(job, [levels for levels, _ in wave if levels is not None]))
            for levels, notes in wave:
                yield levels, notes, (next(scores) if levels is not None else 0.0)
            wave = []

    def _metric(self, model: Model, ctx: PassContext) -> tuple[Callable[[bool], float], str]:
        """The metric, measured at one BLAS thread in this process as in a worker (OpenBLAS's sums
        depend on its thread count: `qcc.sim.split.one_blas_thread`), so a sharded search sees
        the single process's values."""
        measure, what = self._plain_metric(model, ctx)

        def at_one_thread(quantized: bool) -> float:
            from qcc.sim.split import one_blas_thread

            with one_blas_thread():
                return measure(quantized)

        return at_one_thread, what

    def _plain_metric(self, model: Model, ctx: PassContext) -> tuple[Callable[[bool], float], str]:
        from qcc.sim.interpreter import run_batched

        user = ctx.metric
        if user is not None:
            if not callable(user):
                raise UsageError(f"accuracy-control: metric must be a callable, got {type(user).__name__}")

            def run_user(quantized: bool) -> float:
                return float(user(lambda feeds: run_batched(model, feeds, self.batch_size, quantized=quantized)))

            return run_user, "metric callable"
        if ctx.eval_data is None:
            raise UsageError("accuracy-control needs labelled evaluation data (--eval DATA.npz with a 'labels' "
                             "array) or a metric callable (qcc.compile(..., metric=...))")
        path = ctx.eval_name
        feeds, labels = labelled_feeds(model, ctx.eval_data, path, self.batch_size)
        if labels is None:
            raise UsageError(f"{path}: accuracy-control needs a 'labels' array (top-1 accuracy) or a metric callable")
        output = model.graph.outputs[0].name

        def top1(quantized: bool) -> float:
            logits = run_batched(model, feeds, self.batch_size, quantized=quantized)[output]
            flat = logits.reshape(len(logits), -1)
            return float(np.mean(flat.argmax(axis=1) == labels))

        return top1, f"top-1 on {path}"


def _configurations(model: Model, assign: Pass, layers: list[Any], order: list[int], saved: Any,
                    scratch: PassContext) -> Iterator[tuple[dict[int, str] | None, list[str]]]:
    """The greedy search's configurations in order (None with a note: a promotion refused)."""
    levels: dict[int, str] = {}
    for stage in STAGES:
        for index in order:
            if levels.get(index) == stage:
                continue
            previous = levels.get(index)
            levels[index] = stage
            try:
                promote(model, assign, layers, levels, saved, scratch)
            except QccError as exc:  # a promotion that breaks a user pin: leave that layer
                if previous is None:
                    del levels[index]
                else:
                    levels[index] = previous
                yield None, [f"layer {layers[index][0]!r} not promoted to {stage}: {exc}"]
                continue
            yield dict(levels), []


@attrs.frozen(eq=False)
class _Measure:
    """The metric of one configuration, in a worker (its own copy of the model)."""

    model: Model
    assign: Pass
    layers: list[Any]
    saved: Any
    scratch: PassContext
    measure: Callable[[bool], float]

    def __call__(self, levels: dict[int, str]) -> float:
        promote(self.model, self.assign, self.layers, levels, self.saved, self.scratch)
        return self.measure(True)


def labelled_feeds(model: Model, data: Any, source: str, batch_size: int) -> tuple[dict[str, np.ndarray],
                                                                                    np.ndarray | None]:
    """Evaluation arrays and labels, all held: the search measures them many times (a Python
    stream of batches is read once and concatenated)."""
    from qcc.data import bind_inputs, bound_batches
    from qcc.ir.samples import to_samples

    if isinstance(data, dict):
        return bind_inputs(model, data, source)
    parts = list(bound_batches(model, data, source, batch_size, "accuracy-control"))
    if not parts:
        return {}, None
    feeds = {k: np.concatenate([to_samples(model, p[0])[k] for p in parts]) for k in parts[0][0]}
    labelled = all(p[1] is not None for p in parts)
    return feeds, np.concatenate([p[1] for p in parts if p[1] is not None]) if labelled else None
