"""The `fold-bn` pass: per-channel affine layers become part of an adjacent Conv / Dense.

A *channel-affine* node computes y = x*s + t per channel (axis 1): a BatchNorm with constant
statistics (s = gamma / sqrt(var + eps), t = beta - mean*s), or a Mul / Add / Sub of x and a
constant that varies at most along axis 1 (Caffe-style "scale layers": DenseNet's BatchNorm ->
Mul -> Add). A chain of them, each output read only by the next, is composed in float64 and:

1. folded into the Conv / ConvTranspose / Dense that produces its input (W' = W*s per output
   channel, b' = b*s + t), rounded once to the weight dtype; the layer's output takes the
   chain's last output name, so matching float and quantized runs by name stays right;
2. otherwise folded into the Conv / Dense that reads its output, when that is exact: W' = W*s
   per input channel, b' = b + sum W*t. A Conv with zero padding would see t where the
   original sees 0 at the border, so it takes only chains with t = 0;
3. otherwise, when longer than one node, replaced by one BatchNorm (a Mul -> Add pair becomes
   BatchNorm(gamma=s, beta=t, mean=0, var=1, eps=0)), so one tensor is quantized, not two;
4. with `standalone=conv`, a BatchNorm left over a (N, C, H, W) tensor becomes a depthwise 1x1
   Conv (weight s, bias t, group C): ONNX Runtime has no integer BatchNorm but runs that Conv
   as QLinearConv, and the quantization passes treat it like any Conv (per-channel weight:
   s kept to float32 rounding; int32 bias), so the simulator computes what ORT computes. Only
   for per-channel weight quantization (the int8/uint8 pipelines use it then): one scale for
   all channels' s would crush the small ones.

Refused, with a report line each (section `fold_bn`) for every BatchNorm left: a weight or
bias that is not a constant (a graph input or computed), a weight or bias another node also
uses, a layer output with other consumers, non-constant statistics, SIGN (binarized) weights,
padding under a shift. Mul / Add / Sub that fold nowhere stay as they are, without a line:
quantization handles them like any arithmetic.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
import numpy as np
from qcc.passes.channel_fold import (
    fold_input_affine,
    fold_output_affine,
    layer_bias,
    output_channels,
    reads_padding,
    set_layer_bias,
)
from qcc.passes.quantutil import check_choices, has_weight

from qcc.ir.core import Graph, Model, Node, Value
from qcc.ir.registry import get_schema
from qcc.ir.surgery import replace_node
from qcc.ir.types import Sign
from qcc.pm.base import Pass, PassContext, PassResult

SECTION = "fold_bn"
BN_STATS = "bn_stats"
"""value.meta key: (mean, std) per channel of a layer output that absorbed a BatchNorm."""
SCALE_OPS = ("Mul", "Add", "Sub")
"""Binary ops that are channel-affine when one operand is a per-channel constant."""


@attrs.frozen(eq=False)
class ChannelAffine:
    """y = x*scale + shift along axis 1 (float64, one entry per channel) computed by `nodes`."""

    nodes: tuple[Node, ...]
    x: Value
    scale: np.ndarray
    shift: np.ndarray

    @property
    def out(self) -> Value:
        return self.nodes[-1].outputs[0]

    def then(self, other: ChannelAffine) -> ChannelAffine:
        """self followed by other: x*(s1*s2) + (t1*s2 + t2)."""
        return ChannelAffine((*self.nodes, *other.nodes), self.x, self.scale * other.scale,
                             self.shift * other.scale + other.shift)


@attrs.frozen
class FoldBatchNorm(Pass):
    """Fold BatchNorm and per-channel Mul/Add into an adjacent Conv / ConvTranspose / Dense."""

    name = "fold-bn"

    standalone: Literal["keep", "conv"] = attrs.field(
        default="keep", metadata={"help": "a BatchNorm that folds nowhere: keep, or a depthwise 1x1 Conv"})

    def __attrs_post_init__(self) -> None:
        check_choices(self)

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        changed = False
        done: set[int] = set()
        for node in list(graph.nodes):
            if id(node) in done or (head := channel_affine(node)) is None or _continues(graph, head):
                continue
            chain = _chain(graph, head)
            done.update(id(n) for n in chain.nodes)
            modified, left = _fold_chain(graph, chain)
            changed |= modified
            if left is not None:
                bn, entry = left
                if self.standalone == "conv" and _as_depthwise_conv(graph, bn):
                    entry["reason"] += "; became a depthwise 1x1 Conv (standalone=conv)"
                    changed = True
                ctx.note(SECTION, entry)
        for node in graph.nodes:
            if node.op == "BatchNorm" and channel_affine(node) is None:
                ctx.note(SECTION, {"node": node.name, "folded": False, "reason": "BatchNorm statistics are not constants"})
        if not changed:
            return PassResult.unchanged(model)
        graph.cleanup()
        return PassResult(model, True, frozenset())


def _fold_chain(graph: Graph, chain: ChannelAffine) -> tuple[bool, tuple[Node, dict[str, Any]] | None]:
    """Fold the chain backwards, forwards, or merge it: (graph changed, BatchNorm left + report entry)."""
    reason = _refusal(graph, chain)
    if not reason:
        _fold_into_producer(graph, chain)
        return True, None
    forward = _forward_refusal(graph, chain)
    if not forward:
        _fold_into_consumer(graph, chain)
        return True, None
    entry: dict[str, Any] = {"folded": False, "reason": f"{reason}; {forward}"}
    if len(chain.nodes) > 1:
        bn = _merge(graph, chain)
        return True, (bn, {"node": bn.name, "merged": [n.name for n in chain.nodes[1:]], **entry})
    head = chain.nodes[0]
    return False, ((head, {"node": head.name, **entry}) if head.op == "BatchNorm" else None)


# ---------------------------------------------------------------------- recognizing


def channel_affine(node: Node) -> ChannelAffine | None:
    """The node as x*s + t per channel, or None (not that kind of node, or not constant)."""
    if node.op == "BatchNorm":
        if len(node.inputs) != 5 or any(v is None or v.const is None for v in node.inputs[1:]):
            return None
        s, t = bn_scale_shift(node)
        return ChannelAffine((node,), node.input(0), s, t)
    if node.op not in SCALE_OPS or len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    a, b = node.input(0), node.input(1)
    x, c = (b, a) if a.is_const and not b.is_const and node.op != "Sub" else (a, b)
    if x.is_const or c.const is None:
        return None
    vec = _per_channel(x, c.const)
    if vec is None:
        return None
    ones, zeros = np.ones_like(vec), np.zeros_like(vec)
    if node.op == "Mul":
        return ChannelAffine((node,), x, vec, zeros)
    return ChannelAffine((node,), x, ones, vec if node.op == "Add" else -vec)


def _per_channel(x: Value, c: np.ndarray) -> np.ndarray | None:
    """c as one float64 per channel of x (axis 1), when broadcasting c over x varies only there."""
    shape = x.type.shape
    if x.type.dtype != "float32" or c.dtype != np.float32 or len(shape) < 2 or c.ndim > len(shape):
        return None
    channels = shape[1]
    if not isinstance(channels, int):
        return None
    full = (1,) * (len(shape) - c.ndim) + tuple(c.shape)
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,)).copy()


def bn_scale_shift(bn: Node) -> tuple[np.ndarray, np.ndarray]:
    """(s, t) with BatchNorm(x) = x*s + t per channel, in float64."""
    gamma, beta, mean, var = (np.asarray(v.const, dtype=np.float64) for v in bn.inputs[1:])  # type: ignore[union-attr]
    s = gamma / np.sqrt(var + float(bn.attrs["epsilon"]))
    return s, beta - mean * s


def _sole_reader(graph: Graph, value: Value) -> Node | None:
    """The one node reading value (once), when value is not also a graph output."""
    uses = value.uses()
    if len(uses) != 1 or any(v is value for v in graph.outputs):
        return None
    return uses[0][0]


def _continues(graph: Graph, head: ChannelAffine) -> bool:
    """head's input comes from a channel-affine node it alone reads: part of that node's chain."""
    producer = head.x.producer()
    return producer is not None and _sole_reader(graph, head.x) is head.nodes[0] and channel_affine(producer) is not None


def _chain(graph: Graph, head: ChannelAffine) -> ChannelAffine:
    """head extended by the channel-affine nodes that alone read each previous output."""
    chain = head
    while (reader := _sole_reader(graph, chain.out)) is not None:
        nxt = channel_affine(reader)
        if nxt is None or nxt.x is not chain.out:
            break
        chain = chain.then(nxt)
    return chain


# ---------------------------------------------------------------------- folding backwards


def _refusal(graph: Graph, chain: ChannelAffine) -> str:
    """Why the chain cannot fold into the layer producing its input ('' when it can)."""
    layer = chain.x.producer()
    if layer is None or not has_weight(layer):
        return "not preceded by Conv, ConvTranspose or Dense"
    if _sole_reader(graph, chain.x) is None:
        return f"output of {layer.op} {layer.name!r} has other consumers"
    reason = _parameter_refusal(graph, layer)
    if reason:
        return reason
    if layer.op == "Dense" and chain.x.type.rank != 2:
        return "BatchNorm after Dense must normalize a (N, M) tensor"
    return ""


def _parameter_refusal(graph: Graph, layer: Node) -> str:
    for index, role in ((1, "weight"), (2, "bias")):
        value = layer.inputs[index] if index < len(layer.inputs) else None
        if value is None:
            continue
        if value.const is None:
            kind = "a graph input" if any(v is value for v in graph.inputs) else "not a constant"
            return f"{role} {value.name!r} of {layer.name!r} is {kind}"
        if len(value.uses()) != 1:
            return f"{role} {value.name!r} of {layer.name!r} is shared with other nodes"
        if isinstance(value.quant, Sign):
            return f"{role} {value.name!r} of {layer.name!r} is binary (SIGN)"
    return ""


def _fold_into_producer(graph: Graph, chain: ChannelAffine) -> None:
    layer = chain.x.producer()
    assert layer is not None
    weight = layer.input(1)
    w = weight.const
    assert w is not None
    new_w, new_b = fold_output_affine(layer, w, layer_bias(layer, chain.scale.shape[0]), chain.scale, chain.shift,
                                      store=w.dtype)
    weight.const = new_w
    set_layer_bias(graph, layer, new_b)
    stats = _normalized_stats(chain)
    _bypass(graph, chain, layer.outputs[0])
    if stats is not None:
        layer.outputs[0].meta[BN_STATS] = stats


def _normalized_stats(chain: ChannelAffine) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-channel (mean, std) of the chain's output as its BatchNorm promises it (beta, |gamma|,
    through the Mul/Add after it): what analytical bias correction and bias absorption assume
    about a folded layer's output when no data is given (Nagel et al. 2019)."""
    head = chain.nodes[0]
    if head.op != "BatchNorm":
        return None
    gamma, beta = (np.asarray(v.const, np.float64) for v in head.inputs[1:3])  # type: ignore[union-attr]
    mean, std = beta.copy(), np.abs(gamma)
    for part in map(channel_affine, chain.nodes[1:]):
        assert part is not None
        mean, std = mean * part.scale + part.shift, std * np.abs(part.scale)
    return mean, std


def _bypass(graph: Graph, chain: ChannelAffine, value: Value) -> None:
    """Remove the chain's nodes; value (which replaces the chain output) takes its name."""
    last = chain.out
    last.replace_all_uses_with(value, graph)
    for node in reversed(chain.nodes):
        graph.remove(node)
    _take_name(graph, value, last)


def _take_name(graph: Graph, value: Value, gone: Value) -> None:
    """value inherits the removed value's name (and user annotations)."""
    value.name = gone.name
    if gone.quant is not None and value.quant is None:
        value.quant = gone.quant
    for key, item in gone.meta.items():
        value.meta.setdefault(key, item)


# ---------------------------------------------------------------------- folding forwards


def _forward_refusal(graph: Graph, chain: ChannelAffine) -> str:
    """Why the chain cannot fold into the Conv / Dense reading its output ('' when it can)."""
    layer = _sole_reader(graph, chain.out)
    if layer is None:
        return "its output has several readers (or is a graph output)"
    if not has_weight(layer) or get_schema(layer.op).has("scatters") or layer.inputs[0] is not chain.out:
        return f"followed by {layer.op} {layer.name!r}, not by a Conv or Dense it can fold into"
    reason = _parameter_refusal(graph, layer)
    if reason:
        return reason
    if reads_padding(layer) and np.any(chain.shift):
        return f"{layer.op} {layer.name!r} pads with zeros where the shift would be"
    return ""


def _fold_into_consumer(graph: Graph, chain: ChannelAffine) -> None:
    layer = _sole_reader(graph, chain.out)
    assert layer is not None
    weight = layer.input(1)
    w = weight.const
    assert w is not None
    w64 = w.astype(np.float64)
    new_w, new_b = fold_input_affine(layer, w64, layer_bias(layer, output_channels(layer, w)), chain.scale, chain.shift)
    weight.const = np.ascontiguousarray(new_w.astype(w.dtype))
    set_layer_bias(graph, layer, new_b)
    layer.set_input(0, chain.x)
    for node in reversed(chain.nodes):
        graph.remove(node)


# ---------------------------------------------------------------------- merging


def _merge(graph: Graph, chain: ChannelAffine) -> Node:
    """One BatchNorm computing the whole chain; it takes the chain's output name."""
    head, tail = chain.nodes[0], chain.nodes[1:]
    if head.op == "BatchNorm":  # keep its statistics: gamma*s, beta*s + t for the rest x*s + t
        s, t = np.ones_like(chain.scale), np.zeros_like(chain.shift)
        for part in map(channel_affine, tail):
            assert part is not None
            s, t = s * part.scale, t * part.scale + part.shift
        gamma, beta = (np.asarray(v.const, np.float64) for v in head.inputs[1:3])  # type: ignore[union-attr]
        params, stats = [gamma * s, beta * s + t], list(head.inputs[3:])
        epsilon = float(head.attrs["epsilon"])
    else:  # Mul / Add / Sub first: gamma = s, beta = t, mean 0, var 1, eps 0 (exactly x*s + t)
        params, stats, epsilon = [chain.scale, chain.shift], [], 0.0
        params += [np.zeros_like(chain.scale), np.ones_like(chain.scale)]
    names = ("scale", "bias", "mean", "var")
    consts = [graph.add_constant(graph.unique_name(f"{head.name}.{n}"), p.astype(np.float32))
              for n, p in zip(names, params)]
    bn = replace_node(graph, head, "BatchNorm", [chain.x, *consts, *stats], {"epsilon": epsilon})
    if tail:
        _bypass(graph, attrs.evolve(chain, nodes=tail), bn.outputs[0])
    return bn


def _as_depthwise_conv(graph: Graph, bn: Node) -> bool:
    """Replace a BatchNorm over (N, C, H, W) by Conv(x, s (C,1,1,1), t, group=C); False if not 4-D."""
    affine = channel_affine(bn)
    if affine is None or affine.x.type.rank != 4:
        return False
    dtype = affine.x.type.dtype
    channels = len(affine.scale)
    weight = graph.add_constant(graph.unique_name(f"{bn.name}.weight"),
                                affine.scale.reshape(channels, 1, 1, 1).astype(dtype))
    bias = graph.add_constant(graph.unique_name(f"{bn.name}.bias"), affine.shift.astype(dtype))
    replace_node(graph, bn, "Conv", [affine.x, weight, bias], {"group": channels})
    return True
