"""The `calibrate` pass: run the float model on calibration data, keep streaming statistics.

Memory does not grow with the number of samples (onnxruntime #10503, #11020, #21979): each batch
runs through the reference interpreter, an observer folds every float activation into a
fixed-size `TensorStats` (qcc.quant.stats), on its own thread while the next activation is
computed, and the interpreter frees the batch's tensors as it goes. A static-batch model's batches
run whole on one thread per core instead, each observed inline and folded in batch order
(`_SampleThreads`: the same statistics bit for bit). The statistics are a cached analysis (`CalibrationStats`) of the pass manager: a
`Calibration` that merges exactly with another one (other batches, other workers), valid until a
pass changes the graph without preserving it (statistics of a graph that fold-bn has since
changed are never used).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import attrs
import numpy as np
from qcc.passes.float_reference import FloatReference, KeptArrays, fingerprint, values_to_keep
from qcc.passes.quantutil import check_choices, check_finite_params, is_float
from qcc.passes.statistics import Calibration, CalibrationStats, pre_bias_key

from qcc.errors import InvalidInputError, UsageError
from qcc.ir.core import Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.samples import count as samples_in
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.pm.parallel import Workers, process_split, worker_threads
from qcc.quant.ranges import is_constant
from qcc.quant.stats import DEFAULT_NUM_BINS, BatchCounts, TensorStats
from qcc.sim.background import BackgroundObserver
from qcc.sim.split import SplitProducts, float_products, one_blas_thread, product_threads


def _positive(name: str) -> Any:
    def check(_: Any, attribute: Any, value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return check


def _not_negative(_: Any, attribute: Any, value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


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
    pre_bias: bool = attrs.field(default=True, metadata={
        "help": "also the sums before the bias of the target's accumulating kernels (assign-fixed-point "
                "reads them; the affine pipelines turn this off)"})
    reference: int = attrs.field(default=0, validator=_not_negative, metadata={
        "help": "keep the weighted layers' float outputs on the first N samples as bias-correct's reference "
                "(the default pipelines set bias-correct's samples); 0: keep nothing"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        from qcc.data import bind_inputs, calibration_warnings

        if ctx.calib_data is None:
            raise UsageError("pass 'calibrate' needs calibration data (--calib DATA.npz: arrays keyed by "
                             "model input name, samples on each input's samples axis)")
        check_finite_params(model)
        # the target's kernels that saturate their sum before adding the bias: its range matters to
        # assign-fixed-point, and only to it (an int8 compile for C has no use for them)
        pre_bias = ctx.target.fixed_point.truncating_accumulation if self.pre_bias else frozenset()
        source = ctx.calib_name
        if not isinstance(ctx.calib_data, dict):  # batches from Python (qcc.data.DataStream), streamed
            from qcc.data import CalibrationCheck, bound_batches

            if ctx.workers.parallel:
                raise UsageError(f"{source}: calibration on {ctx.workers.describe()} needs the data as arrays (an "
                                 ".npz or a dict) to shard; a stream of batches is read by this process alone")
            check = CalibrationCheck()

            def checked() -> Iterator[dict[str, np.ndarray]]:
                for feeds, _ in bound_batches(model, ctx.calib_data, source, self.batch_size, "pass 'calibrate'"):
                    check.add(feeds)
                    yield feeds

            result = collect_batches(model, checked(), None, self.num_bins, ctx.progress, self.engine, self.batch_size,
                                     pre_bias)
            if not result.samples:
                raise InvalidInputError(f"{source}: no samples (pass 'calibrate')")
            for warning in check.warnings(source):
                ctx.note("warnings", warning)
            return self._store(result, model, source, ctx)
        feeds, _ = bind_inputs(model, dict(ctx.calib_data), source)  # no whole-array temporaries
        for warning in calibration_warnings(feeds, source):
            ctx.note("warnings", warning)
        count = len(next(iter(feeds.values()))) if feeds else 0
        if self.max_samples is not None:
            count = min(count, self.max_samples)
        batch, count = self._batching(model, count, source, ctx)
        feeds = {k: v[:count] for k, v in feeds.items()}
        if ctx.workers.parallel:
            result = collect_sharded(model, feeds, batch, ctx.workers, self.num_bins, self.engine, self.batch_size,
                                     pre_bias)
        else:
            keeper = Keeper(values_to_keep(model), self.reference) if self.reference and self.engine == "qcc" else None
            result = collect(model, feeds, batch, self.num_bins, ctx.progress, self.engine, self.batch_size, pre_bias,
                             keeper)
            if keeper is not None and keeper.arrays:
                ctx.analyses.store(FloatReference, model, KeptArrays(keeper.feeds, keeper.arrays, fingerprint(model)))
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


@attrs.define(eq=False)
class Keeper:
    """What `calibrate{reference=N}` keeps from its first batch (passes/float_reference.py): the
    first `samples` samples of `values`, and of the feeds."""

    values: dict[int, Value]
    samples: int
    feeds: dict[str, np.ndarray] = attrs.field(factory=dict)
    arrays: dict[str, np.ndarray] = attrs.field(factory=dict)

    def first(self, array: np.ndarray) -> np.ndarray:
        return array if len(array) <= self.samples else np.array(array[:self.samples])  # a copy, not a view


def collect(model: Model, feeds: dict[str, np.ndarray], batch: int, num_bins: int = DEFAULT_NUM_BINS,
            progress: bool = False, engine: str = "qcc", rebatch: int | None = None,
            pre_bias: frozenset[str] = frozenset(), keeper: Keeper | None = None) -> Calibration:
    """Statistics of every float activation over samples-first `feeds` (`qcc.data.bind_inputs`), batch by batch.

    engine 'qcc' runs the reference interpreter (no other framework); 'onnxruntime' exports the
    model to ONNX with every tracked tensor as an output and runs it on one thread with the
    weights shared (qcc.runtimes.onnxruntime.calibration_session: same tensors by name, values
    independent of batch and cores; one batch's outputs binned while the next batch runs: two
    alive at most). Either way the binning runs on a thread of its own (qcc.sim.background). `rebatch`: a model whose batch
    dimension is static runs a copy rebound to that many samples when its graph allows
    (qcc.ir.rebatch), with the same statistics. `pre_bias`: ops whose sum before the (constant)
    bias gets statistics too, under `pre_bias_key(output)` (the target's accumulating kernels).
    `keeper`: filled from the first batch, when the model itself runs it (not a rebound copy).
    """
    from qcc.ir.samples import to_model

    count = len(next(iter(feeds.values()))) if feeds else 0
    batches = (to_model(model, {k: v[start:start + batch] for k, v in feeds.items()}) for start in range(0, count, batch))
    threads = product_threads(worker_threads())
    wide = _rebound(model, rebatch, engine) if engine == "qcc" and 1 < threads <= _SAMPLE_THREADS else None
    if wide is not None:
        with one_blas_thread() as held:
            if held:  # a keeper is only ever filled from batches the model itself runs: none here
                return _SampleThreads(model, wide, num_bins, pre_bias, threads).run(batches, count, progress)
    return collect_batches(model, batches, count, num_bins, progress, engine, rebatch, pre_bias, keeper)


def collect_batches(model: Model, batches: Iterable[dict[str, np.ndarray]], total: int | None,
                    num_bins: int = DEFAULT_NUM_BINS, progress: bool = False, engine: str = "qcc",
                    rebatch: int | None = None, pre_bias: frozenset[str] = frozenset(),
                    keeper: Keeper | None = None) -> Calibration:
    """`collect` over batches as they come (a stream of batches is never held whole)."""
    from qcc.progress import progress_bar

    wide = _rebound(model, rebatch, engine)
    small = _Run(model, num_bins, engine, pre_bias)
    big = _Run(wide, num_bins, engine, pre_bias) if wide is not None else None
    size = _batch_of(wide) if wide is not None else 0
    with progress_bar(total, "calibrate", progress) as bar, _closing(small, big):
        for feeds in (_regroup(batches, size) if big is not None else batches):
            done = samples_in(model, feeds)
            if keeper is not None and big is None:
                keeper.feeds = {k: keeper.first(v) for k, v in feeds.items()}
                small.observer.keeper = keeper
            if big is not None and done == size:
                big(feeds)
            elif big is not None:  # the last samples, at the static batch
                step = _batch_of(model)
                for start in range(0, done, step):
                    small({k: v[start:start + step] for k, v in feeds.items()})
            else:
                small(feeds)
            if keeper is not None and small.background is not None:  # after the first batch's observations
                small.background.call(small.observer.stop_keeping)
            keeper = None
            if bar:
                bar(done)
        return big.result().merge(small.result()) if big is not None else small.result()


@contextlib.contextmanager
def _closing(*runs: _Run | None) -> Iterator[None]:
    try:
        yield
    finally:
        for run in runs:
            if run is not None:
                run.close()


def collect_sharded(model: Model, feeds: dict[str, np.ndarray], batch: int, workers: Workers,
                    num_bins: int = DEFAULT_NUM_BINS, engine: str = "qcc",
                    rebatch: int | None = None, pre_bias: frozenset[str] = frozenset()) -> Calibration:
    """`collect` with contiguous shards of the samples on `workers`, merged.

    Shards start on multiples of the batch each process runs (the rebound batch included), so
    every worker runs the very batches the single process would: the merged statistics are
    identical whatever the number of workers or shards (TensorStats.merge is exact). A shard
    costs its worker about 0.02 s to set up (ResNet-50: 0.15 s per sample) and its statistics
    (~10 MB) to send back: local workers get several each (`Workers.shards`)."""
    count = len(next(iter(feeds.values()))) if feeds else 0
    wide = _rebound(model, rebatch, engine)
    step = _batch_of(wide) if wide is not None else batch
    groups = -(-count // step)
    slots = min(workers.shards(cheap=True), groups)
    bounds = [min(count, step * (groups * i // slots)) for i in range(slots + 1)]
    shards = [_Shard(model, {k: v[a:b] for k, v in feeds.items()}, batch, num_bins, engine, rebatch, pre_bias)
              for a, b in itertools.pairwise(bounds) if b > a]
    results = workers.map(_calibrate_shard, shards)
    merged = results[0]
    for part in results[1:]:
        merged = merged.merge(part)
    return merged


@attrs.frozen(eq=False)
class _Shard:
    model: Model
    feeds: dict[str, np.ndarray]
    batch: int
    num_bins: int
    engine: str
    rebatch: int | None
    pre_bias: frozenset[str]


def _calibrate_shard(shard: _Shard) -> Calibration:
    return collect(shard.model, shard.feeds, shard.batch, shard.num_bins, False, shard.engine, shard.rebatch,
                   shard.pre_bias)


class _Run:
    """One model's runner and observer; the runner is built at the first batch (an onnxruntime
    session costs seconds: the rebound model's may be the only one used)."""

    def __init__(self, model: Model, num_bins: int, engine: str, pre_bias: frozenset[str] = frozenset()) -> None:
        self.model, self.num_bins, self.engine = model, num_bins, engine
        self.observer = _Observer(model, num_bins, pre_bias)
        self.runner: Runner | None = None
        self.background: BackgroundObserver | None = None
        self.split: SplitProducts | None = None
        self.samples = 0

    def __call__(self, feeds: dict[str, np.ndarray]) -> None:
        if self.runner is None:
            observed = list(self.observer.tracked.values())
            # onnxruntime hands over a whole batch at once: room for it, binned while the next batch runs
            depth = len(observed) + 1 if self.engine == "onnxruntime" else 4
            self.background = BackgroundObserver(self.observer, depth)
            if self.engine == "onnxruntime":
                self.runner = _ort_runner(self.model, observed, self.background)
            else:
                self.split = process_split()
                self.runner = _qcc_runner(self.model, self.background, self.split)
        assert self.background is not None
        self.background.call(self.observer.batch_counts.clear)  # in order with the observations
        self.runner(feeds)
        self.samples += samples_in(self.model, feeds)

    def close(self) -> None:
        if self.background is not None:
            self.background.close()
            self.background = None
        if self.split is not None:
            self.split.close()
            self.split = None

    def result(self) -> Calibration:
        if self.background is not None:
            self.background.drain()
        return Calibration(self.observer.finish(), self.samples)


_SAMPLE_THREADS = 4
"""Cores up to which a static-batch model's batches run whole on one thread per core: each thread
holds a batch of activations (the rebound batch is at least one sample per core), so the memory in
flight grows with the square of the cores; beyond this many, a batch's products are split over all
of them as before (one batch in flight)."""


class _SampleThreads:
    """The interpreter's calibration with each thread running whole batches of the rebound model.

    `collect_batches` runs one batch at a time: its products split by samples over the threads,
    everything else (Relu, Add, pooling: a tenth of ResNet-50's CPU) in the calling thread and
    the binning on a third thread, so the cores wait for each other at every layer. Here each of
    `threads` threads takes the next batch, runs it through an interpreter of its own (products cut
    into the same parts as `SplitProducts(threads)` cuts them, computed one after another: same
    calls on the same slices, same bits) and observes it inline into statistics of that batch
    alone; the batches' statistics are folded in batch order (`TensorStats.absorb`, exact), so the
    result is bit for bit `collect_batches`'s: min/max ties of -0.0 and +0.0 included, which
    depend on the order values are met. At most 2 * threads batches' statistics wait to be folded.
    """

    def __init__(self, model: Model, wide: Model, num_bins: int, pre_bias: frozenset[str], threads: int) -> None:
        self.models = {True: wide, False: model}
        self.totals = {True: _Observer(wide, num_bins, pre_bias), False: _Observer(model, num_bins, pre_bias)}
        self.samples = {True: 0, False: 0}
        self.size, self.step, self.threads = _batch_of(wide), _batch_of(model), threads
        self.cond = threading.Condition()
        self.handed = self.folded = self.folded_samples = 0
        self.pending: dict[int, tuple[bool, _Observer, int]] = {}
        self.errors: dict[int, BaseException] = {}
        self.exhausted = False
        self.source: Iterator[dict[str, np.ndarray]] = iter(())

    def run(self, batches: Iterable[dict[str, np.ndarray]], total: int | None, progress: bool) -> Calibration:
        from qcc.progress import progress_bar

        self.source = _regroup(batches, self.size)
        others = [threading.Thread(target=self._work, name="qcc-calibrate", daemon=True)
                  for _ in range(self.threads - 1)]
        with progress_bar(total, "calibrate", progress) as bar:
            for thread in others:
                thread.start()
            try:
                self._work(bar)
            finally:
                with self.cond:
                    self.exhausted = True
                    self.cond.notify_all()
                for thread in others:
                    thread.join()
            if self.errors:
                raise self.errors[min(self.errors)]
            if bar and self.folded_samples > self._shown:
                bar(self.folded_samples - self._shown)
        big = Calibration(self.totals[True].finish(), self.samples[True])
        return big.merge(Calibration(self.totals[False].finish(), self.samples[False]))

    _shown = 0

    def _work(self, bar: Callable[[int], object] | None = None) -> None:
        split = SplitProducts(self.threads, inline=True)
        current: list[_Observer] = []
        runners: dict[bool, Runner] = {}

        def observe(value: Value, array: np.ndarray) -> None:
            current[0](value, array)

        while True:
            with self.cond:
                while not (self.errors or self.exhausted) and self.handed - self.folded >= 2 * self.threads:
                    self.cond.wait()
                if self.errors or self.exhausted:
                    return
                index = self.handed
                try:
                    feeds = next(self.source)
                except StopIteration:
                    self.exhausted = True
                    self.cond.notify_all()
                    return
                except BaseException as exc:
                    self.errors[index] = exc
                    self.cond.notify_all()
                    return
                self.handed += 1
            try:
                done = samples_in(self.models[False], feeds)
                wide = done == self.size
                current[:] = [self.totals[wide].fresh()]
                if wide not in runners:
                    runners[wide] = _qcc_runner(self.models[wide], observe, split)
                if wide:
                    runners[wide](feeds)
                else:  # the last samples, at the static batch
                    for start in range(0, done, self.step):
                        current[0].batch_counts.clear()
                        runners[wide]({k: v[start:start + self.step] for k, v in feeds.items()})
            except BaseException as exc:
                with self.cond:
                    self.errors[index] = exc
                    self.cond.notify_all()
                return
            with self.cond:
                self.pending[index] = (wide, current[0], done)
                try:
                    while self.folded in self.pending:
                        kind, observer, count = self.pending.pop(self.folded)
                        self.totals[kind].absorb(observer)
                        self.samples[kind] += count
                        self.folded += 1
                        self.folded_samples += count
                except BaseException as exc:  # never leave the other threads waiting for this fold
                    self.errors[self.folded] = exc
                    return
                finally:
                    self.cond.notify_all()
                shown = self.folded_samples - self._shown
                if bar and shown:
                    self._shown = self.folded_samples
            if bar and shown:
                bar(shown)


def _rebound(model: Model, rebatch: int | None, engine: str = "qcc") -> Model | None:
    """The model rebound to `rebatch` samples (rounded down to a multiple of its static batch),
    or None (no static batch, nothing to gain, or a graph that mixes samples).

    The interpreter gets at least a sample per product thread (qcc.sim.split); onnxruntime, on
    one thread, only what stays in cache: a wider batch of large activations costs it time
    (ResNet-50 and DenseNet-121 at 224x224, 8 samples: 1.6 vs 1.7x and 1.9 vs 2.2x one plain ORT
    pass in CPU at batch 1 vs 2), and one batch of outputs is binned while the next runs, so
    smaller batches overlap better."""
    from qcc.ir.rebatch import rebatched
    from qcc.ir.samples import is_default, sample_axes

    inputs = model.graph.inputs
    if rebatch is None or not inputs or not is_default(sample_axes(model)) or not all(v.type.rank and isinstance(v.type.shape[0], int) for v in inputs):
        return None
    static = int(inputs[0].type.shape[0])
    largest = max((_nbytes(v) for n in model.graph.nodes for v in n.outputs), default=0)
    # batches of the static size that stay in cache, or one per thread of the products (qcc.sim.split)
    threads = product_threads(worker_threads()) if engine == "qcc" else 1
    fits = max(threads, _REBATCH_BYTES // max(largest, 1))
    wanted = static * min(rebatch // static, fits) if static else 0
    return rebatched(model, wanted) if wanted > static else None


_REBATCH_BYTES = 4 << 20
"""A rebound batch keeps its largest activation under this: a wider batch only saves per-call
overhead (small models), while tensors that leave the cache cost more than it saves (ResNet-50's
3 MB first activations run no faster 8 at a time)."""


def _nbytes(value: Value) -> int:
    from qcc.ir.types import DTYPES

    dims = [d for d in value.type.shape if isinstance(d, int)]
    if len(dims) != value.type.rank:
        return 0
    return math.prod(dims) * DTYPES[value.type.dtype].itemsize


def _batch_of(model: Model) -> int:
    return int(model.graph.inputs[0].type.shape[0])


def _regroup(batches: Iterable[dict[str, np.ndarray]], size: int) -> Iterator[dict[str, np.ndarray]]:
    """The same samples in batches of `size` (the last one shorter)."""
    pending: list[dict[str, np.ndarray]] = []
    held = 0
    for feeds in batches:
        pending.append(feeds)
        held += len(next(iter(feeds.values())))
        while held >= size:
            joined = {k: np.concatenate([p[k] for p in pending]) if len(pending) > 1 else pending[0][k]
                      for k in pending[0]}
            yield {k: v[:size] for k, v in joined.items()}
            rest = {k: v[size:] for k, v in joined.items()}
            held -= size
            pending = [rest] if held else []
    if held:
        yield {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}


def _data_inputs(node: Node) -> list[Value]:
    return [v for v in (node.inputs if node.op == "Concat" else node.inputs[:1]) if v is not None]


def _adds_bias_last(node: Node) -> bool:
    """A layer with a constant bias on its output's axis 1 (Conv, Dense)."""
    index = get_schema(node.op).bias_input
    bias = node.inputs[index] if index is not None and len(node.inputs) > index else None
    return bias is not None and bias.is_const and len(node.outputs) == 1


def _channel_bias(node: Node) -> np.ndarray:
    bias = node.inputs[get_schema(node.op).bias_input or 0]
    assert bias is not None and bias.const is not None
    rank = node.outputs[0].type.rank
    return np.asarray(bias.const, dtype=np.float32).reshape((1, -1) + (1,) * (rank - 2))


class _Observer:
    """Folds each computed float tensor into its TensorStats, skipping the passes it can.

    Statistics of a multiset of values merge exactly (qcc.quant.stats), so a Concat output or a
    reshaped tensor is never read: at the end it gets the merge of its inputs' statistics, bin
    for bin what observing it would give (DenseNet's growing Concat outputs are a quarter of
    what it computes). A Relu output is accounted from its input's histogram of the same batch
    when the bins line up (TensorStats.add_relu_of), and observed otherwise.
    """

    def __init__(self, model: Model, num_bins: int, pre_bias: frozenset[str] = frozenset()) -> None:
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
        self.pre_bias = {id(n.outputs[0]): (pre_bias_key(n.outputs[0].name), _channel_bias(n)) for n in graph.nodes
                         if n.op in pre_bias and _adds_bias_last(n) and id(n.outputs[0]) in tracked}
        for name, _ in self.pre_bias.values():
            self.stats[name] = TensorStats(name, num_bins)
            self.order.append(name)
        self.relu_input = {id(n.outputs[0]): id(n.inputs[0]) for n in graph.nodes
                           if n.op == "Relu" and id(n.outputs[0]) in tracked and id(n.inputs[0]) in tracked}
        self.relu_sources = set(self.relu_input.values())
        self.batch_counts: dict[int, BatchCounts | None] = {}  # this batch's, by Relu input
        self.keeper: Keeper | None = None

    def fresh(self) -> _Observer:
        """An observer of the same tensors with empty statistics (one batch's, on a thread of its own)."""
        other = copy.copy(self)
        other.stats = {name: TensorStats(name, self.num_bins) for name in self.stats}
        other.batch_counts = {}
        other.keeper = None
        return other

    def absorb(self, other: _Observer) -> None:
        """Fold `other`'s statistics (a fresh() observer's, of later samples) into these, exactly."""
        for name, st in other.stats.items():
            self.stats[name].absorb(st)

    def stop_keeping(self) -> None:
        """Called on the binning thread, in order with the observations (the first batch's are kept)."""
        self.keeper = None

    def __call__(self, value: Value, array: np.ndarray) -> None:
        key = id(value)
        keeper = self.keeper
        if keeper is not None and key in keeper.values:
            keeper.arrays[value.name] = keeper.first(array)
        if key not in self.tracked:
            return
        pre = self.pre_bias.get(key)
        if pre is not None:
            self.stats[pre[0]].update(np.asarray(array) - pre[1])
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


def _qcc_runner(model: Model, observe: Callable[[Value, np.ndarray], None], split: SplitProducts) -> Runner:
    from qcc.sim.compare import passthrough
    from qcc.sim.interpreter import Interpreter

    return Interpreter(model, observer=observe, kernels={**float_products(split), "Quantize": passthrough}).run


def _ort_runner(model: Model, tracked: list[Value], observe: Callable[[Value, np.ndarray], None]) -> Runner:
    try:
        import onnxruntime  # noqa: F401  (a missing one is a usage error here, not at the session)

        from qcc.formats.onnx_export import OnnxWriter, export_graph, finish, value_info
        from qcc.runtimes.onnxruntime import calibration_session
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
    session = calibration_session(proto, {v.name: v.const for v in model.graph.values() if v.const is not None})
    rank = {id(v): i for i, v in enumerate(tracked)}  # graph order: a Relu's input comes before it
    names = sorted((o.name for o in session.session.get_outputs() if o.name in onnx_values),
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
