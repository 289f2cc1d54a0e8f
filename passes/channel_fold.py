"""Per-channel affine maps moved into a layer's weights: the arithmetic fold-bn and equalize share.

Not a pass. A Conv / ConvTranspose / Dense computes y = W x + b. A per-channel map on its output,
y*s + t, is the layer with W*s per output channel and b*s + t (`fold_output_affine`); a map on
its input, x*s + t, is the layer with W*s per input channel and b + sum(W*t)
(`fold_input_affine`, exact for a Conv only where no padding is read or t is 0). The channel
layout of each weight (which axis holds output channels, how a grouped Conv's rows map to input
channels) lives here and nowhere else in the passes that scale channels. Arrays are float64.
"""

from __future__ import annotations

import numpy as np

from qcc.ir.core import Graph, Node


def output_view(layer: Node, w: np.ndarray, per_channel: np.ndarray) -> np.ndarray:
    """per_channel reshaped to broadcast over the weight's output channels."""
    if layer.op == "Conv":
        return per_channel.reshape(-1, *([1] * (w.ndim - 1)))
    if layer.op == "Dense":
        return per_channel.reshape(1, -1)
    group = int(layer.attrs["group"])  # ConvTranspose: (C, O/g, kh, kw), channel g*(O/g) + j
    c, og = w.shape[0], w.shape[1]
    full = np.broadcast_to(per_channel.reshape(group, 1, og, 1, 1), (group, c // group, og, 1, 1))
    return full.reshape(c, og, 1, 1)


def output_channels(layer: Node, w: np.ndarray) -> int:
    if layer.op == "Conv":
        return int(w.shape[0])
    if layer.op == "Dense":
        return int(w.shape[1])
    return int(w.shape[1]) * int(layer.attrs["group"])


def input_view(layer: Node, w: np.ndarray, per_channel: np.ndarray) -> np.ndarray:
    """per_channel (one entry per input channel of a Conv or Dense) laid over the weight."""
    if layer.op == "Dense":  # w (K, M): row k reads input k
        return per_channel.reshape(-1, 1)
    group = int(layer.attrs["group"])  # w (O, C/g, kh, kw): output o of group o // (O/g) reads g*(C/g) + i
    o, per_group = w.shape[0], w.shape[1]
    grouped = np.broadcast_to(per_channel.reshape(group, 1, per_group), (group, o // group, per_group))
    return grouped.reshape(o, per_group, *([1] * (w.ndim - 2)))


def output_ranges(layer: Node, w: np.ndarray) -> np.ndarray:
    """max |W| per output channel."""
    a = np.abs(np.asarray(w, dtype=np.float64))
    if layer.op == "Conv":
        return a.reshape(a.shape[0], -1).max(axis=1)
    if layer.op == "Dense":
        return a.max(axis=0)
    group = int(layer.attrs["group"])  # ConvTranspose (C, O/g, ...): rows g*(C/g).. feed outputs g*(O/g)..
    per_group = a.reshape(group, a.shape[0] // group, a.shape[1], -1)
    return per_group.max(axis=(1, 3)).reshape(-1)


def input_ranges(layer: Node, w: np.ndarray, channels: int) -> np.ndarray:
    """max |W| over everything one input channel (of a Conv or Dense) is multiplied by."""
    a = np.abs(np.asarray(w, dtype=np.float64))
    if layer.op == "Dense":
        return a.max(axis=1)
    group = int(layer.attrs["group"])
    taps = a.reshape(group, a.shape[0] // group, a.shape[1], -1).max(axis=(1, 3))  # (group, C/g)
    return taps.reshape(channels)


def fold_output_affine(layer: Node, w: np.ndarray, b: np.ndarray, s: np.ndarray,
                       t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') with layer'(x) = layer(x)*s + t per output channel."""
    return w * output_view(layer, w, s), b * s + t


def fold_input_affine(layer: Node, w: np.ndarray, b: np.ndarray, s: np.ndarray,
                      t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') with layer'(x) = layer(x*s + t) (t read at every tap: no padding, or t = 0)."""
    if not np.any(t):
        return w * input_view(layer, w, s), b
    if layer.op == "Dense":
        extra = (w * t.reshape(-1, 1)).sum(axis=0)
    else:
        extra = (w * input_view(layer, w, t)).sum(axis=(1, 2, 3))
    return w * input_view(layer, w, s), b + extra


def reads_padding(layer: Node) -> bool:
    """Whether some output of the layer reads a padded (zero) input position."""
    return layer.op == "Conv" and any(int(p) for p in layer.attrs["pads"])


def layer_bias(layer: Node, channels: int) -> np.ndarray:
    """The layer's bias in float64 (zeros when it has none)."""
    bias = layer.inputs[2] if len(layer.inputs) > 2 else None
    return np.zeros(channels) if bias is None or bias.const is None else bias.const.astype(np.float64)


def set_layer_bias(graph: Graph, layer: Node, new_b: np.ndarray) -> None:
    """Store new_b as the layer's bias (in the weight's dtype), adding a bias constant if it has none."""
    dtype = layer.input(1).type.dtype
    bias = layer.inputs[2] if len(layer.inputs) > 2 else None
    if bias is None:
        bias = graph.add_constant(graph.unique_name(f"{layer.name}.bias"), new_b.astype(dtype))
        if len(layer.inputs) < 3:
            layer.inputs = (*layer.inputs, None)
        layer.set_input(2, bias)
    else:
        bias.const = new_b.astype(dtype)
