"""The `bias-correct` pass: each quantized layer's mean output error moved into its bias.

Runs after the annotation pass (quantize-affine or assign-fixed-point), on the annotated model:

- **empirical** (calibration data given): the model runs as `run_model(quantized=True)` runs it
  (nnabla-c-runtime's integer kernels for an all fixed-point model, fake quantization
  otherwise). At each Conv / ConvTranspose / Dense, the stored output is compared with the float
  layer (float weights and bias) applied to the same stored input; the mean difference per
  output channel, over the first `samples` samples, is subtracted from the bias. This is the
  layer's own systematic error: weight rounding times the mean input, truncation toward zero
  (FIXED8 convolutions truncate once per input channel), the output's and the bias's rounding.
- **analytical** (no data): (W_q - W) E[x] per output channel, E[x] from the BatchNorm
  statistics fold-bn kept (a clamped normal through ReLU/ReLU6, Nagel et al. 2019); layers
  whose input has no such statistics are left as they are, with a report line.

The new bias respects the target's storage: it keeps the annotation the annotation pass gave it
(int32 at s_x * s_w for affine; the output's width and position for fixed point, which is what
nnabla-c-runtime requires of a bias), and is clipped to what that storage holds (reported). A
layer without a bias gets one. Re-running is idempotent: the bias before correction is kept in
`meta["bias_before_correction"]` and restored first, which is how `sensitivity` and
`accuracy-control` re-apply the correction after they change annotations.
Report section `bias_correct`: per layer, the largest shift in units of the output's step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import attrs
import numpy as np
from qcc.passes.channel_fold import (
    fold_input_affine,
    layer_bias,
    layer_bias_value,
    layer_weight,
    output_channels,
    set_layer_bias,
)
from qcc.passes.float_reference import FloatReference, KeptArrays, pop_kept, reference_outputs
from qcc.passes.fold_bn import BN_STATS
from qcc.passes.quantize_affine import annotate_bias
from qcc.passes.quantized_samples import RunKeeper, keep_run
from qcc.passes.quantreport import parameter_entry
from qcc.passes.quantutil import (
    annotation_pass,
    at_least,
    calibration_batches,
    check_choices,
    clamp_bounds,
    commutes_with_channel_scale,
    has_weight,
    is_view,
    original_parameters,
    param_data,
    recorded_original,
    register_refinement,
)

from qcc.errors import UsageError
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.fakequant import apply_annotation
from qcc.ir.registry import get_schema
from qcc.ir.types import Affine, FixedPoint
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.pm.parallel import Workers, process_split
from qcc.quant.biascorr import INTEGER_INPUT_VALUES, SAMPLES, ChannelMean, storable
from qcc.quant.equalize import clipped_normal_mean
from qcc.quant.numerics import AFFINE_DTYPES, fixed_bounds
from qcc.quant.samples import INPUT_VALUES
from qcc.sim.split import SplitProducts

T = TypeVar("T")
SECTION = "bias_correct"
BEFORE = "bias_before_correction"
"""value.meta key of a corrected bias: its float values before correction."""


@attrs.frozen
class BiasCorrect(Pass):
    """Move each quantized layer's mean output error into its bias (empirical, or from BatchNorm)."""

    name = "bias-correct"

    mode: Literal["auto", "empirical", "analytical"] = attrs.field(
        default="auto", metadata={"help": "auto: empirical with calibration data, else analytical"})
    samples: int = attrs.field(default=SAMPLES, validator=at_least(1),
                               metadata={"help": "calibration samples (one batch: every layer sees the same ones)"})
    input_values: int = attrs.field(default=INPUT_VALUES, validator=at_least(1), metadata={
        "help": "fewer samples when they are large: at most this many input values in all, at least 4 samples"})
    integer_input_values: int = attrs.field(default=INTEGER_INPUT_VALUES, validator=at_least(1), metadata={
        "help": "input_values when the model runs on nnabla-c-runtime's integer kernels (.nnb, C fixed point)"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        annotation_pass(model, self.name)
        undo_bias_correction(model)
        kept = pop_kept(model, ctx, FloatReference)  # calibrate's float run on the same samples, read once
        layers = [n for n in model.graph.nodes if _correctable(n)]
        mode = self.mode
        if mode == "auto":
            mode = "empirical" if ctx.calib_data is not None else "analytical"
        run: tuple[dict[str, np.ndarray], RunKeeper, dict[str, np.ndarray]] | None = None
        if mode == "empirical":
            if ctx.calib_data is None:
                raise UsageError("bias-correct{mode=empirical} needs calibration data (--calib DATA.npz)")
            shifts, run = self._measured(model, layers, ctx, kept)
        else:
            shifts = {id(n): s for n in layers if (s := _analytical(n, ctx)) is not None}
        entries = [_apply(model, n, shifts[id(n)], mode) for n in layers if id(n) in shifts]
        if run is not None:  # the integer run computed the corrected model: check-fixed-point reads it
            keep_run(model, ctx, *run)  # (and calibrate's float values on its samples, when they were used)
        ctx.report[SECTION] = entries
        register_refinement(model, self)
        return PassResult(model, bool(entries), frozenset({"*"}))

    def undo(self, model: Model) -> None:
        """Called before the annotations change (sensitivity, accuracy-control): biases as they were."""
        undo_bias_correction(model)

    def _measured(self, model: Model, layers: list[Node], ctx: PassContext,
                  kept: KeptArrays | None) -> tuple[dict[int, np.ndarray],
                                                    tuple[dict[str, np.ndarray], RunKeeper, dict[str, np.ndarray]] | None]:
        """Sequential correction on one batch of the first `samples` samples, fewer when they hold
        more than `input_values` values (with the values of its integer run, when it is one, and
        calibrate's float values of the model before correction on the same samples when they were
        the reference); a model with a static batch dimension is measured layer by layer instead
        (`own_errors`)."""
        from qcc.sim.fixed import runs_integer_kernels

        integer = runs_integer_kernels(model)
        budget = self.integer_input_values if integer else self.input_values
        parts = list(calibration_batches(model, ctx, self.samples, self.samples, budget))
        if len(parts) == 1:
            keeper = RunKeeper(model) if integer else None
            # one BLAS thread per product from here (the float layers computed on kept inputs
            # included): the shifts do not depend on the core count
            split = process_split()
            try:
                reference = reference_outputs(kept, model, parts[0], layers)
                floats = _float_values(kept, model, layers) if reference is not None and keeper is not None else {}
                shifts = _sequential(model, layers, parts[0], split, reference, keeper)
            finally:
                split.close()
            return shifts, (parts[0], keeper, floats) if keeper is not None else None
        return own_errors(model, layers, parts, ctx.workers), None


def _float_values(kept: KeptArrays | None, model: Model, layers: list[Node]) -> dict[str, np.ndarray]:
    """What calibrate kept (valid for this model and these samples: `reference_outputs` used it),
    for check-fixed-point's float run of the model before correction; nothing when that model is
    not the one calibrate ran: a layer without a bias gets a zero one here (x + 0.0 is not x for
    x = -0.0), and a Quantize node is an identity in calibrate's run only."""
    if kept is None or any(_bias(n) is None for n in layers) or any(n.op == "Quantize" for n in model.graph.nodes):
        return {}
    return kept.arrays


def own_errors(model: Model, layers: list[Node], parts: list[dict[str, np.ndarray]],
               workers: Workers | None = None) -> dict[int, np.ndarray]:
    """Per layer, stored output minus the float layer on the same stored input, streamed over the
    batches (a static batch dimension: the sequential correction needs all samples at once).

    On `workers`, contiguous runs of batches are measured in parallel; each batch's sums come
    back on their own and are added in batch order, the additions the single process makes, so
    the shifts (and the bytes written) do not depend on the number of workers."""
    if workers is not None and workers.parallel and len(parts) > 1:
        slots = min(workers.slots(), len(parts))
        bounds = [len(parts) * i // slots for i in range(slots + 1)]
        shards = [_ErrorShard(model, layers, parts[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
        sums = [s for shard in workers.map(_measure_shard, shards) for s in shard]
    else:
        sums = _batch_sums(model, layers, parts)
    means = [ChannelMean() for _ in layers]
    for batch in sums:
        for index, part in batch.items():
            means[index].merge(part)
    return {id(layer): m.mean() for layer, m in zip(layers, means) if m.count}


@attrs.frozen(eq=False)
class _ErrorShard:
    model: Model
    layers: list[Node]
    parts: list[dict[str, np.ndarray]]


def _measure_shard(shard: _ErrorShard) -> list[dict[int, ChannelMean]]:
    return _batch_sums(shard.model, shard.layers, shard.parts)


def _batch_sums(model: Model, layers: list[Node], parts: list[dict[str, np.ndarray]]) -> list[dict[int, ChannelMean]]:
    """Per batch, per layer index: the sums and counts of that batch's errors. BLAS at one thread,
    in this process as in a worker: the sums do not depend on where they ran (`one_blas_thread`)."""
    from qcc.sim.compare import quantized_runner
    from qcc.sim.split import one_blas_thread

    inputs = {id(n.input(0)) for n in layers}
    by_output = {id(n.outputs[0]): i for i, n in enumerate(layers)}
    seen: dict[int, np.ndarray] = {}
    batch: dict[int, ChannelMean] = {}

    def observe(value: Value, array: np.ndarray) -> None:
        if id(value) in inputs:
            seen[id(value)] = array
        index = by_output.get(id(value))
        if index is not None:
            layer = layers[index]
            reference = _float_layer(layer, seen[id(layer.input(0))])
            batch.setdefault(index, ChannelMean()).add_errors(array, reference, _inside(layer))

    runner = quantized_runner(model, observe)
    sums = []
    with one_blas_thread():
        for part in parts:
            runner.run(part)
            seen.clear()
            sums.append(batch)
            batch = {}
    return sums


def _sequential(model: Model, layers: list[Node], feeds: dict[str, np.ndarray], split: SplitProducts,
                kept: dict[int, np.ndarray] | None = None, keeper: RunKeeper | None = None) -> dict[int, np.ndarray]:
    """Each layer in graph order gets the mean of (its stored output - the float model's output)
    with every earlier layer already corrected: one float run (or the float outputs calibrate
    kept, `kept`: the same arrays) and one quantized run of the whole batch. A kernel wrapper
    measures each layer and adds its bias change to what it computed (the bias is the last term
    of every layer's sum), so later layers see the corrected one. `keeper` observes the integer
    run (every value of it is what the corrected model computes)."""
    from qcc.sim.compare import passthrough
    from qcc.sim.fixed import FixedRunner, dedicated_problem, fixed_kernel, runs_integer_kernels
    from qcc.sim.interpreter import Interpreter
    from qcc.sim.split import float_products

    wanted = {id(n.outputs[0]) for n in layers}
    reference: dict[int, np.ndarray] = dict(kept) if kept is not None else {}

    def keep(value: Value, array: np.ndarray) -> None:
        if id(value) in wanted:
            reference[id(value)] = array

    if kept is None:
        with original_parameters(model):  # the float model's: not learned-rounding's weights and bias shift
            Interpreter(model, observer=keep, kernels={"Quantize": passthrough}).run(feeds)
    for layer in layers:  # a layer without a bias gets a zero one, so the runner stores it
        ensure_bias(model.graph, layer)
    shifts: dict[int, np.ndarray] = {}
    fixed = runs_integer_kernels(model)
    # the products and the error sums on calibrate's sample-split threads (`split`, qcc.sim.split):
    # the integer kernels are exact in any order, the float ones compute each sample with one
    # BLAS thread, the sums are added in sample order
    runner: Any = None

    def corrected(original: Any) -> Any:
        def kernel(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
            if id(node.outputs[0]) not in wanted:
                return original(node, args)  # type: ignore[no-any-return]
            exact_add = fixed and dedicated_problem(node) is None
            # the integer kernels add the bias last, saturating: compute the sum once, add either bias
            partial = original(node, args[:2])[0] if exact_add else None
            reach = _reach(partial, split) if exact_add else None
            step = _exact_step(node.outputs[0]) if fixed else None
            # the bias's saturating add made inside the error sums (no array of the output)
            plan = _bias_add(node, args[2], reach) if exact_add and step is not None else None
            offset, bounds = plan if plan is not None else (None, None)
            stored: np.ndarray
            if plan is not None:
                stored = np.asarray(partial)
            else:
                out = [_add_bias(node, partial, args[2], reach)] if exact_add else original(node, args)
                stored = np.asarray(out[0])
            target = reference[id(node.outputs[0])]
            mean = ChannelMean()
            quant = node.outputs[0].quant
            if step is not None:  # the integers read as stored * step, exactly, in the sums
                mean.add_errors(stored, target, _inside(node), step, ranges=split.ranges, offset=offset, bounds=bounds)
            elif fixed or getattr(quant, "axis", None) == 0:
                got = runner.to_float(node.outputs[0], stored) if fixed else apply_annotation(stored, quant)
                mean.add_errors(got, target, _inside(node), ranges=split.ranges)
            else:  # the stored output read back as its annotation stores it, elementwise, sample by sample
                mean.add_errors(stored, target, _inside(node), read=lambda a: apply_annotation(a, quant),
                                ranges=split.ranges)
            shift = mean.mean()
            _apply(model, node, shifts.get(id(node), 0.0) + shift, "", report=False)  # run() reports it
            shifts[id(node)] = shifts.get(id(node), 0.0) + shift
            bias = _bias(node)
            assert bias is not None and bias.const is not None
            if exact_add:
                return [_add_bias(node, partial, runner.store_param(bias), reach, last=True, split=split)]
            if fixed:  # a generic kernel (mixed types): compute it again
                return original(node, [*args[:2], runner.store_param(bias)])  # type: ignore[no-any-return]
            change = (bias.const.astype(np.float64) - args[2]).reshape(1, -1, *([1] * (stored.ndim - 2)))
            # before storage (the bias is the last term): the sum in float64 rounded once to the stored
            # dtype, elementwise: on the split's threads, contiguous samples each, a sample at a time
            # in a float64 buffer (in cache: a third faster than one ufunc casting both ways)
            result = np.empty(stored.shape, stored.dtype)

            def add(start: int, stop: int) -> None:
                if stored.ndim < 2:
                    np.add(stored, change, dtype=np.float64, out=result, casting="same_kind")
                    return
                buffer = np.empty(stored.shape[1:], np.float64)
                for k in range(start, stop):
                    np.copyto(buffer, stored[k])
                    buffer += change[0]
                    np.copyto(result[k], buffer, casting="same_kind")

            _on_samples(split, add, stored)
            return [result]
        return kernel

    ops = {n.op for n in layers}
    if fixed:
        runner = FixedRunner(model, kernels={op: corrected(split.wrap(fixed_kernel(op))) for op in ops},
                             observer=keeper)
    else:
        products = float_products(split, rows_alone=False)
        runner = _split_stores(split)(model, quantized=True, kernels={
            **products, **{op: corrected(products.get(op) or get_schema(op).kernel) for op in ops}})
    runner.run(feeds)
    undo_bias_correction(model)
    return shifts


def _split_stores(split: SplitProducts) -> type:
    """An Interpreter (quantized) whose stores of an output run on `split`'s threads, contiguous
    samples each: a store is elementwise (a per-tensor or per-channel annotation on axis 1), so
    the same values."""
    from qcc.sim.interpreter import Interpreter

    class SplitStores(Interpreter):
        def store_output(self, value: Value, array: np.ndarray) -> np.ndarray:
            array = np.asarray(array)
            if (split.threads < 2 or not isinstance(value.quant, (Affine, FixedPoint)) or array.ndim < 2
                    or len(array) < 2 or getattr(value.quant, "axis", None) == 0):
                return super().store_output(value, array)
            out = np.empty_like(array)

            def store(start: int, stop: int) -> None:
                out[start:stop] = self._store(value, array[start:stop])

            split.ranges(store, len(array))
            return out

    return SplitStores


def _exact_step(value: Value) -> float | None:
    """2**-frac when the runtime's float32 getter reads every stored integer of `value` exactly as
    integer * 2**-frac (normal float32 values: `qcc.sim.fixed.to_float`), None otherwise."""
    fixed = value.quant
    if not isinstance(fixed, FixedPoint) or fixed.bits > 24 or not -100 <= fixed.frac <= 100:
        return None
    return float(2.0 ** -fixed.frac)


def _on_samples(split: SplitProducts, fn: Callable[[int, int], T], array: np.ndarray) -> list[T]:
    """fn(start, stop) over contiguous samples of `array` on the split's threads (elementwise
    work or reductions combined exactly: the same result in any split)."""
    if array.ndim < 2 or len(array) < 2:
        return [fn(0, len(array) if array.ndim else 1)]
    return split.ranges(fn, len(array))


def _reach(partial: Any, split: SplitProducts) -> tuple[int, int] | None:
    """The smallest and largest sum before the bias (two reductions, once for both biases)."""
    if not partial.size or partial.dtype != np.int64:
        return None

    def bounds(start: int, stop: int) -> tuple[int, int]:
        part = partial[start:stop] if partial.ndim else partial
        return (int(part.min()), int(part.max())) if part.size else (2 ** 63 - 1, -2 ** 63)

    found = _on_samples(split, bounds, partial)
    return min(lo for lo, _ in found), max(hi for _, hi in found)


def _add_bias(node: Node, partial: Any, bias: np.ndarray, reach: tuple[int, int] | None = None,
              last: bool = False, split: SplitProducts | None = None) -> np.ndarray:
    """nnabla-c-runtime's last step of Convolution/Affine: the bias added with saturation.

    `reach`: the sums' range: when the sums plus the bias cannot leave the output's range (and
    the bias holds no MIN, `add_bias`'s one wrapping case) the saturation is a no-op, and
    `add_bias`'s two reductions to find that out are skipped; `last`: `partial` is not read
    again (the sum is written into it, on `split`'s threads, contiguous samples each)."""
    from qcc.sim.fixed import add_bias, bias_ints, clip_inplace, fixed_of

    out = fixed_of(node.outputs[0])
    assert out is not None and partial is not None
    plan = _bias_add(node, bias, reach)
    if plan is None or not last or split is None:
        ints = bias_ints(node, bias) if plan is None else plan[0]
        view = ints.reshape(1, -1, *([1] * (partial.ndim - 2)))
        if plan is not None and plan[1] is None:
            return np.add(partial, view, out=partial if last else None, dtype=np.int64)  # type: ignore[no-any-return]
        return add_bias(partial, view, out.bits)
    ints, bounds = plan
    view = ints.reshape(1, -1, *([1] * (partial.ndim - 2)))

    def add(start: int, stop: int) -> None:
        np.add(partial[start:stop], view, out=partial[start:stop], dtype=np.int64)
        if bounds is not None:  # add_bias without MIN in the bias: a clip
            clip_inplace(partial[start:stop], *bounds)

    _on_samples(split, add, partial)
    return partial  # type: ignore[no-any-return]


def _bias_add(node: Node, bias: np.ndarray, reach: tuple[int, int] | None) -> \
        tuple[np.ndarray, tuple[int, int] | None] | None:
    """The runtime's saturating add of the bias to sums inside `reach`, as a plain add and a
    clip: the bias's integers (per output channel) and the output's bounds to clip to (None:
    the sums plus the bias cannot leave them). None when `reach` is unknown or the bias holds
    MIN (`add_bias`'s one wrapping case)."""
    from qcc.sim.fixed import bias_ints, fixed_of

    out = fixed_of(node.outputs[0])
    assert out is not None
    ints = bias_ints(node, bias)
    lo, hi = fixed_bounds(out.bits)
    if reach is None or not ints.size or int(ints.min()) <= lo:
        return None
    inside = lo <= reach[0] + int(ints.min()) and reach[1] + int(ints.max()) <= hi
    return ints, None if inside else (lo, hi)


def _original(value: Value) -> np.ndarray | None:
    before = recorded_original(value)
    return value.const if before is None else before


def _float_layer(layer: Node, x: np.ndarray) -> np.ndarray:
    """The layer in float (float weights and bias, as they were before learned-rounding) on input x."""
    bias = _bias(layer)
    weight = layer_weight(layer)
    before = recorded_original(weight)
    params = [param_data(weight) if before is None else before, *([_original(bias)] if bias is not None else [])]
    return np.asarray(get_schema(layer.op).kernel(layer, [x, *params])[0], np.float64)  # type: ignore[list-item]


def _inside(layer: Node) -> tuple[float | None, float | None] | None:
    """Where a change of the bias changes what the model computes, lo < reference < hi (None:
    everywhere): inside the clamp that reads the output (ReLU: above 0) and inside what the
    output's annotation can store (a saturated value does not move)."""
    lo, hi = _active_region(layer)
    storable_range = output_range(layer.outputs[0].quant)
    if storable_range is not None:
        lo = storable_range[0] if lo is None else max(lo, storable_range[0])
        hi = storable_range[1] if hi is None else min(hi, storable_range[1])
    if lo is None and hi is None:
        return None
    return lo, hi


def output_range(quant: Any) -> tuple[float, float] | None:
    """The values a per-tensor annotation can store."""
    if isinstance(quant, FixedPoint):
        qmin, qmax = fixed_bounds(quant.bits)
        return float(np.ldexp(qmin, -quant.frac)), float(np.ldexp(qmax, -quant.frac))
    if isinstance(quant, Affine) and quant.axis is None:
        qmin, qmax = AFFINE_DTYPES[quant.dtype]
        scale, zp = float(quant.scale[0]), int(quant.zero_point[0])
        return (qmin - zp) * scale, (qmax - zp) * scale
    return None


def _active_region(layer: Node) -> tuple[float | None, float | None]:
    """Where the layer's output matters: inside the clamp that alone reads it (ReLU: above 0)."""
    readers = layer.outputs[0].consumers()
    bounds = [clamp_bounds(n) for n in readers]
    if not readers or any(b is None for b in bounds) or len(set(bounds)) != 1:
        return None, None
    return bounds[0]  # type: ignore[return-value]


def undo_bias_correction(model: Model) -> None:
    """Restore every bias a previous bias-correct changed."""
    for value in model.graph.constants:
        before = value.meta.pop(BEFORE, None)
        if before is not None:
            value.const = before


def _bias(layer: Node) -> Value | None:
    return layer_bias_value(layer)


def _correctable(layer: Node) -> bool:
    """A quantized weighted layer (Conv / ConvTranspose / Dense) whose bias qcc may change."""
    index = get_schema(layer.op).weight_input
    if not has_weight(layer) or index is None or len(layer.inputs) <= index or layer.inputs[index] is None:
        return False
    x, w, y = layer.input(0), layer_weight(layer), layer.outputs[0]
    if not all(isinstance(v.quant, (Affine, FixedPoint)) for v in (x, w, y)) or param_data(w) is None:
        return False
    bias = _bias(layer)
    if bias is None:
        return True
    return bias.const is not None and not bias.meta.get("pinned") and isinstance(bias.quant, (Affine, FixedPoint)) \
        and len(bias.uses()) == 1


def _apply(model: Model, layer: Node, shift: np.ndarray, mode: str, report: bool = True) -> dict[str, Any]:
    """bias := (the bias as stored) - shift: the stored bias moves by the grid step nearest to
    the shift (correcting the float bias instead would add its own rounding, up to a step).
    report=False: no report entry for the bias (a measuring run, undone before the final one)."""
    before = layer_bias(layer, output_channels(layer, _weight(layer)))
    bias = ensure_bias(model.graph, layer)
    assert bias.const is not None
    bias.meta[BEFORE] = before.astype(bias.const.dtype)
    stored = apply_annotation(before.astype(np.float64), bias.quant) if bias.quant is not None else before
    bias.const = (np.asarray(stored, np.float64) - shift).astype(bias.const.dtype)
    clipped = _clip_to_storage(bias)
    if bias.quant is not None and report:
        bias.meta["report"] = parameter_entry(bias.const, bias.quant)
    step = _output_step(layer)
    entry: dict[str, Any] = {"layer": layer.name, "mode": mode,
                             "max_shift_steps": round(float(np.max(np.abs(shift)) / step), 3) if step else None}
    if clipped:
        entry["clipped"] = f"{clipped} channel(s) clipped to what {bias.quant} can store"
    return entry


def _weight(layer: Node) -> np.ndarray:
    w = param_data(layer_weight(layer))
    assert w is not None
    return w


def ensure_bias(graph: Graph, layer: Node) -> Value:
    """The layer's bias; a zero one, annotated as the target stores biases, if it has none (int32
    at s_x * s_w for affine; the output's type and position for fixed point, the nnb rule)."""
    bias = _bias(layer)
    if bias is not None:
        return bias
    set_layer_bias(graph, layer, np.zeros(output_channels(layer, _weight(layer))))
    bias = _bias(layer)
    assert bias is not None
    out = layer.outputs[0].quant
    if isinstance(out, FixedPoint):
        bias.quant = FixedPoint(out.bits, out.frac)
    else:
        annotate_bias(layer)
    return bias


def _clip_to_storage(bias: Value) -> int:
    quant, data = bias.quant, bias.const
    assert data is not None
    if isinstance(quant, FixedPoint):
        qmin, qmax = fixed_bounds(quant.bits)
        clipped, n = storable(data.astype(np.float64), np.ldexp(1.0, -quant.frac), qmin, qmax)
    elif isinstance(quant, Affine):
        qmin, qmax = AFFINE_DTYPES[quant.dtype]
        scale = np.asarray(quant.scale, np.float64)
        clipped, n = storable(data.astype(np.float64), scale, qmin, qmax, np.asarray(quant.zero_point))
    else:
        return 0
    if n:
        bias.const = clipped.astype(data.dtype)
    return n


def _output_step(layer: Node) -> float | None:
    quant = layer.outputs[0].quant
    if isinstance(quant, FixedPoint):
        return float(np.ldexp(1.0, -quant.frac))
    if isinstance(quant, Affine):
        return float(quant.scale[0])
    return None


# ---------------------------------------------------------------------- analytical


def _analytical(layer: Node, ctx: PassContext) -> np.ndarray | None:
    """(W_q - W) E[x] per output channel, or None (noted) when E[x] is unknown."""
    w = param_data(layer_weight(layer))
    assert w is not None
    mean = expected_input(layer.input(0))
    channels = layer.input(0).type.shape[1]
    if mean is None or get_schema(layer.op).has("scatters") or channels != mean.size:
        ctx.note(SECTION, f"{layer.name}: no BatchNorm statistics describe its input; not corrected "
                          "(give calibration data for the empirical correction)")
        return None
    error = apply_annotation(w, layer_weight(layer).quant).astype(np.float64) - w.astype(np.float64)
    zeros = np.zeros(output_channels(layer, w))
    _, shift = fold_input_affine(layer, error, zeros, np.ones(mean.size), mean)
    return shift


def expected_input(value: Value) -> np.ndarray | None:
    """E[x] per channel of an activation, from the BatchNorm statistics of the layer before it
    (through a clamp, pooling and views)."""
    clamp: tuple[float | None, float | None] | None = None
    repeat = 1
    while BN_STATS not in value.meta:
        producer = value.producer()
        if producer is None or not producer.inputs or producer.inputs[0] is None:
            return None
        bounds = clamp_bounds(producer)
        if bounds is not None and clamp is None:
            clamp = bounds
        elif is_view(producer) and not commutes_with_channel_scale(producer):
            src = producer.input(0).type.shape
            if len(src) < 3 or not all(isinstance(d, int) for d in src[1:]):
                return None
            repeat *= math.prod(int(d) for d in src[2:])
        elif bounds is not None or not commutes_with_channel_scale(producer):
            return None
        value = producer.input(0)
    mean, std = value.meta[BN_STATS]
    expected = clipped_normal_mean(mean, std, *clamp) if clamp is not None else np.asarray(mean, np.float64)
    return np.repeat(expected, repeat) if repeat > 1 else expected
