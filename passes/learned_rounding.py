"""The `learned-rounding` pass: AdaRound on every quantized Conv / Dense weight (qcc.quant.adaround).

Affine weights (int4/uint4 W4A8, int8) learn on their scale and zero point; fixed-point weights
(fixed4's 4-bit, fixed8) on the step 2**-frac, zero point 0, clipped to the width's range.

Runs after the annotation pass. Calibration data runs through the float model and the quantized
one (as `run_model(quantized=True)` runs it) batch by batch; at each layer the Gram matrices of
its float and quantized inputs are accumulated, then each weight's floor-or-ceil choice is
learned so that the layer's output stays close to the float one. Layers are learned in graph
order, each on the inputs the already-rounded layers before it give: one quantized run per depth
of the network. After a layer is rounded, its mean output error (rounded weights on the quantized
input against the float layer, from the same accumulated sums) moves into its bias, so the layers
after it learn on inputs without that offset (`mean_correction`; bias-correct later measures what
is left with the target's arithmetic). Learning every layer at once on nearest-rounded inputs
compounded the errors (digits W4A8: 9 dB instead of 26). The result is written back as
the weight itself: every weight becomes an exact point of its annotation's grid (step * (q - zp)),
so the annotation, the simulator and every backend store exactly the learned integers with their
usual round-to-nearest. Each channel's extreme weights keep their nearest rounding, so the
per-channel range, hence the scale or position the annotation pass derives from the weights, is
unchanged when it runs again (sensitivity, accuracy-control).

Report section `learned_rounding`: per layer the reconstruction SQNR of the layer output on the
calibration data with nearest and with learned rounding, and the fraction of weights flipped.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs
import numpy as np
from qcc.passes.bias_correct import ensure_bias
from qcc.passes.channel_fold import layer_weight
from qcc.passes.quantreport import parameter_entry
from qcc.passes.quantutil import (
    annotation_pass,
    at_least,
    calibration_batches,
    calibration_data,
    check_choices,
    folds_channels,
    param_data,
    weight_axis,
)

from qcc.errors import InternalError
from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.fakequant import apply_annotation
from qcc.ir.types import Affine, FixedPoint
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.quant.adaround import Gram, learn_rounding, output_power, patches
from qcc.quant.numerics import AFFINE_DTYPES, fixed_bounds

SECTION = "learned_rounding"


@attrs.frozen
class LearnedRounding(Pass):
    """AdaRound: round each weight up or down to reconstruct its layer's output (calibration data)."""

    name = "learned-rounding"

    iterations: int = attrs.field(default=1000, validator=at_least(1), metadata={"help": "Adam steps per layer"})
    samples: int = attrs.field(default=256, validator=at_least(1), metadata={"help": "calibration samples"})
    batch_size: int = attrs.field(default=32, validator=at_least(1), metadata={"help": "batch"})
    reg: float = attrs.field(default=3.0, validator=at_least(1e-12), metadata={"help": "rounding regularizer weight"})
    lr: float = attrs.field(default=0.05, validator=at_least(1e-12), metadata={"help": "Adam learning rate"})
    reconstruct: Literal["quantized", "float"] = attrs.field(
        default="quantized", metadata={"help": "reconstruct W x_q (quantized) or the float layer's W x_f"})
    mean_correction: bool = attrs.field(
        default=True, metadata={"help": "move each layer's mean error into its bias before the next layers learn"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        annotation_pass(model, self.name)
        calibration_data(ctx, self.name)
        layers = [n for n in model.graph.nodes if _roundable(n)]
        upstream = _upstream_layers(model, layers)
        entries, done = [], set[int]()
        while len(done) < len(layers):
            # every layer whose upstream layers are all rounded: their inputs are final now
            ready = [n for n in layers if id(n) not in done and upstream[id(n)] <= done]
            grams = self._grams(model, ready, ctx)
            for layer in ready:
                if grams[id(layer)].count:
                    entries.append(self._round(model.graph, layer, grams[id(layer)]))
                done.add(id(layer))
        ctx.report[SECTION] = entries
        return PassResult(model, bool(entries), frozenset({"*"}))

    def _grams(self, model: Model, layers: list[Node], ctx: PassContext) -> dict[int, Gram]:
        from qcc.sim.compare import passthrough, quantized_runner
        from qcc.sim.interpreter import Interpreter

        readers: dict[int, list[Node]] = {}
        for layer in layers:
            readers.setdefault(id(layer.input(0)), []).append(layer)
        grams = {id(n): Gram() for n in layers}
        floats: dict[int, np.ndarray] = {}

        def keep(value: Value, array: np.ndarray) -> None:
            if id(value) in readers:
                floats[id(value)] = array

        def accumulate(value: Value, array: np.ndarray) -> None:
            for layer in readers.get(id(value), ()):
                grams[id(layer)].add(_patches(layer, array), _patches(layer, floats[id(value)]))

        reference = Interpreter(model, observer=keep, kernels={"Quantize": passthrough})
        quantized = quantized_runner(model, accumulate)
        for part in calibration_batches(model, ctx, self.samples, self.batch_size):
            reference.run(part)
            quantized.run(part)
            floats.clear()
        return grams

    def _correct_mean(self, graph: Graph, layer: Node, error: np.ndarray) -> None:
        """The layer's mean output error (rounded weights on the quantized input against the float
        layer) leaves through its bias, so the layers after it learn on corrected inputs."""
        bias = ensure_bias(graph, layer)
        assert bias.const is not None
        bias.meta.setdefault("bias_before_rounding", bias.const.copy())
        bias.const = (bias.const.astype(np.float64) - error.reshape(-1)).astype(bias.const.dtype)

    def _round(self, graph: Graph, layer: Node, gram: Gram) -> dict[str, Any]:
        weight = layer_weight(layer)
        w = param_data(weight)
        assert w is not None
        matrix = _as_matrix(layer, w.astype(np.float64))
        step, zp, qmin, qmax = _grid(layer, weight, matrix.shape)
        full = gram
        if self.reconstruct == "quantized":  # reconstruct W x_q: the weights cannot undo the input's noise
            gram = Gram(gram.qq, gram.qq, gram.qq, gram.count)
        result = learn_rounding(matrix, step, zp, qmin, qmax, gram, self.iterations, self.lr, self.reg)
        q, nearest = _keep_extremes(result.q, matrix, step, zp, qmin, qmax)
        w_hat = _from_matrix(layer, (q - zp) * step, w.shape).astype(w.dtype)
        stored = apply_annotation(w_hat, weight.quant)
        if not np.array_equal(stored, w_hat):
            raise InternalError(f"learned-rounding: weight {weight.name!r} does not reproduce its learned "
                                "grid points under its annotation")
        weight.meta.setdefault("weight_before_rounding", w)
        weight.const = np.ascontiguousarray(w_hat)
        if self.mean_correction:
            self._correct_mean(graph, layer, full.mean_error(_as_matrix(layer, w_hat.astype(np.float64)), matrix))
        if weight.quant is not None:
            weight.meta["report"] = {**parameter_entry(w_hat, weight.quant), "rounding": "learned"}
        power = output_power(matrix, gram)
        return {"layer": layer.name, "nearest_sqnr_db": _db(power, result.nearest_error),
                "learned_sqnr_db": _db(power, result.learned_error),
                "flipped": round(float(np.count_nonzero(q != nearest)) / max(q.size, 1), 4)}


def _upstream_layers(model: Model, layers: list[Node]) -> dict[int, set[int]]:
    """For each layer, the ids of the other layers it (transitively) reads from."""
    wanted = {id(n) for n in layers}
    before: dict[int, set[int]] = {}  # value id -> layer ids upstream of it (inclusive of its producer)
    result: dict[int, set[int]] = {}
    for node in model.graph.nodes:
        seen: set[int] = set()
        for v in node.inputs:
            if v is not None:
                seen |= before.get(id(v), set())
        if id(node) in wanted:
            result[id(node)] = set(seen)
            seen = seen | {id(node)}
        for out in node.outputs:
            before[id(out)] = seen
    return result


def _roundable(layer: Node) -> bool:
    """A Conv/Dense (a layer `folds_channels` accepts) with a constant, unshared, unpinned weight on
    a per-tensor or output-channel grid, reading a quantized input."""
    if not folds_channels(layer):
        return False
    quant = layer_weight(layer).quant
    if isinstance(quant, Affine):
        axis_ok = quant.axis is None or quant.axis == weight_axis(layer)
        return axis_ok and isinstance(layer.input(0).quant, (Affine, FixedPoint))
    return isinstance(quant, FixedPoint) and isinstance(layer.input(0).quant, (Affine, FixedPoint))


def _columns_out(layer: Node) -> bool:
    """The weight holds output channels on axis 1 (Dense's (K, M)); else on axis 0 (Conv's
    (O, C/g, kh, kw)): the registry's weight role says which."""
    return weight_axis(layer) == 1


def _patches(layer: Node, x: np.ndarray) -> np.ndarray:
    if _columns_out(layer):
        return np.asarray(x, np.float64).T[None]
    w = layer_weight(layer).type.shape
    return patches(np.asarray(x, np.float64), (int(w[2]), int(w[3])), layer.attrs, int(layer.attrs["group"]))


def _as_matrix(layer: Node, w: np.ndarray) -> np.ndarray:
    """(group, outputs per group, K): rows are output channels, columns their inputs."""
    if _columns_out(layer):
        return w.T[None]
    group = int(layer.attrs["group"])
    return w.reshape(group, w.shape[0] // group, -1)


def _from_matrix(layer: Node, m: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if _columns_out(layer):
        return m[0].T
    return m.reshape(shape)


def _grid(layer: Node, weight: Value, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(step, zero point) broadcastable to the matrix, and the integer range."""
    quant = weight.quant
    if isinstance(quant, FixedPoint):
        qmin, qmax = fixed_bounds(quant.bits)
        return np.full((1, 1, 1), math.ldexp(1.0, -quant.frac)), np.zeros((1, 1, 1)), qmin, qmax
    assert isinstance(quant, Affine)
    qmin, qmax = AFFINE_DTYPES[quant.dtype]
    scale = np.asarray(quant.scale, np.float64).astype(np.float32).astype(np.float64)
    zp = np.asarray(quant.zero_point, np.float64)
    if quant.axis is None:
        return scale.reshape(1, 1, 1), zp.reshape(1, 1, 1), qmin, qmax
    return scale.reshape(shape[0], shape[1], 1), zp.reshape(shape[0], shape[1], 1), qmin, qmax


def _keep_extremes(q: np.ndarray, w: np.ndarray, step: np.ndarray, zp: np.ndarray, qmin: int,
                   qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Each output channel's largest and smallest weight keep their nearest integers, and no other
    weight goes beyond them: the channel's range (hence its scale or position) is unchanged."""
    nearest = np.clip(np.rint(w / step) + zp, qmin, qmax)
    lo, hi = nearest.min(axis=2, keepdims=True), nearest.max(axis=2, keepdims=True)
    q = np.clip(q, lo, hi)
    for pick in (np.argmin(w, axis=2), np.argmax(w, axis=2)):
        np.put_along_axis(q, pick[..., None], np.take_along_axis(nearest, pick[..., None], axis=2), axis=2)
    return q, nearest


def _db(signal: float, noise: float) -> float | None:
    if noise <= 0:
        return None
    return round(10.0 * math.log10(max(signal, 1e-300) / noise), 3)
