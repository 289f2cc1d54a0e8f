"""Where each model input carries its samples: the one rule for data cut into batches.

A recurrent model's state input keeps its batch on axis 1 (an ONNX LSTM/GRU state is
(directions, batch, hidden)), so "samples on axis 0 of every input" cannot feed it. Each input
has a samples axis instead, decided here and nowhere else:

1. the axis the user names (`--batch-axis NAME=AXIS`, `batch_axes={"state": 1}`; stored as the
   input's `meta["batch_axis"]`);
2. else the input's first dynamic dim (an ONNX dim_param, nnabla's -1 batch);
3. else (a static input) axis 0 when every input agrees on its first dim (today's convention:
   a torchvision export's 1, a static batch of 8), otherwise the first axis whose size is the
   first input's leading dim (silero-vad: `input` (1, 576) and `state` (2, 1, 128) -> 0 and 1).

Code that cuts, shards or counts samples holds them in *samples-first* form (`to_samples`: the
samples axis moved to the front; a view, identical arrays when every axis is 0) and gives a
runner the model's own layout (`to_model`) one batch at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from qcc.errors import UsageError
from qcc.ir.core import Model, Value

META_KEY = "batch_axis"
"""Value.meta key of an input's samples axis named by the user."""


def sample_axes(model: Model) -> dict[str, int]:
    """Each input's samples axis (see the module doc)."""
    inputs = [v for v in model.graph.inputs if v.type.rank]
    axes: dict[str, int] = {}
    leading = {v.type.shape[0] for v in inputs if isinstance(v.type.shape[0], int)}
    common = inputs[0].type.shape[0] if inputs and len(leading) > 1 else None
    for value in model.graph.inputs:
        axes[value.name] = _axis_of(value, common)
    return axes


def _axis_of(value: Value, common: object) -> int:
    named = value.meta.get(META_KEY)
    if isinstance(named, int):
        return named
    shape = value.type.shape
    dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    if dynamic:
        return dynamic[0]
    if common is not None and common in shape:
        return shape.index(common)
    return 0


def is_default(axes: Mapping[str, int]) -> bool:
    return not any(axes.values())


def to_samples(model: Model, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays in the model's layout -> samples first (views)."""
    axes = sample_axes(model)
    return {k: np.moveaxis(v, axes.get(k, 0), 0) if axes.get(k, 0) else v for k, v in arrays.items()}


def to_model(model: Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Samples-first arrays (one batch) -> the model's layout, as runners take them (views)."""
    axes = sample_axes(model)
    if is_default(axes):
        return dict(feeds)
    return {k: np.moveaxis(v, 0, axes.get(k, 0)) if axes.get(k, 0) else v for k, v in feeds.items()}


def count(model: Model, feeds: Mapping[str, np.ndarray]) -> int:
    """Samples in one batch given in the model's layout."""
    if not feeds:
        return 0
    axes = sample_axes(model)
    name, array = next(iter(feeds.items()))
    axis = axes.get(name, 0)
    return int(array.shape[axis]) if array.ndim > axis else len(array)


def static_sizes(model: Model) -> dict[str, int]:
    """The static size of each input's samples axis (inputs whose samples axis is free are left out)."""
    axes = sample_axes(model)
    return {v.name: int(v.type.shape[axes[v.name]]) for v in model.graph.inputs
            if v.type.rank and isinstance(v.type.shape[axes[v.name]], int)}


FLAG = "--batch-axis"


def parse_batch_axes(texts: Sequence[str]) -> dict[str, int]:
    """Every `--batch-axis NAME=AXIS`; a usage error naming the text."""
    axes: dict[str, int] = {}
    for text in texts:
        name, sep, axis = text.rpartition("=")
        if not sep or not name.strip() or not axis.strip().lstrip("-").isdigit():
            raise UsageError(f"{FLAG} {text!r}: expected NAME=AXIS, e.g. state=1")
        if name.strip() in axes:
            raise UsageError(f"{FLAG} given twice for input {name.strip()!r}")
        axes[name.strip()] = int(axis)
    return axes


def name_batch_axes(model: Model, axes: Mapping[str, int]) -> None:
    """Record the samples axis the user names for each input (`meta["batch_axis"]`)."""
    inputs = {v.name: v for v in model.graph.inputs}
    for name, axis in axes.items():
        value = inputs.get(name)
        if value is None:
            raise UsageError(f"{FLAG} {name}={axis}: the model has no input {name!r} (inputs: {sorted(inputs)})")
        rank = value.type.rank
        if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
            raise UsageError(f"{FLAG} {name}={axis}: input {name!r} has {rank} axes {value.type.shape}")
        value.meta[META_KEY] = axis % rank
