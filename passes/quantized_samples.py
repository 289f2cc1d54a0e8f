"""bias-correct's integer run of the corrected model, kept for check-fixed-point.

bias-correct runs the annotated model through nnabla-c-runtime's integer kernels on the first
calibration samples, correcting layer by layer: each corrected layer hands the later ones the
output the corrected bias gives (the integer sum computed once, the new bias added with the
runtime's saturating add), so every value of that run is what the finished model computes.
check-fixed-point, last in the fixed-point pipelines, used to run the finished model again on
the first `CHECK_SAMPLES` of those samples; it reads this run's values instead when they are for
the very feeds and the very model (nodes, constants and annotations: a fingerprint), and runs it
itself otherwise (another sample count, accuracy-control in between). Integer kernels compute
each sample exactly whatever the batch, so the values are bit for bit the ones its run gives.

With them, bias-correct hands on the float outputs calibrate kept for its reference (the weighted
layers', on the same first samples, of the model before correction: `KeptRun.floats`), so
check-fixed-point's float run computes only what lies between those layers (activations, adds,
pooling) instead of every convolution again. Its own float run computes each sample with one
BLAS thread per product (calibrate's kernels, `qcc.sim.split.float_products`), so a kept output
is the very value its run would give.
"""

from __future__ import annotations

import hashlib

import attrs
import numpy as np
from qcc.passes.float_reference import KeptArrays, fingerprint, pop_kept

from qcc.ir.core import Model, Value
from qcc.ir.types import FixedPoint
from qcc.pm.base import Analysis, AnalysisManager, PassContext

CHECK_SAMPLES = 4
"""check-fixed-point's default sample count: the samples bias-correct keeps for it."""


class QuantizedSamples(Analysis):
    """What bias-correct kept of its integer run: the float readback of every fixed-point node
    output (None otherwise)."""

    name = "quantized-samples"

    def compute(self, model: Model, am: AnalysisManager) -> KeptArrays | None:
        return None


class KeptRun(KeptArrays):
    """bias-correct's kept integer run (`arrays`), and the float model's values calibrate kept on
    the same samples (`floats`, by value name: empty when there are none for this model)."""

    def __init__(self, feeds: dict[str, np.ndarray], arrays: dict[str, np.ndarray], fingerprint: bytes,
                 floats: dict[str, np.ndarray]) -> None:
        super().__init__(feeds, arrays, fingerprint)
        self.floats = floats


class RunKeeper:
    """An observer of bias-correct's integer run: the first `CHECK_SAMPLES` samples of each
    fixed-point node output (what check-fixed-point's run returns)."""

    def __init__(self, model: Model) -> None:
        self.wanted = {id(v) for n in model.graph.nodes for v in n.outputs if isinstance(v.quant, FixedPoint)}
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, value: Value, array: np.ndarray) -> None:
        if id(value) in self.wanted:
            self.arrays[value.name] = np.array(array[:CHECK_SAMPLES])


def annotated_fingerprint(model: Model) -> bytes:
    """`fingerprint` (nodes, constants) and every value's annotation."""
    digest = hashlib.sha256(fingerprint(model))
    for value in model.graph.values():
        digest.update(f"{value.name}:".encode())
        quant = value.quant
        if quant is None:
            continue
        for field in attrs.fields(type(quant)):
            item = getattr(quant, field.name)
            digest.update(np.asarray(item).tobytes() if isinstance(item, np.ndarray) else repr(item).encode())
    return digest.digest()


def keep_run(model: Model, ctx: PassContext, feeds: dict[str, np.ndarray], keeper: RunKeeper,
             floats: dict[str, np.ndarray] | None = None) -> None:
    """Store what `keeper` saw on `feeds`, for the model as it now is, with `floats` (the float
    model's values on the same samples, first rows first)."""
    first = {k: np.array(v[:CHECK_SAMPLES]) for k, v in feeds.items()}
    rows = min((len(v) for v in first.values()), default=0)
    kept = {name: np.array(a[:rows]) for name, a in (floats or {}).items() if len(a) >= rows}
    ctx.analyses.store(QuantizedSamples, model, KeptRun(first, keeper.arrays, annotated_fingerprint(model), kept))


def kept_run(model: Model, ctx: PassContext) -> KeptArrays | None:
    """What bias-correct kept, released from the context (it is read once)."""
    return pop_kept(model, ctx, QuantizedSamples)


def run_values(kept: KeptArrays | None, model: Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The kept values when they are for these feeds and this very model, else None."""
    return kept.arrays if kept is not None and kept.valid_for(feeds, annotated_fingerprint(model)) else None


def float_values(kept: KeptArrays | None) -> dict[str, np.ndarray]:
    """The float values kept with a run `run_values` accepted (empty: none)."""
    return kept.floats if isinstance(kept, KeptRun) else {}
