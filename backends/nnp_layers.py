"""The issue-17 ops written as nnabla functions: PRelu -> PReLU, LayerNorm/InstanceNorm/GroupNorm ->
the nnabla normalizations, Resize -> Interpolate, ReduceL2 -> Norm (p = 2). Registered in
`qcc.backends.nnp.EMITTERS` (which loads this module); `qcc.frontends.nnp_layers` reads them back.
"""

from __future__ import annotations

import numpy as np
from qcc.backends.nnp import NnpWriter, _one, emitter

from qcc.errors import UnsupportedError
from qcc.formats.nnabla_functions import INTERPOLATE_COORDINATES
from qcc.ir.core import Node, Value


def _refuse(node: Node, why: str) -> UnsupportedError:
    return UnsupportedError(f"nnp backend: node {node.name!r} ({node.op}): {why}")


def _const(node: Node, value: Value | None, what: str) -> np.ndarray | None:
    if value is None:
        return None
    if value.const is None:
        raise _refuse(node, f"{what} {value.name!r} must be a constant")
    return value.const


@emitter("PRelu")
def _prelu(w: NnpWriter, node: Node) -> None:
    """One slope, or one per index of a single axis (nnabla's base_axis)."""
    x = node.input(0)
    slope = _const(node, node.input(1), "slope")
    assert slope is not None
    full = (1,) * (x.type.rank - slope.ndim) + slope.shape
    axes = [i for i, d in enumerate(full) if d != 1]
    if len(axes) > 1 or (axes and axes[0] == 0):
        raise _refuse(node, f"slope of shape {slope.shape} varies along several axes or the batch")
    base = axes[0] if axes else 1
    _one(w, node, "PReLU", {"base_axis": base}, [w.operand(x), w.param(node.input(1).name, slope.reshape(-1))])


def _normalization(w: NnpWriter, node: Node, ftype: str, args: dict[str, object], shape: tuple[int, ...]) -> None:
    """x, beta, gamma (nnabla's order), each parameter in the broadcast `shape`."""
    scale, bias = (_const(node, node.inputs[i] if i < len(node.inputs) else None, what)
                   for i, what in ((1, "scale"), (2, "bias")))
    ins = [w.operand(node.input(0))]
    if bias is not None:
        ins.append(w.param(node.input(2).name, bias.reshape(shape)))
    if scale is not None:
        ins.append(w.param(node.input(1).name, scale.reshape(shape)))
    _one(w, node, ftype, {**args, "no_scale": scale is None, "no_bias": bias is None}, ins)


@emitter("LayerNorm")
def _layer_norm(w: NnpWriter, node: Node) -> None:
    x = node.input(0)
    axis = node.attrs["axis"] % x.type.rank
    shape = (1,) * axis + tuple(int(d) for d in x.type.shape[axis:])
    _normalization(w, node, "LayerNormalization", {"batch_axis": list(range(axis)), "eps": node.attrs["epsilon"]},
                   shape)


@emitter("InstanceNorm", "GroupNorm")
def _channel_norm(w: NnpWriter, node: Node) -> None:
    x = node.input(0)
    shape = (1, int(x.type.shape[1])) + (1,) * (x.type.rank - 2)
    args: dict[str, object] = {"channel_axis": 1, "batch_axis": [0], "eps": node.attrs["epsilon"]}
    if node.op == "GroupNorm":
        args["num_groups"] = node.attrs["num_groups"]
    _normalization(w, node, "GroupNormalization" if node.op == "GroupNorm" else "InstanceNormalization", args, shape)


@emitter("Resize")
def _resize(w: NnpWriter, node: Node) -> None:
    """nnabla's Interpolate resizes the trailing axes with scales = output / input sizes and
    floors nearest indices (INTERPOLATE_COORDINATES: which ONNX coordinate modes it has)."""
    a = node.attrs
    x, y = node.input(0).type.shape, node.outputs[0].type.shape
    changed = [i for i, (d, s) in enumerate(zip(x, y)) if d != s or a["scales"][i] != 1.0]
    first = min(changed, default=len(x) - 1)
    if first == 0:
        raise _refuse(node, "resizes the batch axis")
    for i in range(first, len(x)):
        if a["scales"][i] != float(np.float32(y[i]) / np.float32(x[i])):
            raise _refuse(node, f"scale {a['scales'][i]} of axis {i} is not output / input size (nnabla's Interpolate "
                                "derives it from the sizes)")
    coordinates = a["coordinate_transformation_mode"]
    if coordinates == "pytorch_half_pixel" and all(int(d) > 1 for d in y[first:]):
        coordinates = "half_pixel"  # they differ only for an output of size 1
    flags = next((k for k, v in INTERPOLATE_COORDINATES.items() if k[0] == a["mode"] and v == coordinates), None)
    if flags is None or (a["mode"] == "nearest" and a["nearest_mode"] != "floor"):
        raise _refuse(node, f"{a['mode']} with {a['coordinate_transformation_mode']}/{a['nearest_mode']}: nnabla's "
                            "Interpolate has no such coordinate mode")
    _, align, half, half_nn = flags
    _one(w, node, "Interpolate", {"output_size": [int(d) for d in y[first:]], "mode": a["mode"], "align_corners": align,
                                  "half_pixel": half, "half_pixel_for_nn": half_nn, "channel_last": False})


@emitter("ReduceL2")
def _norm(w: NnpWriter, node: Node) -> None:
    rank = node.input(0).type.rank
    _one(w, node, "Norm", {"p": 2.0, "axes": [a % rank for a in node.attrs["axes"]], "keep_dims": node.attrs["keepdims"]})
