"""The `assign-fixed-point` pass: FIXED8/FIXED16 (and fixed4 weights) positions for every tensor (.nnb, C, QDQ).

The target's fixed-point rules (`qcc.target.FixedPointRules`) come from the pass context
(`ctx.target.fixed_point`, set by the driver from the target's constraints) unless the `rules`
option names a rule set; nnabla-c-runtime's (the .nnb and C targets) are the demanding case:

1. Width per tensor: a user pin or width override (apply-overrides), else `weight_bits` for
   weights and `bits` for everything else. A bias has its layer output's width. Ops whose kernel
   casts every operand to one type (`one_type_ops`: nnabla-c-runtime's Convolution) form one
   width class with their x, W, b and y, and conflicting overrides inside it are an error naming
   the tensors. So under those rules fixed8-16 stores convolution weights in 16 bits (noted in
   the report); Dense (Affine) may mix. A 4-bit weight (fixed4, `weight_bits=4`) keeps 4 bits in
   an 8-bit class: its values are FIXED8 values at the same position, so the class has one type.
2. Position classes (same width only): ops that keep their input's values (views, Relu, MaxPool,
   Concat and the like: the `keeps_annotation` trait) carry their input's position (no
   requantization), a bias has its output's position, and the two inputs of `shared_input_ops`
   (nnabla-c-runtime's Add2/Sub2 rescale the finer input in place) share one. A class takes the
   coarsest of its members' best positions: activations from their calibration histogram
   (`method`; a tensor read only by Relu is judged by the Relu's output), parameters from their
   exact values (`param_method`). `frac_range` bounds every position (0..15 for nnb).
3. `product_limit`: the output position of a `product` op (Conv/Dense/Mul) is at most input +
   weight positions (the kernels shift by fx + fw - fy); a class that violates it is lowered
   until none does.

Pinned positions win; a rule that would change one is an error naming the tensor. Activations
are stored with the runtime's rounding (`FixedPoint.rounding`: truncation toward zero for
nnabla-c-runtime, which stores every value it computes that way); parameters round half to even
(the converter's np.round).
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import numpy as np
from qcc.passes.quantreport import activation_entry, parameter_entry, positive_part, without_zeros
from qcc.passes.quantutil import (
    RangeMethod,
    UnionFind,
    activations_option,
    bias_of,
    check_choices,
    is_bias_use,
    is_float,
    is_param,
    is_weight_use,
    keep_unmarked_float,
    note_once,
    param_data,
    percentile_option,
    pinned,
    relu_only,
    set_float,
    sharing_classes,
    start_annotation,
    weight_uses,
)
from qcc.passes.statistics import Calibration, pre_bias_key

from qcc.errors import UsageError
from qcc.ir.core import Graph, Model, Value
from qcc.ir.registry import get_schema
from qcc.ir.types import Affine, FixedPoint, Float32, Sign
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.quant.fixedpoint import (
    auto_position,
    fixed_point_position,
    param_fixed_point_position,
    position_errors,
)
from qcc.quant.numerics import fixed_bounds, fixed_container_bits
from qcc.quant.ranges import percentile
from qcc.quant.stats import TensorStats
from qcc.target import ANY_FIXED_POINT, NNABLA_C_RUNTIME, FixedPointRules

STATS_METHOD = {"minmax": "maxabs", "entropy": "kl", "mse": "mse", "auto": "mse"}
FLOAT = 0  # width of a value kept in float
SHARE_WHY = "views, Relu, MaxPool, Concat, a bias and its output, and the inputs of the target's in-place Add share positions"


@attrs.frozen
class AssignFixedPoint(Pass):
    """Fixed-point types and positions for every tensor, honouring the target's fixed-point rules."""

    name = "assign-fixed-point"
    requires = ("calibrate",)

    bits: Literal[8, 16] = attrs.field(default=8, metadata={"help": "activation (and default) width"})
    weight_bits: Literal[4, 8, 16] | None = attrs.field(
        default=None, metadata={"help": "weight width (none = bits; 4: fixed4, held as 8-bit by the runtime)"})
    method: RangeMethod = attrs.field(default="mse", metadata={"help": "activation position criterion on the histogram"})
    percentile: float = percentile_option()
    param_method: Literal["mse", "maxabs", "nnabla"] = attrs.field(
        default="mse", metadata={"help": "parameter position criterion (exact values)"})
    rules: Literal["target", "nnabla-c-runtime", "any"] = attrs.field(
        default="target", metadata={"help": "fixed-point rules: the target's (from the context), "
                                            "nnabla-c-runtime's, or none"})
    rounding: Literal["auto", "trunc", "half_even"] = attrs.field(
        default="auto", metadata={"help": "activation rounding (auto: the rules')"})
    activations: Literal["all", "marked"] = activations_option()

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def rules_for(self, ctx: PassContext) -> FixedPointRules:
        """The rule set this run honours."""
        if self.rules == "nnabla-c-runtime":
            return NNABLA_C_RUNTIME
        if self.rules == "any":
            return ANY_FIXED_POINT
        return ctx.target.fixed_point

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        _Assignment(self, self.rules_for(ctx)).run(model, ctx)
        return PassResult(model, True, frozenset({"*"}))


@attrs.define
class _Assignment:
    """One run of the pass: its options and the rule set it honours."""

    opts: AssignFixedPoint
    rules: FixedPointRules

    @property
    def act_rounding(self) -> str:
        return self.rules.rounding if self.opts.rounding == "auto" else self.opts.rounding

    @property
    def frac_limits(self) -> tuple[int | None, int | None]:
        return self.rules.frac_range or (None, None)

    def run(self, model: Model, ctx: PassContext) -> None:
        calib = start_annotation(model, ctx, self.opts)
        graph = model.graph
        values = [v for v in graph.values() if is_float(v)]
        self._refresh_auto_positions(values)
        self._check_pins(values)
        if self.opts.activations == "marked":
            keep_unmarked_float(values)
        widths = self._widths(graph, values, ctx)
        positions, classes = self._positions(graph, values, widths, calib)
        self._annotate(graph, values, widths, positions, classes, calib)

    # ------------------------------------------------------------------ validation
    def _refresh_auto_positions(self, values: list[Value]) -> None:
        """settings.yaml FIXED8/FIXED16 without a position on a parameter means nnabla's automatic
        position: recomputed here, as fold-bn may have changed the values since it was loaded."""
        for v in values:
            data = param_data(v)
            if pinned(v) and v.meta.get("settings.auto_position") and isinstance(v.quant, FixedPoint) \
                    and data is not None:
                lo, hi = self.frac_limits
                v.quant = FixedPoint(v.quant.bits, param_fixed_point_position(
                    data, v.quant.bits, "nnabla", min_frac=lo, max_frac=hi, name=v.name))

    def _check_pins(self, values: list[Value]) -> None:
        lo, hi = self.frac_limits
        for v in values:
            if v.meta.get("affine_dtype"):
                raise UsageError(f"tensor {v.name!r}: override {v.meta.get('override')} is an affine type; "
                                 "a fixed-point pipeline takes FLOAT32, FIXED8[_pos], FIXED16[_pos]")
            q = v.quant if pinned(v) else None
            if isinstance(q, Affine):
                raise UsageError(f"tensor {v.name!r} is pinned to {q}, not a fixed-point type")
            if isinstance(q, FixedPoint) and lo is not None and hi is not None and not lo <= q.frac <= hi:
                raise UsageError(f"tensor {v.name!r}: pinned position {q.frac} is outside the target's {lo}..{hi} "
                                 f"({v.meta.get('override')})")

    # ------------------------------------------------------------------ widths
    def _user_width(self, v: Value) -> int | None:
        if pinned(v):
            q = v.quant
            return q.bits if isinstance(q, FixedPoint) else FLOAT if isinstance(q, Float32) else None
        if isinstance(v.quant, Float32):  # decided float above (activations=marked)
            return FLOAT
        bits = v.meta.get("bits")
        return int(bits) if bits is not None else None

    def _widths(self, graph: Graph, values: list[Value], ctx: PassContext) -> dict[int, int]:
        weight_bits = self.opts.weight_bits or self.opts.bits
        default: dict[int, int] = {}
        for v in values:
            is_weight = is_param(v) and any(is_weight_use(n, i) for n, i in weight_uses(v))
            default[id(v)] = weight_bits if is_weight else self.opts.bits
        tied = UnionFind()
        for v in values:
            tied.add(v)
        for node in graph.nodes:
            bias = bias_of(node)
            if bias is not None:
                tied.union(node.outputs[0], bias)  # bias: the output's type (and position)
        for node in graph.nodes:
            if node.op in self.rules.one_type_ops:
                w = node.inputs[get_schema(node.op).weight_input or 1]
                if w is None or isinstance(w.quant, Sign):
                    continue
                tied.union(node.outputs[0], node.input(0))
                tied.union(node.outputs[0], w)
        widths: dict[int, int] = {}
        for members in tied.classes():
            if isinstance(members[0].quant, Sign):
                continue
            if len(members) == 1:
                user = self._user_width(members[0])
                widths[id(members[0])] = user if user is not None else default[id(members[0])]
                continue
            asked = {m.name: uw for m in members if (uw := self._user_width(m)) is not None}
            if len(set(asked.values())) > 1:
                shown = ", ".join(f"{n}={_width_text(w)}" for n, w in sorted(asked.items()))
                raise UsageError(f"assign-fixed-point: these tensors must have one type "
                                 f"(a Convolution's x, W, b and y, or a bias and its output) but overrides "
                                 f"differ: {shown}; override all of them alike")
            width = next(iter(asked.values())) if asked else self.opts.bits
            for m in members:
                widths[id(m)] = width
                if _narrow_weight(m, width, default[id(m)], self._user_width(m)):
                    widths[id(m)] = default[id(m)]  # 4-bit values are FIXED8 values: one type with the class
                    continue
                if width != FLOAT and m.is_const and default[id(m)] != width and self._user_width(m) is None:
                    note_once(ctx, "fixed_point", f"{m.name!r} stored in {width} bits: {ctx.target.target or 'the'} "
                              "target's convolutions need x, W, b and y of one type")
        return widths

    # ------------------------------------------------------------------ positions
    def _act_position(self, stats: TensorStats, bits: int, partial_sums: int = 1) -> int:
        lo, hi = self.frac_limits
        if self.opts.method == "auto":
            return auto_position(stats, bits, self.act_rounding, partial_sums, lo, hi)[0]
        if self.opts.method == "mse" and partial_sums > 1:
            return _accumulating_position(stats, bits, partial_sums, lo, hi)
        if self.opts.method == "percentile":
            plo, phi = percentile(stats, self.opts.percentile)
            t = max(-plo, phi)
            qmax = fixed_bounds(bits)[1]
            frac = math.floor(math.log2(qmax / t)) if t > 0 else bits - 2
            return max(lo, min(hi, frac)) if lo is not None and hi is not None else frac
        if self.opts.method == "entropy":
            stats = without_zeros(stats)
        return fixed_point_position(stats, bits, STATS_METHOD[self.opts.method], rounding=self.act_rounding,
                                    min_frac=lo, max_frac=hi)

    def _best(self, v: Value, bits: int, calib: Calibration, graph: Graph, partial_sums: int) -> int | None:
        data = param_data(v)
        lo, hi = self.frac_limits
        if data is not None:
            return param_fixed_point_position(data, bits, self.opts.param_method, min_frac=lo, max_frac=hi, name=v.name)
        st = calib.get(v.name)
        if st is None or not st.count:
            return None
        if relu_only(v, graph):
            st = positive_part(st)
        best = self._act_position(st, bits, partial_sums)
        # nnabla-c-runtime's Conv saturates its running sum in the output's type and adds the bias
        # last: a bias that cancels most of the sum (folded BatchNorm, squeeze-excite convs) saturates
        # outputs whose final value fits (half of one ppocr-cls SE conv's at FIXED8)
        node = v.producer()
        pre = calib.get(pre_bias_key(v.name)) if node is not None else None
        if node is not None and pre is not None and pre.count and node.op in self.rules.truncating_accumulation:
            best = min(best, self._act_position(pre, bits, partial_sums))
        return best

    def _partial_sums(self, v: Value) -> int:
        """Truncations per output value: nnabla-c-runtime's integer Conv truncates once per input channel."""
        node = v.producer()
        if node is None or node.op not in self.rules.truncating_accumulation or self.act_rounding != "trunc":
            return 1
        w = node.input(1)
        return int(w.type.shape[1]) if node.op == "Conv" and isinstance(w.type.shape[1], int) else 1

    def _positions(self, graph: Graph, values: list[Value], widths: dict[int, int],
                   calib: Calibration) -> tuple[dict[int, int], UnionFind]:
        fixed = [v for v in values if widths.get(id(v), FLOAT) != FLOAT]
        same = lambda a, b: widths[id(a)] == widths[id(b)]  # noqa: E731
        classes = sharing_classes(graph, fixed, same, shared_inputs=self.rules.shared_input_ops)
        for node in graph.nodes:
            bias = node.inputs[2] if node.op in ("Conv", "ConvTranspose", "Dense") and len(node.inputs) > 2 else None
            if bias is not None and id(bias) in classes.parent and id(node.outputs[0]) in classes.parent:
                classes.union(node.outputs[0], bias)
        position: dict[int, int] = {}
        locked: set[int] = set()
        for members in classes.classes():
            root = classes.find(members[0])
            pins = {m.name: m.quant.frac for m in members if pinned(m) and isinstance(m.quant, FixedPoint)}
            if len(set(pins.values())) > 1:
                shown = ", ".join(f"{n}=FIXED{widths[id(members[0])]}_{p}" for n, p in sorted(pins.items()))
                raise UsageError(f"assign-fixed-point: tensors {sorted(pins)} share one position ({SHARE_WHY}) "
                                 f"but are pinned differently: {shown}")
            if pins:
                position[root] = next(iter(pins.values()))
                locked.add(root)
                continue
            bits = widths[id(members[0])]
            parts = max(self._partial_sums(m) for m in members)
            best = [p for m in members if (p := self._best(m, bits, calib, graph, parts)) is not None]
            if best:
                position[root] = min(best)
        if self.rules.product_limit:
            self._constrain(graph, widths, classes, position, locked)
        return position, classes

    def _constrain(self, graph: Graph, widths: dict[int, int], classes: UnionFind,
                   position: dict[int, int], locked: set[int]) -> None:
        """product_limit: fy <= fx + fw for multiplying kernels whose operands are all one fixed type."""
        changed = True
        while changed:
            changed = False
            for node in graph.nodes:
                if not get_schema(node.op).has("product") or len(node.inputs) < 2:
                    continue
                x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
                if x is None or w is None or any(id(v) not in classes.parent for v in (x, w, y)):
                    continue
                if len({fixed_container_bits(widths[id(v)]) for v in (x, w, y)}) != 1:
                    continue  # mixed types run nnabla-c-runtime's generic float kernel: no shift
                rx, rw, ry = classes.find(x), classes.find(w), classes.find(y)
                if not all(r in position for r in (rx, rw, ry)):
                    continue
                limit = position[rx] + position[rw]
                if position[ry] <= limit:
                    continue
                if ry in locked:
                    raise UsageError(
                        f"tensor {y.name!r} is pinned to position {position[ry]}, but the target requires the output "
                        f"position of {node.op} {node.name!r} to be at most input + weight positions "
                        f"({x.name!r} {position[rx]} + {w.name!r} {position[rw]} = {limit})")
                position[ry] = limit
                changed = True

    # ------------------------------------------------------------------ annotation
    def _annotate(self, graph: Graph, values: list[Value], widths: dict[int, int], position: dict[int, int],
                  classes: UnionFind, calib: Calibration) -> None:
        for v in values:
            if pinned(v) or isinstance(v.quant, (Float32, Sign)):
                continue
            width = widths.get(id(v), FLOAT)
            if width == FLOAT:
                set_float(v, _float_reason(v, self.rules))
                continue
            root = classes.find(v)
            if root not in position:
                set_float(v, "no calibration statistics (the value was never computed)")
                continue
            data = param_data(v)
            if data is not None:
                v.quant = FixedPoint(width, position[root])
                v.meta["report"] = parameter_entry(data, v.quant)
                continue
            v.quant = FixedPoint(width, position[root], self.act_rounding)
            v.meta["report"] = activation_entry(calib.get(v.name), v.quant, self.opts.method, self.act_rounding,
                                                relu_only=relu_only(v, graph))
            if self.opts.method == "auto":  # the least-error position; 'minmax' when it clips nothing
                v.meta["report"]["chosen"] = "mse" if v.meta["report"].get("clip_fraction") else "minmax"
        for v in values:  # pinned fixed values get report fields too
            if pinned(v) and isinstance(v.quant, FixedPoint):
                data = param_data(v)
                if data is None:
                    v.quant = attrs.evolve(v.quant, rounding=self.act_rounding)
                v.meta["report"] = (parameter_entry(data, v.quant) if data is not None else
                                    activation_entry(calib.get(v.name), v.quant, "pinned", self.act_rounding))


def _accumulating_position(stats: TensorStats, bits: int, partial_sums: int, lo: int | None,
                           hi: int | None) -> int:
    """Least expected squared error when each value is the sum of `partial_sums` truncated parts.

    Storage error (clipping and one truncation) comes from the histogram; every further
    truncation toward zero adds about step**2 / 3 per nonzero value. At 8 bits, 16 input
    channels make that the larger term, so the position comes out one or two finer than the
    storage-only optimum.
    """
    from qcc.quant.stats import extent_for

    fits = bits - 1 - extent_for(max(stats.absmax, 1e-30))
    cands = [f for f in range(fits - 1, fits + bits + 1)
             if (lo is None or f >= lo) and (hi is None or f <= hi)]
    if not cands:
        return fixed_point_position(stats, bits, "mse", rounding="trunc", min_frac=lo, max_frac=hi)
    fracs = np.array(cands)
    return int(fracs[int(np.argmin(position_errors(stats, bits, fracs, "trunc", partial_sums)))])


def _narrow_weight(value: Value, width: int, default: int, user: int | None) -> bool:
    """A weight whose default width (fixed4's 4 bits) the runtime holds in the class's 8-bit type."""
    return value.is_const and user is None and width != FLOAT and default < width == fixed_container_bits(default)


def _width_text(width: int) -> str:
    return "FLOAT32" if width == FLOAT else f"FIXED{width}"


def _float_reason(v: Value, rules: FixedPointRules) -> str:
    for node, index in v.uses():
        if is_bias_use(node, index):
            return (f"bias of {node.op} {node.name!r} takes the type of its output "
                    f"{node.outputs[0].name!r} (FLOAT32)")
        if node.op in rules.one_type_ops:
            return (f"target rule: {node.op} {node.name!r} runs in one type and its output "
                    f"{node.outputs[0].name!r} is FLOAT32")
    producer = v.producer()
    if producer is not None and producer.op in rules.one_type_ops:
        return f"target rule: {producer.op} {producer.name!r} runs in one type and an operand is FLOAT32"
    return "kept in float by an override"
