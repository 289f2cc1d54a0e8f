"""A static-batch model re-typed for a larger batch, when its graph is batch-agnostic.

Calibration of a model exported with batch 1 (every torchvision export) would otherwise run one
sample per interpreter or onnxruntime call: the per-call overhead dominates small models. A copy
rebound to batch N computes, sample for sample, what N calls of the original compute, provided
every tensor carries the batch on its first axis. Shape inference decides: a graph that mixes
samples (a Reshape to a constant (1, -1), a Concat along axis 0, a batch-axis reduction) infers
some tensor with another shape, and the model is not rebound.
"""

from __future__ import annotations

import copy

from qcc.errors import InvalidInputError
from qcc.ir.core import Model, Node
from qcc.ir.registry import get_schema
from qcc.ir.types import DTYPES, TensorType


def rebatched(model: Model, batch: int) -> Model | None:
    """A copy of `model` whose inputs have first dimension `batch` (a multiple of the static
    batch), every tensor re-typed; None when some tensor would not scale with the batch.

    The graph is a deep copy, the constants' arrays are shared: the copy exists to be run, and
    copying ResNet-50's 100 MB of weights cost a calibration 0.09 s (a quarter of one ORT pass
    over 8 samples)."""
    from qcc.ir.samples import is_default, sample_axes

    inputs = model.graph.inputs
    if not is_default(sample_axes(model)):
        return None  # an input carries its samples on another axis (a recurrent state): runs as given
    if not inputs or not all(v.type.rank and isinstance(v.type.shape[0], int) for v in inputs):
        return None
    static = {v.type.shape[0] for v in inputs}
    if len(static) != 1:
        return None
    old = int(static.pop())
    if old < 1 or batch % old or batch == old:
        return None
    factor = batch // old
    shared: dict[int, object] = {id(v.const): v.const for v in model.graph.constants if v.const is not None}
    copied = copy.deepcopy(model, shared)
    graph = copied.graph
    for value in graph.inputs:
        value.type = _scaled(value.type, factor)
    for node in graph.nodes:
        _keep_batch(node, old)
        try:
            inferred = get_schema(node.op).infer_types(list(node.inputs), node.attrs, node.name, len(node.outputs))
        except InvalidInputError:
            return None
        for value, ttype in zip(node.outputs, inferred):
            if ttype not in (value.type, _scaled(value.type, factor)) or (
                    ttype == value.type and value.type.rank and DTYPES[value.type.dtype].kind == "f"
                    and value.type.shape[0] == old):
                return None  # a float tensor that no longer scales with the batch mixes samples
            value.type = ttype
    return copied


def _keep_batch(node: Node, old: int) -> None:
    """A view to a constant shape led by the batch ((1, 2048) after a ResNet's pooling) copies the
    input's first dimension instead: the same samples, each reshaped alone."""
    shape = node.attrs.get("shape")
    source = node.inputs[0] if node.inputs else None
    if (get_schema(node.op).has("view") and isinstance(shape, (list, tuple)) and shape and shape[0] == old
            and source is not None and source.type.rank and isinstance(source.type.shape[0], int)
            and source.type.shape[0] != old):
        node.attrs["shape"] = [0, *shape[1:]]


def _scaled(ttype: TensorType, factor: int) -> TensorType:
    if not ttype.rank or not isinstance(ttype.shape[0], int):
        return ttype
    return TensorType(ttype.dtype, (ttype.shape[0] * factor, *ttype.shape[1:]))
