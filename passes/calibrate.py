"""The `calibrate` pass: run the float model on calibration data, keep streaming statistics.

Memory does not grow with the number of samples (onnxruntime #10503, #11020, #21979): each batch
runs through the reference interpreter, an observer folds every float activation into a
fixed-size `TensorStats` (qcc.quant.stats) and the interpreter frees the batch's tensors as it
goes. The statistics are a cached analysis (`CalibrationStats`) of the pass manager: a
`Calibration` that merges exactly with another one (other batches, other workers), valid until a
pass changes the graph without preserving it (statistics of a graph that fold-bn has since
changed are never used).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs
import numpy as np
from qcc.passes.quantutil import check_choices, check_finite_params, is_float
from qcc.passes.statistics import Calibration, CalibrationStats

from qcc.errors import InvalidInputError, UsageError
from qcc.ir.core import Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.quant.ranges import is_constant
from qcc.quant.stats import DEFAULT_NUM_BINS, BatchCounts, TensorStats


def _positive(name: str) -> Any:
    def check(_: Any, attribute: Any, value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return check


def _power_of_two(_: Any, attribute: Any, value: int) -> None:
    if value < 2 or value & (value - 1) or value > 1 << 24:
        raise ValueError(f"num_bins must be a power of two in 2..2**24, got {value}")


@attrs.frozen
class Calibrate(Pass):
    """Run the float model on --calib data in batches and collect per-tensor statistics."""

    name = "calibrate"

    batch_size: int = attrs.field(default=32, validator=_positive("batch_size"),
                                  metadata={"help": "samples per batch (a static batch dim wins)"})
    num_bins: int = attrs.field(default=DEFAULT_NUM_BINS, validator=_power_of_two,
                                metadata={"help": "histogram bins per sign"})
    max_samples: int | None = attrs.field(default=None, validator=_positive("max_samples"),
                                          metadata={"help": "use at most this many samples"})
    merge: bool = attrs.field(default=False, metadata={"help": "merge into existing statistics"})
    engine: Literal["qcc", "onnxruntime"] = attrs.field(
        default="qcc", metadata={"help": "run the model with qcc's interpreter or onnxruntime"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        from qcc.data import bind_inputs

        if ctx.calib_data is None:
            raise UsageError("pass 'calibrate' needs calibration data (--calib DATA.npz: arrays keyed by "
                             "model input name, first axis = samples)")
        check_finite_params(model)
        source = ctx.calib_name
        if not isinstance(ctx.calib_data, dict):  # batches from Python (qcc.data.DataStream), streamed
            from qcc.data import bound_batches

            stream = (feeds for feeds, _ in bound_batches(model, ctx.calib_data, source, self.batch_size,
                                                          "pass 'calibrate'"))
            result = collect_batches(model, stream, None, self.num_bins, ctx.progress, self.engine)
            if not result.samples:
                raise InvalidInputError(f"{source}: no samples (pass 'calibrate')")
            return self._store(result, model, source, ctx)
        feeds, _ = bind_inputs(model, dict(ctx.calib_data), source)  # no whole-array temporaries
        count = len(next(iter(feeds.values()))) if feeds else 0
        if self.max_samples is not None:
            count = min(count, self.max_samples)
        batch, count = self._batching(model, count, source, ctx)
        result = collect(model, {k: v[:count] for k, v in feeds.items()}, batch, self.num_bins,
                         ctx.progress, self.engine)
        return self._store(result, model, source, ctx)

    def _store(self, result: Calibration, model: Model, source: str, ctx: PassContext) -> PassResult:
        _check(result, model, source, ctx)
        previous = ctx.analyses.peek(CalibrationStats, model)
        if self.merge and isinstance(previous, Calibration):
            result = previous.merge(result)
        ctx.analyses.store(CalibrationStats, model, result)
        return PassResult.unchanged(model)

    def _batching(self, model: Model, count: int, source: str, ctx: PassContext) -> tuple[int, int]:
        """A static batch dimension (e.g. 1) fixes the batch; leftover samples are dropped."""
        from qcc.data import batching

        batch, usable = batching(model, count, self.batch_size, source, "pass 'calibrate'")
        if usable != count:
            ctx.note("calibration", f"{count - usable} sample(s) dropped: the model's static batch is {batch}")
        return batch, usable


def collect(model: Model, feeds: dict[str, np.ndarray], batch: int, num_bins: int = DEFAULT_NUM_BINS,
            progress: bool = False, engine: str = "qcc") -> Calibration:
    """Statistics of every float activation over `feeds` (first axis = samples), batch by batch.

    engine 'qcc' runs the reference interpreter (no other framework); 'onnxruntime' exports the
    model to ONNX with every tracked tensor as an output and runs it with graph optimizations off
    (same tensors by name, one batch of outputs alive at a time).
    """
    count = len(next(iter(feeds.values()))) if feeds else 0
    batches = ({k: v[start:start + batch] for k, v in feeds.items()} for start in range(0, count, batch))
    return collect_batches(model, batches, count, num_bins, progress, engine)


def collect_batches(model: Model, batches: Iterable[dict[str, np.ndarray]], total: int | None,
                    num_bins: int = DEFAULT_NUM_BINS, progress: bool = False, engine: str = "qcc") -> Calibration:
    """`collect` over batches as they come (a stream of batches is never held whole)."""
    from qcc.progress import progress_bar

    observer = _Observer(model, num_bins)
    observed = list(observer.tracked.values())
    run = _ort_runner(model, observed, observer) if engine == "onnxruntime" else _qcc_runner(model, observer)
    count = 0
    with progress_bar(total, "calibrate", progress) as bar:
        for feeds in batches:
            observer.batch_counts.clear()
            run(feeds)
            done = len(next(iter(feeds.values()))) if feeds else 0
            count += done
            if bar:
                bar(done)
    return Calibration(observer.finish(), count)




def _data_inputs(node: Node) -> list[Value]:
    return [v for v in (node.inputs if node.op == "Concat" else node.inputs[:1]) if v is not None]


class _Observer:
    """Folds each computed float tensor into its TensorStats, skipping the passes it can.

    Statistics of a multiset of values merge exactly (qcc.quant.stats), so a Concat output or a
    reshaped tensor is never read: at the end it gets the merge of its inputs' statistics, bin
    for bin what observing it would give (DenseNet's growing Concat outputs are a quarter of
    what it computes). A Relu output is accounted from its input's histogram of the same batch
    when the bins line up (TensorStats.add_relu_of), and observed otherwise.
    """

    def __init__(self, model: Model, num_bins: int) -> None:
        graph = model.graph
        tracked = {id(v): v for v in graph.inputs if is_float(v)}
        for node in graph.nodes:
            tracked.update({id(v): v for v in node.outputs if is_float(v)})
        self.order = [v.name for v in tracked.values()]
        self.num_bins = num_bins
        self.derived = [n for n in graph.nodes if get_schema(n.op).has("rearranges") and len(n.outputs) == 1
                        and id(n.outputs[0]) in tracked and _data_inputs(n)
                        and all(id(v) in tracked for v in _data_inputs(n))]
        for node in self.derived:
            del tracked[id(node.outputs[0])]
        self.tracked = tracked
        self.stats = {v.name: TensorStats(v.name, num_bins) for v in tracked.values()}
        self.relu_input = {id(n.outputs[0]): id(n.inputs[0]) for n in graph.nodes
                           if n.op == "Relu" and id(n.outputs[0]) in tracked and id(n.inputs[0]) in tracked}
        self.relu_sources = set(self.relu_input.values())
        self.batch_counts: dict[int, BatchCounts | None] = {}  # this batch's, by Relu input

    def __call__(self, value: Value, array: np.ndarray) -> None:
        key = id(value)
        if key not in self.tracked:
            return
        st = self.stats[value.name]
        relu_of = self.relu_input.get(key)
        source = self.batch_counts.get(relu_of) if relu_of is not None else None
        if source is not None and st.add_relu_of(source):
            return
        if key in self.relu_sources:
            self.batch_counts[key] = st.add(array)
        else:
            st.update(array)

    def finish(self) -> dict[str, TensorStats]:
        stats = self.stats
        for node in self.derived:  # in graph order: a Concat of Concats finds its inputs' statistics
            out = node.outputs[0]
            merged = TensorStats(out.name, self.num_bins)
            for value in _data_inputs(node):
                merged = merged.merge(attrs.evolve(stats[value.name], name=out.name))
            stats[out.name] = merged
        return {name: stats[name] for name in self.order}


Runner = Callable[[dict[str, np.ndarray]], object]


def _qcc_runner(model: Model, observe: Callable[[Value, np.ndarray], None]) -> Runner:
    from qcc.sim.compare import passthrough
    from qcc.sim.interpreter import Interpreter

    return Interpreter(model, observer=observe, kernels={"Quantize": passthrough}).run


def _ort_runner(model: Model, tracked: list[Value], observe: Callable[[Value, np.ndarray], None]) -> Runner:
    try:
        import onnxruntime as ort

        from qcc.formats.onnx_export import OnnxWriter, export_graph, finish, value_info
    except ImportError as exc:
        raise UsageError(f"calibrate{{engine=onnxruntime}} needs onnxruntime and onnx ({exc})") from None
    writer = OnnxWriter(model)
    export_graph(writer)
    proto = finish(writer)
    inputs = {id(v) for v in model.graph.inputs}
    present = {o.name for o in proto.graph.output}
    onnx_values: dict[str, Value] = {}
    for value in tracked:
        if id(value) in inputs:
            continue
        name = writer.name(value)
        onnx_values[name] = value
        if name not in present:
            info = value_info(value)
            info.name = name
            proto.graph.output.append(info)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rank = {id(v): i for i, v in enumerate(tracked)}  # graph order: a Relu's input comes before it
    names = sorted((o.name for o in session.get_outputs() if o.name in onnx_values),
                   key=lambda name: rank[id(onnx_values[name])])
    graph_inputs = [v for v in model.graph.inputs if id(v) in rank]

    def run(batch: dict[str, np.ndarray]) -> None:
        for value in graph_inputs:
            observe(value, batch[value.name])
        for name, array in zip(names, session.run(names, batch)):
            observe(onnx_values[name], array)

    return run


def _check(result: Calibration, model: Model, source: str, ctx: PassContext) -> None:
    """NaN/Inf is an error naming the first tensor that had it; constant tensors are noted."""
    for value in model.graph.values():
        st = result.get(value.name)
        if st is None:
            continue
        if st.nan_count or st.inf_count:
            producer = value.producer()
            where = f" (output of {producer.op} {producer.name!r})" if producer else ""
            raise InvalidInputError(
                f"{source}: the float model computes {st.nan_count} NaN and {st.inf_count} Inf value(s) "
                f"in tensor {value.name!r}{where}; no range can be chosen")
        if st.count and is_constant(st):
            ctx.note("calibration", {"tensor": value.name, "issue": f"constant value {st.max:g} on all "
                                     "calibration data: its range is chosen by the zero-range rule "
                                     "(docs/passes.md)"})
