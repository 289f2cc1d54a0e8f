"""The float outputs of the weighted layers on the first calibration samples, kept for bias-correct.

bias-correct compares each quantized layer with the float model on the first `samples`
calibration samples, and used to run the float model for that; calibrate has just run it on the
same samples with the same interpreter. With `calibrate{reference=N}` (the default pipelines set
bias-correct's sample count when it follows), calibrate keeps, from its first batch, the first N
samples of each weighted layer's output, and bias-correct reads them instead of a float run.

Bit for bit the values bias-correct's own run gives, or not used at all:
- a sample's values do not depend on the batch around it (convolutions and batched products make
  one BLAS call per sample, the rest is elementwise or per sample): docs/passes.md, "What
  identical statistics means";
- except behind a 2-D matrix product, which calibrate computes one sample at a time and
  bias-correct's float run on the whole batch (numpy sums a gemv in another order): a layer
  whose output depends on one keeps its input instead when that does not (bias-correct computes
  the layer alone on it, the call its own run makes), else nothing is kept for it and
  bias-correct runs the float model as before;
- bias-correct uses them only for the very feeds calibrate kept (compared), on a graph with the
  same nodes and the same constants (a fingerprint: learned-rounding rewrites weights after
  calibrate), and drops them after use (memory: one float copy of each layer's output, the copy
  bias-correct's run held anyway).
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import attrs
import numpy as np
from qcc.passes.quantutil import has_weight

from qcc.ir.core import Model, Node, Value
from qcc.ir.registry import get_schema, ops_with
from qcc.pm.base import Analysis, AnalysisManager, PassContext


@attrs.define(eq=False)
class KeptArrays:
    """Arrays a run computed, by value name, the feeds it ran and a fingerprint of the model it
    ran (here: layer outputs, or inputs of layers behind a 2-D product; also
    passes/quantized_samples.py)."""

    feeds: dict[str, np.ndarray]
    arrays: dict[str, np.ndarray]
    fingerprint: bytes

    def valid_for(self, feeds: dict[str, np.ndarray], model_fingerprint: bytes) -> bool:
        """Computed from these very feeds, on a model with this fingerprint."""
        return self.fingerprint == model_fingerprint and self.feeds.keys() == feeds.keys() and all(
            self.feeds[k].dtype == feeds[k].dtype and np.array_equal(self.feeds[k], feeds[k]) for k in feeds)

    def rows_for(self, feeds: dict[str, np.ndarray], model_fingerprint: bytes) -> int | None:
        """How many leading samples `feeds` holds when they are the first samples of the kept
        feeds (a run on fewer samples: each sample's values do not depend on the batch), on a
        model with this fingerprint; None otherwise."""
        rows = {len(v) for v in feeds.values()}
        if len(rows) != 1 or self.fingerprint != model_fingerprint or self.feeds.keys() != feeds.keys():
            return None
        (count,) = rows
        if not all(self.feeds[k].dtype == feeds[k].dtype and len(self.feeds[k]) >= count
                   and np.array_equal(self.feeds[k][:count], feeds[k]) for k in feeds):
            return None
        return count


def pop_kept(model: Model, ctx: PassContext, analysis: type[Analysis]) -> KeptArrays | None:
    """What a pass stored as `analysis` for `model`, released from the context (read once)."""
    kept: Any = ctx.analyses.peek(analysis, model)
    if kept is None:
        return None
    ctx.analyses.store(analysis, model, None)
    return kept if isinstance(kept, KeptArrays) else None


class FloatReference(Analysis):
    """What `calibrate{reference=N}` kept (None otherwise: nothing to compute without data)."""

    name = "float-reference"

    def compute(self, model: Model, am: AnalysisManager) -> KeptArrays | None:
        return None


def values_to_keep(model: Model) -> dict[int, Value]:
    """Per weighted layer, its output, or its input when only that is computed as bias-correct's
    float run computes it (see the module docstring)."""
    product = {op for op in ops_with("product") if not get_schema(op).has("elementwise")}
    differs: set[int] = set()  # values calibrate may compute with other sums than a plain run
    keep: dict[int, Value] = {}
    for node in model.graph.nodes:
        data = node.inputs[0] if node.inputs else None
        split = node.op in product and data is not None and not data.is_const and data.type.rank == 2
        if split or any(v is not None and id(v) in differs for v in node.inputs):
            differs.update(id(v) for v in node.outputs)
        if not has_weight(node) or len(node.outputs) != 1 or data is None:
            continue
        chosen = node.outputs[0] if id(node.outputs[0]) not in differs else data
        if id(chosen) not in differs and not chosen.is_const:
            keep[id(chosen)] = chosen
    return keep


def fingerprint(model: Model) -> bytes:
    """The nodes' wiring and every constant's bytes: sha256 of the wiring and of each constant's
    name, type and CRC-32. It tells whether a pass in between changed the model (learned-rounding
    rewrites weights), not an adversary's forgery: a changed constant keeps its CRC-32 with
    probability 2**-32, and zlib's CRC-32 reads 3.5M float32 weights in 2 ms where sha256 of the
    bytes took 7-12 ms (twice per compile: calibrate keeps, bias-correct checks)."""
    digest = hashlib.sha256()
    for node in model.graph.nodes:
        names = [v.name if v is not None else "" for v in (*node.inputs, *node.outputs)]
        digest.update(f"{node.op}|{node.name}|{','.join(names)};".encode())
    for value in model.graph.constants:
        assert value.const is not None
        data = np.ascontiguousarray(value.const)
        digest.update(f"{value.name}|{data.dtype}|{data.shape}|{zlib.crc32(data.reshape(-1).data)};".encode())
    return digest.digest()


def reference_outputs(kept: KeptArrays | None, model: Model, feeds: dict[str, np.ndarray],
                      layers: list[Node]) -> dict[int, np.ndarray] | None:
    """The float output of each layer on `feeds` (by id of the output) from what calibrate kept,
    or None when it does not hold them all for these very feeds (or their first samples: the
    leading rows of what it kept) and this very graph."""
    count = None if kept is None else kept.rows_for(feeds, fingerprint(model))
    if kept is None or count is None:
        return None
    outputs = {}
    for layer in layers:
        out = layer.outputs[0]
        if out.name in kept.arrays:
            outputs[id(out)] = kept.arrays[out.name][:count]
            continue
        operands = _trimmed(layer)
        data = operands[0]
        if data is None or data.name not in kept.arrays or any(v is None or v.const is None for v in operands[1:]):
            return None
        args = [kept.arrays[data.name][:count], *(v.const for v in operands[1:] if v is not None)]
        outputs[id(out)] = np.asarray(get_schema(layer.op).kernel(layer, args)[0])  # type: ignore[arg-type]
    return outputs


def _trimmed(node: Node) -> list[Value | None]:
    """The operands a runner passes the kernel (no trailing missing optionals)."""
    inputs = list(node.inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs
