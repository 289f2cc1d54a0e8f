"""The `equalize` pass: cross-layer equalization and high-bias absorption (Nagel et al. 2019).

Per-tensor weight scales (and fixed point's one position per tensor) break when folding a
BatchNorm leaves a layer's output channels orders of magnitude apart: a channel whose running
variance was near zero (a dead channel, MobileNetV2) gets a filter hundreds of times larger
than the others, and every other filter rounds to a few levels. For two layers A -> B with
only a clamping activation (ReLU, ReLU6) or pooling between them, on every channel c:

1. **Dead channels.** When A's channel c is provably constant (A's filter is all zero: the
   channel is act(bias)) or is below the clamp's floor on every calibration sample, B reads a
   constant k there: k * sum(B's weights on c) moves into B's bias (needs k = 0 or a B that
   reads no padding), B's weights on c and A's filter c become zero. Exact for the provable
   case, exact on the data for the observed one (reported).
2. **Equalization.** A's channel c is divided by s_c and B's input channel c multiplied by it,
   s_c = sqrt(r1_c / r2_c) (qcc.quant.equalize), iterated over all pairs until the scales
   settle. A clamp with an upper bound limits s_c so that it stays exact on the data.
3. **High-bias absorption.** For A -> clamp(0, hi) -> B with B reading no padding, the shift
   c = the channel's minimum on the data (when positive and the clamp's top is never reached)
   leaves A's bias for B's: act(x - c) == act(x) - c there. Without data, c = max(0, mean -
   3 std) of the BatchNorm fold-bn folded into A (DFQ's data-free rule, approximate).

Runs before `calibrate` (statistics must describe the equalized model). Report section
`equalize`: one entry per pair with its scale range and the channels it changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np
from qcc.passes.channel_fold import (
    fold_input_affine,
    fold_output_affine,
    input_ranges,
    input_shift_bias,
    input_view,
    layer_bias,
    layer_weight,
    output_channels,
    output_ranges,
    output_view,
    reads_padding,
    set_layer_bias,
)
from qcc.passes.fold_bn import BN_STATS
from qcc.passes.quantutil import (
    at_least,
    calibration_batches,
    clamp_bounds,
    commutes_with_channel_scale,
    folds_channels,
)

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.quant.equalize import (
    OBSERVED_INPUT_VALUES,
    absorbable_shift,
    clamp_scale_limits,
    cle_scales,
    limit_scales,
    normal_shift,
    scale_floor,
)
from qcc.quant.stats import channel_min_max

SECTION = "equalize"


@attrs.define(eq=False)
class Pair:
    """Layers a -> b with channel-preserving nodes between (at most one clamp)."""

    a: Node
    b: Node
    between: tuple[Node, ...]
    channels: int
    total: np.ndarray = attrs.field(init=False)  # divisor applied to a's output channels so far
    data_lo: np.ndarray | None = None  # per channel, of the clamp's input (before any scaling)
    data_hi: np.ndarray | None = None
    dead: int = 0
    absorbed: int = 0
    limited: int = 0
    smin: np.ndarray | None = None  # bounds on `total` that keep the clamp exact
    smax: np.ndarray | None = None
    floor: np.ndarray | None = None  # scale_floor(smin), kept across the sweeps

    def __attrs_post_init__(self) -> None:
        self.total = np.ones(self.channels)

    @property
    def clamp(self) -> Node | None:
        return next((n for n in self.between if clamp_bounds(n) is not None), None)

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        clamp = self.clamp
        return (None, None) if clamp is None else clamp_bounds(clamp)  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return " -> ".join([self.a.name, *(n.op for n in self.between), self.b.name])


@attrs.frozen
class Equalize(Pass):
    """Cross-layer equalization, dead-channel cleanup and high-bias absorption (before calibrate)."""

    name = "equalize"

    iterations: int = attrs.field(default=20, validator=at_least(1), metadata={"help": "equalization sweeps at most"})
    tolerance: float = attrs.field(default=1e-2, validator=attrs.validators.gt(0), metadata={
        "help": "stop the sweeps once no scale moves by more than this (|log s|)"})
    absorb_bias: bool = attrs.field(default=True, metadata={"help": "high-bias absorption"})
    dead_channels: bool = attrs.field(default=True, metadata={"help": "zero what reads a dead channel"})
    samples: int = attrs.field(default=32, validator=at_least(1),
                               metadata={"help": "calibration samples for per-channel ranges"})
    input_values: int = attrs.field(default=OBSERVED_INPUT_VALUES, validator=at_least(1), metadata={
        "help": "fewer samples when they are large: at most this many input values in all, at least 4 samples"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        pairs = find_pairs(graph)
        if not pairs:
            return PassResult.unchanged(model)
        self._observe(model, pairs, ctx)
        work = _Weights(pairs)
        for pair in pairs:
            if self.dead_channels:
                _remove_dead(pair, work)
        for pair in pairs:
            pair.smin, pair.smax = self._limits(pair, ctx)
            pair.floor = scale_floor(pair.smin)
            pair.limited = int(np.count_nonzero(pair.smax < np.inf))
        for _ in range(self.iterations):
            moved = max(_equalize(pair, work) for pair in pairs)
            if moved < self.tolerance:
                break
        if self.absorb_bias:
            for pair in pairs:
                _absorb(pair, work)
        changed = work.write(graph)
        for pair in pairs:
            ctx.note(SECTION, _entry(pair))
        return PassResult(model, changed, frozenset() if changed else frozenset({"*"}))

    def _observe(self, model: Model, pairs: list[Pair], ctx: PassContext) -> None:
        """Per-channel min/max of each clamp's input on the first calibration samples (when given;
        fewer of them when they are large, `qcc.quant.samples`)."""
        wanted = {id(p.clamp.input(0)): p for p in pairs if p.clamp is not None}
        if not wanted or ctx.calib_data is None:
            return
        from qcc.pm.parallel import process_split
        from qcc.sim.background import BackgroundObserver
        from qcc.sim.compare import passthrough
        from qcc.sim.interpreter import Interpreter
        from qcc.sim.split import float_products

        def observe(value: Value, array: np.ndarray) -> None:
            pair = wanted.get(id(value))
            if pair is None:
                return
            lo, hi = channel_min_max(array)
            lo, hi = lo.astype(np.float64), hi.astype(np.float64)
            pair.data_lo = lo if pair.data_lo is None else np.minimum(pair.data_lo, lo)
            pair.data_hi = hi if pair.data_hi is None else np.maximum(pair.data_hi, hi)

        # the products on calibrate's sample-split threads, the ranges on a thread of their own
        # (in order: the same minima and maxima): this run is half of what the pass costs
        split = process_split()
        background = BackgroundObserver(observe)
        try:
            kernels = _skipping(model.graph, {**float_products(split, rows_alone=False), "Quantize": passthrough},
                                [p.clamp.input(0) for p in pairs if p.clamp is not None])
            interp = Interpreter(model, kernels=kernels, observer=lambda value, array: background(value, array)
                                 if id(value) in wanted else None)
            for batch in calibration_batches(model, ctx, self.samples, 64, self.input_values):
                interp.run(batch)
            background.drain()
        finally:
            background.close()
            split.close()

    def _limits(self, pair: Pair, ctx: PassContext) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = pair.bounds
        smin, smax = clamp_scale_limits(pair.data_lo, pair.data_hi, lo, hi, pair.channels)
        if pair.clamp is not None and pair.data_hi is None and np.all(smax == 1.0):
            ctx.note(SECTION, f"{pair.name}: {pair.clamp.op} bounds the values and there is no calibration "
                     "data to show it is inactive: not equalized")
        return smin, smax


def _skipping(graph: Graph, kernels: dict[str, Any], values: list[Value]) -> dict[str, Any]:
    """`kernels` (by op; the schemas' where absent) with the nodes no value of `values` depends on
    left out: they return empty arrays (nothing reads them but nodes left out too, and the
    observer looks only at `values`). The run then stops where the last clamp input is computed
    (MobileNetV2: the last ReLU6, the pooling and the classifier are not run)."""
    needed: set[int] = set()
    todo = [v.producer() for v in values]
    while todo:
        node = todo.pop()
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        todo.extend(v.producer() for v in node.inputs if v is not None)
    skipped = {id(n) for n in graph.nodes if id(n) not in needed}
    if not skipped:
        return kernels
    out = dict(kernels)
    for op in {n.op for n in graph.nodes if id(n) in skipped}:
        out[op] = _skip_nodes(kernels.get(op) or get_schema(op).kernel, skipped)
    return out


def _skip_nodes(kernel: Any, skipped: set[int]) -> Any:
    def run(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if id(node) in skipped:
            return [_NOT_RUN] * len(node.outputs)
        return kernel(node, arrays)  # type: ignore[no-any-return]

    return run


_NOT_RUN = np.empty(0, np.float32)
"""What a node `_skipping` leaves out returns for each output."""


def find_pairs(graph: Graph) -> list[Pair]:
    """Every a -> (clamp | pooling | channel-keeping view)* -> b of foldable layers, one reader each."""
    pairs = []
    outputs = {id(v) for v in graph.outputs}
    for a in graph.nodes:
        if not folds_channels(a):
            continue
        value, between = a.outputs[0], list[Node]()
        while id(value) not in outputs and len(uses := value.uses()) == 1:
            reader = uses[0][0]
            if folds_channels(reader) and uses[0][1] == 0:
                w = layer_weight(a).const
                assert w is not None
                channels = output_channels(a, w)
                if reader.input(0).type.shape[1] == channels and sum(
                        clamp_bounds(n) is not None for n in between) <= 1:
                    pairs.append(Pair(a, reader, tuple(between), channels))
                break
            if clamp_bounds(reader) is None and not commutes_with_channel_scale(reader):
                break
            between.append(reader)
            value = reader.outputs[0]
    return pairs


class _Weights:
    """float64 working copies of every layer the pairs touch, written back once.

    The sweeps scale them in place and keep each layer's per-channel ranges (max |W| per output
    and per input channel) up to date without reading the weights again where that is exact:
    rounding is monotone and symmetric, so for f > 0 max_i |fl(w_i * f)| == fl(max_i |w_i| * f),
    and a range whose channels were all multiplied by one factor each is the old range times
    that factor, bit for bit. A scaling along the other axis invalidates it (each element of a
    channel got a different factor), except on a depthwise layer, whose input channel c and
    output channel c are the same weights.

    A scaling whose weights nobody reads before the next one waits (`pending`): a layer scaled on
    one axis only (ResNet's first and last 1x1 convolutions of a block, a classifier) gets its 20
    multiplications in one cache-sized block of rows at a time, in the same order, at the end."""

    def __init__(self, pairs: Iterable[Pair]) -> None:
        self.arrays: dict[int, tuple[Node, np.ndarray, np.ndarray]] = {}
        self.stats: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.changed: set[int] = set()
        self.ranges: dict[tuple[int, str], np.ndarray] = {}
        self.pending: dict[int, list[np.ndarray]] = {}  # weight-broadcastable factors, in order
        self.layouts: dict[int, tuple[int, int, bool]] = {}
        for pair in pairs:
            for layer in (pair.a, pair.b):
                w = layer_weight(layer).const
                assert w is not None
                self.arrays[id(layer)] = (layer, w.astype(np.float64), layer_bias(layer, output_channels(layer, w)))
            stats = pair.a.outputs[0].meta.get(BN_STATS)
            if stats is not None:
                self.stats[id(pair.a)] = (np.array(stats[0]), np.array(stats[1]))

    def get(self, layer: Node) -> tuple[np.ndarray, np.ndarray]:
        self._flush(layer)
        _, w, b = self.arrays[id(layer)]
        return w, b

    def _flush(self, layer: Node, want: str | None = None, channels: int = 0) -> np.ndarray | None:
        """Apply the pending multiplications of the layer's weight, block of rows by block; with
        `want` ("out" or "in"), also that range of the result (max |W| per output or input channel)
        while each block is in cache, where the layout allows (`_blocked`; else None). Maxima are
        exact in any order: the same values as output_ranges / input_ranges of the whole weight,
        one pass over it instead of three (multiply, abs into a copy, reduce)."""
        factors = self.pending.pop(id(layer), [])
        w = self.arrays[id(layer)][1]
        if len(factors) >= _SUBSET_FACTORS and _multiply_moving(w, factors):
            factors = []
        mode = _blocked(layer, w, want, channels) if want is not None else None
        if not factors and mode is None:
            return None
        rows = int(w.shape[0])
        step = max(1, _BLOCK // max(1, w[0].size))
        scratch = np.empty((min(step, rows), w[0].size)) if mode is not None else None
        parts: list[np.ndarray] = []
        for start in range(0, rows, step):
            block = w[start:start + step]
            _multiply_block(block, factors, start, rows)
            if scratch is not None:
                n = int(block.shape[0])
                a = np.abs(block.reshape(n, -1), out=scratch[:n])
                if mode == "rows":
                    parts.append(a.max(axis=1))
                elif parts:
                    np.maximum(parts[0], a.max(axis=0), out=parts[0])
                else:
                    parts.append(a.max(axis=0))
        if mode == "rows":
            return np.concatenate(parts)
        if mode == "cols":
            return np.asarray(parts[0].reshape(int(w.shape[1]), -1).max(axis=1))
        return None

    def set(self, layer: Node, w: np.ndarray, b: np.ndarray) -> None:
        assert id(layer) not in self.pending, "set() after get(): the weights read were complete"
        self.arrays[id(layer)] = (layer, w, b)
        self.changed.add(id(layer))
        self.ranges.pop((id(layer), "out"), None)
        self.ranges.pop((id(layer), "in"), None)

    def out_range(self, layer: Node) -> np.ndarray:
        """max |W| per output channel (`output_ranges`)."""
        key = (id(layer), "out")
        if key not in self.ranges:
            r = self._flush(layer, "out")
            self.ranges[key] = r if r is not None else output_ranges(layer, self.arrays[id(layer)][1])
        return self.ranges[key]

    def in_range(self, layer: Node, channels: int) -> np.ndarray:
        """max |W| per input channel (`input_ranges`)."""
        key = (id(layer), "in")
        if key not in self.ranges:
            r = self._flush(layer, "in", channels)
            self.ranges[key] = r if r is not None else _input_ranges(layer, self.arrays[id(layer)][1], channels)
        return self.ranges[key]

    def scale_out(self, layer: Node, s: np.ndarray) -> None:
        """fold_output_affine(layer, w, b, s, 0), the weight multiplied in place (same bits)."""
        _, w, b = self.arrays[id(layer)]
        self.pending.setdefault(id(layer), []).append(self._factors(layer, w, "out", s))
        self.arrays[id(layer)] = (layer, w, b * s + 0.0)  # + t = 0: -0.0 becomes 0.0 as there
        self.changed.add(id(layer))
        self._rescale(layer, w, "out", s)

    def scale_in(self, layer: Node, s: np.ndarray) -> None:
        """fold_input_affine(layer, w, b, s, 0), the weight multiplied in place (same bits)."""
        _, w, _ = self.arrays[id(layer)]
        self.pending.setdefault(id(layer), []).append(self._factors(layer, w, "in", s))
        self.changed.add(id(layer))
        self._rescale(layer, w, "in", s)

    def _layout(self, layer: Node, w: np.ndarray) -> tuple[int, int, bool]:
        """(weight's output axis, groups, depthwise) of a layer, looked up once (the sweeps ask
        for them twice per pair and step)."""
        key = id(layer)
        if key not in self.layouts:
            out_axis = get_schema(layer.op).weight_axis
            assert out_axis is not None
            self.layouts[key] = (out_axis, int(layer.attrs.get("group", 1)), _depthwise(layer, w))
        return self.layouts[key]

    def _factors(self, layer: Node, w: np.ndarray, side: str, s: np.ndarray) -> np.ndarray:
        """s laid over the weight's output ("out") or input channels: output_view / input_view's
        values, as a broadcastable array where one exists (no weight-sized copy kept per sweep)."""
        out_axis, group, _ = self._layout(layer, w)
        axis = out_axis if side == "out" else 1 - out_axis
        if axis == 0:
            return s.reshape(-1, *([1] * (w.ndim - 1)))
        if group == 1:
            return s.reshape(1, -1, *([1] * (w.ndim - 2)))
        return output_view(layer, w, s) if side == "out" else input_view(layer, w, s)

    def _rescale(self, layer: Node, w: np.ndarray, axis: str, s: np.ndarray) -> None:
        other = "in" if axis == "out" else "out"
        same = self._layout(layer, w)[2]
        for side in (axis, other) if same else (axis,):
            if (id(layer), side) in self.ranges:
                self.ranges[(id(layer), side)] = self.ranges[(id(layer), side)] * s
        if not same:
            self.ranges.pop((id(layer), other), None)

    def write(self, graph: Graph) -> bool:
        for key in self.changed:
            self._flush(self.arrays[key][0])
            layer, w, b = self.arrays[key]
            weight = layer_weight(layer)
            assert weight.const is not None
            weight.const = np.ascontiguousarray(w.astype(weight.const.dtype))
            set_layer_bias(graph, layer, b)
        for key, (mean, std) in self.stats.items():
            layer = self.arrays[key][0]
            layer.outputs[0].meta[BN_STATS] = (mean, std)
        return bool(self.changed)


def _input_ranges(layer: Node, w: np.ndarray, channels: int) -> np.ndarray:
    """input_ranges's values (maxima: exact in any order): for one group and a C-ordered weight
    whose input channels are axis 1, the rows' elementwise maximum first (a contiguous stream),
    then each channel's taps, instead of numpy's strided reduction over axes 0 and 2-3."""
    if get_schema(layer.op).weight_axis != 0 or int(layer.attrs.get("group", 1)) != 1 \
            or not w.flags.c_contiguous or w.ndim < 2 or int(w.shape[1]) != channels:
        return input_ranges(layer, w, channels)
    rows = int(w.shape[0])
    per_row = np.abs(w).reshape(rows, -1).max(axis=0)
    return np.asarray(per_row.reshape(channels, -1).max(axis=1))


def _blocked(layer: Node, w: np.ndarray, want: str, channels: int) -> str | None:
    """How `_flush` reduces a range block by block: "rows" (each wanted channel is a row of a
    C-ordered weight: the output channels of a weight whose output axis is 0, the input
    channels of one whose output axis is 1 (Dense, ConvTranspose), a depthwise layer's input
    channels), "cols" (the channels of axis 1 of a one-group weight: the rows' elementwise
    maximum, then each channel's taps), None (any other layout: the whole-weight reduction).
    The same maxima as output_ranges / input_ranges, without their |W| copy of the weight."""
    axis = get_schema(layer.op).weight_axis
    if axis not in (0, 1) or not w.flags.c_contiguous or w.ndim < 2:
        return None
    if (want == "out") == (axis == 0):  # the wanted channels are axis 0
        return "rows" if want == "out" or int(w.shape[0]) == channels else None
    if want == "in" and _depthwise(layer, w):
        return "rows"
    if int(layer.attrs.get("group", 1)) == 1 and (want == "out" or int(w.shape[1]) == channels):
        return "cols"
    return None


def _multiply_moving(w: np.ndarray, factors: list[np.ndarray]) -> bool:
    """Apply factors that all scale whole rows (axis 0) or all whole columns (axis 1) to only
    the rows or columns some factor moves, when that is at most `_SUBSET_SHARE` of them: a
    channel that reaches its clamp keeps scale 1.0 in every sweep (about half of MobileNetV2's),
    and x * 1.0 == x bit for bit. The others get every factor, in order, as in `_flush`.
    False when the factors do not have that form or move too many (nothing done)."""
    axis = _factor_axis(w, factors)
    if axis is None:
        return False
    per = np.stack([f.reshape(-1) for f in factors])
    moving = np.flatnonzero(np.any(per != 1.0, axis=0))
    if moving.size > _SUBSET_SHARE * per.shape[1]:
        return False
    if moving.size:
        sub = np.take(w, moving, axis=axis)
        _multiply_blocks(sub, [np.take(f, moving, axis=axis) for f in factors])
        if axis == 0:
            w[moving] = sub
        else:
            w[:, moving] = sub
    return True


def _factor_axis(w: np.ndarray, factors: list[np.ndarray]) -> int | None:
    """0 or 1 when every factor has one value per row or per column of `w` (1 elsewhere)."""
    for axis in (0, 1):
        shape = tuple(int(w.shape[axis]) if a == axis else 1 for a in range(w.ndim))
        if all(f.shape == shape for f in factors):
            return axis
    return None


def _multiply_blocks(a: np.ndarray, factors: list[np.ndarray]) -> None:
    """a *= each factor in turn (weight-broadcastable), in cache-sized blocks of rows."""
    rows = int(a.shape[0])
    step = max(1, _BLOCK // max(1, a[0].size))
    for start in range(0, rows, step):
        _multiply_block(a[start:start + step], factors, start, rows)


def _multiply_block(block: np.ndarray, factors: list[np.ndarray], start: int, rows: int) -> None:
    """The rows from `start` of a `rows`-row weight (`block`) times each factor in turn, in place."""
    for f in factors:
        np.multiply(block, f[start:start + len(block)] if f.shape[0] == rows else f, out=block)


_SUBSET_FACTORS = 4
"""Pending multiplications from which `_multiply_moving` looks for the channels they move."""
_SUBSET_SHARE = 0.75
"""At most this share of the channels moving: gathering and scattering them is worth it."""
_BLOCK = 1 << 15
"""float64 weights (256 KB) that get all their pending multiplications while in cache."""


def _depthwise(layer: Node, w: np.ndarray) -> bool:
    """Whether input channel c and output channel c are the same weights: a Conv (output axis 0)
    with one input channel per group and one group per output channel."""
    group = int(layer.attrs.get("group", 1))
    return get_schema(layer.op).weight_axis == 0 and w.ndim >= 2 and int(w.shape[1]) == 1 \
        and group == int(w.shape[0]) > 1


def _constant_channels(pair: Pair, work: _Weights) -> np.ndarray:
    """Per channel, the constant b reads (NaN where not constant): provably, or on the data."""
    b = work.get(pair.a)[1]
    lo = pair.bounds[0]
    zero_filter = work.out_range(pair.a) == 0  # the sweeps' first step reuses it
    k = np.where(zero_filter, b, np.nan)
    for node in pair.between:
        bounds = clamp_bounds(node)
        if bounds is not None:
            k = np.clip(k, -np.inf if bounds[0] is None else bounds[0], np.inf if bounds[1] is None else bounds[1])
        elif node.attrs.get("count_include_pad") and any(node.attrs.get("pads", ())):
            k = np.where(k == 0, 0.0, np.nan)  # padding averages zeros into a nonzero constant
    if lo == 0 and pair.data_hi is not None:
        k = np.where(np.isnan(k) & (pair.data_hi <= 0), 0.0, k)  # never above the floor: reads 0
    return k


def _remove_dead(pair: Pair, work: _Weights) -> None:
    k = _constant_channels(pair, work)
    usable = ~np.isnan(k) & ((k == 0) | (not reads_padding(pair.b)))
    usable &= work.in_range(pair.b, pair.channels) > 0  # b still reads them
    if not usable.any():
        return
    keep = np.where(usable, 0.0, 1.0)
    wb, bb = work.get(pair.b)
    work.set(pair.b, *fold_input_affine(pair.b, wb, bb, keep, np.where(usable, k, 0.0)))
    wa, ba = work.get(pair.a)
    work.set(pair.a, *fold_output_affine(pair.a, wa, ba, keep, np.zeros(pair.channels)))
    if id(pair.a) in work.stats:
        mean, std = work.stats[id(pair.a)]
        work.stats[id(pair.a)] = (mean * keep, std * keep)
    pair.dead = int(np.count_nonzero(usable))


def _equalize(pair: Pair, work: _Weights) -> float:
    """One equalization step of the pair; returns the largest |log s| it applied."""
    s = cle_scales(work.out_range(pair.a), work.in_range(pair.b, pair.channels))
    if pair.smin is not None and pair.smax is not None:
        s = limit_scales(s, pair.total, pair.smin, pair.smax, pair.floor)
    moved = float(np.max(np.abs(np.log(s)))) if s.size else 0.0
    if moved < 1e-9:
        return moved
    work.scale_out(pair.a, 1.0 / s)
    work.scale_in(pair.b, s)
    pair.total = pair.total * s
    if id(pair.a) in work.stats:
        mean, std = work.stats[id(pair.a)]
        work.stats[id(pair.a)] = (mean / s, std / s)
    return moved


def _absorb(pair: Pair, work: _Weights) -> None:
    lo, hi = pair.bounds
    if len(pair.between) != 1 or lo != 0 or reads_padding(pair.b):
        return
    if pair.data_lo is not None and pair.data_hi is not None:
        c = absorbable_shift(pair.data_lo / pair.total, pair.data_hi / pair.total, hi)
    elif id(pair.a) in work.stats:
        mean, std = work.stats[id(pair.a)]
        c = normal_shift(mean, std, hi)
    else:
        return
    if not np.any(c > 0):
        return
    # fold_output_affine / fold_input_affine with s = 1: the weights times 1 are the weights,
    # and b * 1 + -c is b - c bit for bit
    wa, ba = work.get(pair.a)
    work.set(pair.a, wa, ba - c)
    wb, bb = work.get(pair.b)
    work.set(pair.b, wb, input_shift_bias(pair.b, wb, bb, c))
    if id(pair.a) in work.stats:
        mean, std = work.stats[id(pair.a)]
        work.stats[id(pair.a)] = (mean - c, std)
    pair.absorbed = int(np.count_nonzero(c > 0))


def _entry(pair: Pair) -> dict[str, Any]:
    return {"pair": pair.name, "scale": [round(float(pair.total.min()), 4), round(float(pair.total.max()), 4)],
            "dead_channels": pair.dead, "absorbed_channels": pair.absorbed,
            "clamp_limited_channels": pair.limited}
