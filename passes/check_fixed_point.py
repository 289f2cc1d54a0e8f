"""The `check-fixed-point` pass: says when a fixed-point model loses its signal against float.

Last in the fixed-point pipelines (after bias-correct and accuracy-control): the first `samples`
calibration samples run through the float model and through the annotated one as the target runs
it (`runner_for(quantized=True)`: nnabla-c-runtime's integer kernels for .nnb and C), and every
fixed-point tensor gets its SQNR against float, errors accumulated along the graph. An output
below `min_sqnr_db` is a warning line naming the output, the first tensor where the signal fell
below that level and the worst tensors: at 8 bits, nnabla-c-runtime's truncation toward zero of
every value it stores compounds over a deep network (ppocr-cls: 2.8 dB at FIXED8, 33.6 dB at the
same positions rounded, 79.5 dB at FIXED16; docs/benchmarks.md). Nothing changes in the model.
Report section `fixed_point_check`: samples, output_sqnr_db, lowest (tensor, op, node, sqnr_db).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import attrs
import numpy as np
from qcc.passes.bias_correct import BEFORE
from qcc.passes.quantized_samples import CHECK_SAMPLES, float_values, kept_run, run_values
from qcc.passes.quantutil import at_least, calibration_batches

from qcc.ir.core import Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.types import FixedPoint
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.sim.compare import sqnr_db
from qcc.sim.engine import NodeKernel, Runner
from qcc.sim.split import SplitProducts

SECTION = "fixed_point_check"
SHOWN = 5
"""Tensors named in the warning line (the report section lists them all, lowest first)."""


@attrs.frozen
class CheckFixedPoint(Pass):
    """Warn (report line) when a fixed-point model's outputs are far from float."""

    name = "check-fixed-point"

    samples: int = attrs.field(default=CHECK_SAMPLES, validator=at_least(1),
                               metadata={"help": "calibration samples run float and fixed point"})
    min_sqnr_db: float = attrs.field(default=20.0, converter=float,
                                     metadata={"help": "outputs below this SQNR against float are reported"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        fixed = {v.name: v for v in model.graph.values() if isinstance(v.quant, FixedPoint) and not v.is_const}
        if not fixed or ctx.calib_data is None:
            return PassResult.unchanged(model)
        signal, noise, samples = _accumulate(model, ctx, self.samples, set(fixed))
        if not samples:
            return PassResult.unchanged(model)
        db = {name: sqnr_db(signal[name], noise[name]) for name in signal}
        outputs = {v.name: _round(db.get(v.name)) for v in model.graph.outputs if v.name in db}
        order = [v.name for v in model.graph.values() if v.name in db]
        lowest = sorted(order, key=lambda n: _key(db[n]))
        ctx.report[SECTION] = {"samples": samples, "min_sqnr_db": self.min_sqnr_db, "output_sqnr_db": outputs,
                               "lowest": [_entry(fixed[n], db[n]) for n in lowest if _key(db[n]) < self.min_sqnr_db]}
        low = {n: s for n, s in outputs.items() if s is not None and s < self.min_sqnr_db}
        if low:
            first = next(n for n in order if _key(db[n]) < self.min_sqnr_db)
            ctx.note("warnings", _warning(fixed, db, low, first, lowest[:SHOWN], samples, self.min_sqnr_db))
        return PassResult(model, False, frozenset({"*"}))


def _accumulate(model: Model, ctx: PassContext, samples: int,
                names: set[str]) -> tuple[dict[str, float], dict[str, float], int]:
    """Signal and error energy per fixed-point tensor over the first `samples` samples (the
    quantized values from bias-correct's integer run of this very model when it kept them, and
    then the float values calibrate kept on the same samples: only what lies between them runs).

    The float reference computes each sample with one BLAS thread per product, as calibrate's
    run does (`float_products`): the values do not depend on the core count, and a kept value is
    the one this run would compute."""
    from qcc.pm.parallel import process_split
    from qcc.sim.interpreter import runner_for

    signal: dict[str, float] = dict.fromkeys(names, 0.0)
    noise: dict[str, float] = dict.fromkeys(names, 0.0)
    kept = kept_run(model, ctx)
    runner = None
    count = 0
    split = process_split()
    try:
        for feeds in calibration_batches(model, ctx, samples, samples):
            got = run_values(kept, model, feeds)
            rows = len(next(iter(feeds.values())))
            floats = float_values(kept) if got is not None else {}
            if any(len(a) != rows for a in floats.values()):
                floats = {}
            ref = _reference(model, split, floats).run(feeds)
            if got is None:
                runner = runner or runner_for(model, quantized=True, keep_all=True)
                got = runner.run(feeds)
            for name in names:
                if name in ref and name in got:
                    s, e = _energies(ref[name], got[name])
                    signal[name] += s
                    noise[name] += e
            count += rows
    finally:
        split.close()
    return signal, noise, count


def _reference(model: Model, split: SplitProducts, floats: dict[str, np.ndarray]) -> Runner:
    """The float model (its biases before bias-correct) with calibrate's product kernels; a node
    whose output is in `floats` returns it instead of computing it."""
    from qcc.sim.interpreter import Interpreter
    from qcc.sim.split import float_products

    kernels = float_products(split)
    if floats:
        kernels = {op: _kept_or(floats, kernels.get(op) or get_schema(op).kernel)  # type: ignore[misc]
                   for op in {n.op for n in model.graph.nodes}}
    with _float_biases(model):
        return Interpreter(model, quantized=False, keep_all=True, kernels=kernels)


def _kept_or(floats: dict[str, np.ndarray], kernel: NodeKernel) -> NodeKernel:
    def run(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        found = floats.get(node.outputs[0].name) if len(node.outputs) == 1 else None
        return [found] if found is not None else kernel(node, args)
    return run


def _energies(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """sum(r * r) and sum((r - got)**2) in float64, r = ref as float64: the old formula's very
    arrays summed (same shape and layout), with one temporary instead of three."""
    r = np.asarray(ref, dtype=np.float64)
    g = np.asarray(got)
    if r.shape != g.shape or not (r.flags.c_contiguous and g.flags.c_contiguous):
        return float(np.sum(r * r)), float(np.sum((r - np.asarray(g, dtype=np.float64)) ** 2))
    work = np.multiply(r, r)
    signal = float(np.sum(work))
    np.subtract(r, g, out=work)  # g converted to float64 exactly, as np.asarray(g, float64) does
    np.multiply(work, work, out=work)
    return signal, float(np.sum(work))


@contextmanager
def _float_biases(model: Model) -> Iterator[None]:
    """The float model's biases while a runner stores its parameters (bias-correct moved the
    quantized model's error into them: the reference is the model before that)."""
    saved = [(v, v.const) for v in model.graph.constants if v.meta.get(BEFORE) is not None]
    try:
        for value, _ in saved:
            value.const = value.meta[BEFORE]
        yield
    finally:
        for value, const in saved:
            value.const = const


def _entry(value: Value, db: float | None) -> dict[str, object]:
    node = value.producer()
    return {"tensor": value.name, "op": node.op if node else "input", "node": node.name if node else "",
            "type": str(value.quant), "sqnr_db": _round(db)}


def _warning(fixed: dict[str, Value], db: Mapping[str, float | None], low: Mapping[str, float | None],
             first: str, lowest: list[str], samples: int, level: float) -> str:
    widths = sorted({f"FIXED{v.quant.bits}" for v in fixed.values() if isinstance(v.quant, FixedPoint)})
    node = fixed[first].producer()
    where = f"{node.op} node {node.name!r}" if node else "a model input"
    outs = ", ".join(f"{n!r} {_text(s)}" for n, s in low.items())
    worst = ", ".join(f"{n!r} {_text(db[n])}" for n in lowest)
    return (f"check-fixed-point: {'/'.join(widths)} output {outs} against float on {samples} calibration "
            f"sample(s) (below {level:g} dB); the signal first falls below {level:g} dB at tensor {first!r} "
            f"({where}, {_text(db[first])}); lowest: {worst}. The target's fixed-point arithmetic loses this "
            "model's signal at these widths: --quantize fixed16 (or fixed8-16), or --override NAME=FIXED16 on "
            "these tensors")


def _key(db: float | None) -> float:
    return float("inf") if db is None else db


def _round(db: float | None) -> float | None:
    return None if db is None else round(db, 1)


def _text(db: float | None) -> str:
    return "exact" if db is None else f"{db:.1f} dB"
