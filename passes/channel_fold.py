"""Per-channel affine maps moved into a layer's weights: the arithmetic fold-bn and equalize share.

Not a pass. A weighted layer (Conv / ConvTranspose / Dense) computes y = W x + b. A per-channel
map on its output, y*s + t, is the layer with W*s per output channel and b*s + t
(`fold_output_affine`); a map on its input, x*s + t, is the layer with W*s per input channel and
b + sum(W*t) (`fold_input_affine`, exact only where every output reads t at every tap: no
padding, not a `scatters` op, or t = 0).

The layout comes from the registry, not from op names: the weight's role names its
output-channel axis (0 for Conv, 1 for ConvTranspose and Dense), the other of axes 0 and 1
holds input channels, and `group` splits axis 0 into blocks whose axis-1 channels are numbered
block by block (Conv (O, C/g, kh, kw): output o reads channels (o // (O/g)) * C/g + i). Arrays
are float64.
"""

from __future__ import annotations

import numpy as np

from qcc.ir.core import Graph, Node, Value
from qcc.ir.registry import get_schema


def _weight_axis(layer: Node) -> int:
    axis = get_schema(layer.op).weight_axis
    assert axis is not None, f"{layer.op} has no weight"
    return axis


def _group(layer: Node) -> int:
    return int(layer.attrs.get("group", 1))


def _channels_on(w: np.ndarray, axis: int, group: int) -> int:
    return int(w.shape[0]) if axis == 0 else int(w.shape[1]) * group


def _view_on(w: np.ndarray, axis: int, group: int, per_channel: np.ndarray) -> np.ndarray:
    """per_channel (one entry per channel of `axis`) laid over the weight."""
    tail = [1] * (w.ndim - 2)
    if axis == 0:
        return per_channel.reshape(-1, 1, *tail)
    rows, cols = int(w.shape[0]), int(w.shape[1])
    grouped = np.broadcast_to(per_channel.reshape(group, 1, cols), (group, rows // group, cols))
    return grouped.reshape(rows, cols, *tail)


def _reduce_on(a: np.ndarray, axis: int, group: int, reduce: str) -> np.ndarray:
    """max or sum of `a` (weight-shaped) over everything but the channels of `axis`."""
    op = np.max if reduce == "max" else np.sum
    if axis == 0:
        return np.asarray(op(a.reshape(a.shape[0], -1), axis=1))
    blocks = a.reshape(group, a.shape[0] // group, a.shape[1], -1)
    return np.asarray(op(blocks, axis=(1, 3))).reshape(-1)


def output_channels(layer: Node, w: np.ndarray) -> int:
    return _channels_on(w, _weight_axis(layer), _group(layer))


def output_view(layer: Node, w: np.ndarray, per_channel: np.ndarray) -> np.ndarray:
    """per_channel reshaped to broadcast over the weight's output channels."""
    return _view_on(w, _weight_axis(layer), _group(layer), per_channel)


def input_view(layer: Node, w: np.ndarray, per_channel: np.ndarray) -> np.ndarray:
    """per_channel (one entry per input channel) laid over the weight."""
    return _view_on(w, 1 - _weight_axis(layer), _group(layer), per_channel)


def output_ranges(layer: Node, w: np.ndarray) -> np.ndarray:
    """max |W| per output channel."""
    return _reduce_on(np.abs(np.asarray(w, dtype=np.float64)), _weight_axis(layer), _group(layer), "max")


def input_ranges(layer: Node, w: np.ndarray, channels: int) -> np.ndarray:
    """max |W| over everything one input channel is multiplied by."""
    ranges = _reduce_on(np.abs(np.asarray(w, dtype=np.float64)), 1 - _weight_axis(layer), _group(layer), "max")
    return ranges.reshape(channels)


def fold_output_affine(layer: Node, w: np.ndarray, b: np.ndarray, s: np.ndarray,
                       t: np.ndarray, store: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') with layer'(x) = layer(x)*s + t per output channel.

    store: W' computed in float64 but written straight into an array of that dtype (the bits of
    `(w.astype(float64) * s).astype(store)` without the two float64 copies of a large weight).
    """
    if store is None:
        return w * output_view(layer, w, s), b * s + t
    new_w = np.multiply(w, output_view(layer, w, s), dtype=np.float64, out=np.empty(w.shape, store),
                        casting="same_kind")
    return new_w, b * s + t


def fold_input_affine(layer: Node, w: np.ndarray, b: np.ndarray, s: np.ndarray,
                      t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') with layer'(x) = layer(x*s + t) (t read at every tap: see `reads_padding`, or t = 0)."""
    return w * input_view(layer, w, s), input_shift_bias(layer, w, b, t)


def input_shift_bias(layer: Node, w: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """fold_input_affine's bias alone: b' with layer'(x) = layer(x + t) for the unscaled weight
    (equalize's bias absorption moves a shift without rescaling: no copy of the weight)."""
    if not np.any(t):
        return b
    return b + _reduce_on(w * input_view(layer, w, t), _weight_axis(layer), _group(layer), "sum")


def reads_padding(layer: Node) -> bool:
    """Whether some output of the layer misses an input tap (zero padding, or a `scatters` op's
    border), so that a constant input channel does not add a constant to every output."""
    return get_schema(layer.op).has("scatters") or any(int(p) for p in layer.attrs.get("pads", ()))


def layer_weight(layer: Node) -> Value:
    index = get_schema(layer.op).weight_input
    assert index is not None, f"{layer.op} has no weight"
    return layer.input(index)


def layer_bias_value(layer: Node) -> Value | None:
    index = get_schema(layer.op).bias_input
    return layer.inputs[index] if index is not None and index < len(layer.inputs) else None


def layer_bias(layer: Node, channels: int) -> np.ndarray:
    """The layer's bias in float64 (zeros when it has none)."""
    bias = layer_bias_value(layer)
    return np.zeros(channels) if bias is None or bias.const is None else bias.const.astype(np.float64)


def set_layer_bias(graph: Graph, layer: Node, new_b: np.ndarray) -> None:
    """Store new_b as the layer's bias (in the weight's dtype), adding a bias constant if it has none."""
    dtype = layer_weight(layer).type.dtype
    bias = layer_bias_value(layer)
    if bias is not None:
        bias.const = new_b.astype(dtype)
        return
    index = get_schema(layer.op).bias_input
    assert index is not None, f"{layer.op} has no bias input"
    bias = graph.add_constant(graph.unique_name(f"{layer.name}.bias"), new_b.astype(dtype))
    if len(layer.inputs) <= index:
        layer.inputs = (*layer.inputs, *([None] * (index + 1 - len(layer.inputs))))
    layer.set_input(index, bias)
