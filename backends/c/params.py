"""The static parameter structs the kernels read (convolution, pooling, permutation and
broadcasting geometry) and float attributes as C literals: the same in every numeric mode."""

from __future__ import annotations

import numpy as np
from qcc.backends.c.lower import MAX_RANK, Lowering, static_shape

from qcc.ir.core import Node
from qcc.ir.ops._common import attr_list


def conv_params(lw: Lowering, node: Node, channels: tuple[int, int, int] | None = None) -> str:
    """The qcc_conv_t of a Conv; a pointwise one is one long row (longer inner loops). `channels`
    (inputs, outputs, groups) describes a slice of its channels instead of all of them."""
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    xs, ys = static_shape(x), static_shape(y)
    s, p, d = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
    o, _, kh, kw = static_shape(w)
    c, o, group = channels or (xs[1], o, node.attrs["group"])
    geom = [xs[0], c, xs[2], xs[3], o, ys[2], ys[3], kh, kw, s[0], s[1], p[0], p[1], d[0], d[1], group]
    if (kh, kw, *s, *p) == (1, 1, 1, 1, 0, 0, 0, 0):
        geom[2:4], geom[5:7] = [1, xs[2] * xs[3]], [1, ys[2] * ys[3]]
    return lw.struct("qcc_conv_t", f"qcc_p_{node.name}", geom)


def conv_transpose_params(lw: Lowering, node: Node) -> str:
    """The qcc_conv_t of a ConvTranspose: input geometry, output channels and map, begin pads
    (the end pads and output_padding are in the output's size)."""
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    xs, ys = static_shape(x), static_shape(y)
    s, p, d = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
    _, _, kh, kw = static_shape(w)
    geom = [xs[0], xs[1], xs[2], xs[3], ys[1], ys[2], ys[3], kh, kw, s[0], s[1], p[0], p[1], d[0], d[1],
            node.attrs["group"]]
    return lw.struct("qcc_conv_t", f"qcc_p_{node.name}", geom)


def pool_params(lw: Lowering, node: Node) -> tuple[str, int]:
    """The qcc_pool_t of a pooling node and its window size (the most elements one output reads)."""
    x, y = node.input(0), node.outputs[0]
    xs, ys = static_shape(x), static_shape(y)
    if len(xs) != 4:
        raise lw.unsupported(node, f"rank-{len(xs)} input (only NCHW pooling)")
    if node.op.startswith("Global"):
        kernel, strides, pads, include = [xs[2], xs[3]], [1, 1], [0, 0, 0, 0], 0
    else:
        kernel, strides, pads = node.attrs["kernel"], attr_list(node.attrs, "strides", 2, 1), node.attrs["pads"]
        include = int(node.attrs.get("count_include_pad", False))
    geom = [xs[0], xs[1], xs[2], xs[3], ys[2], ys[3], kernel[0], kernel[1], strides[0], strides[1],
            pads[0], pads[1], pads[2], pads[3], include]
    return lw.struct("qcc_pool_t", f"qcc_p_{node.name}", geom), kernel[0] * kernel[1]


def bcast_params(lw: Lowering, node: Node, always: bool = False) -> str:
    """The qcc_bcast_t of a binary node, "NULL" when both inputs have the output's shape (unless `always`)."""
    sa, sb, out = static_shape(node.input(0)), static_shape(node.input(1)), static_shape(node.outputs[0])
    if sa == out and sb == out and not always:
        return "NULL"
    rank = len(out)
    if rank > MAX_RANK:
        raise lw.unsupported(node, f"rank {rank} > {MAX_RANK}")

    def strides(shape: tuple[int, ...]) -> list[int]:
        full = (1,) * (rank - len(shape)) + shape
        st, acc = [0] * rank, 1
        for i in range(rank - 1, -1, -1):
            st[i] = 0 if full[i] == 1 else acc
            acc *= full[i]
        return st

    # axes of one element dropped, neighbours merged where both inputs' strides span the inner axis
    # (the same walk: the kernels' rows are the last axis, e.g. (C, H*W) for a per-channel operand)
    merged: list[tuple[int, int, int]] = []
    for n, a, b in zip(out, strides(sa), strides(sb)):
        if n == 1:
            continue
        if merged and merged[-1][1] == a * n and merged[-1][2] == b * n:
            merged[-1] = (merged[-1][0] * n, a, b)
        else:
            merged.append((n, a, b))
    if 0 in out or not merged:
        merged = [(0 if 0 in out else 1, 0, 0)]
    pad = [0] * (MAX_RANK - len(merged))
    fields: list[int | list[int]] = [len(merged), [*(m[0] for m in merged), *pad], [*(m[1] for m in merged), *pad],
                                     [*(m[2] for m in merged), *pad]]
    return lw.struct("qcc_bcast_t", f"qcc_p_{node.name}", fields)


def walk_fields(shape: list[int], strides: list[int]) -> list[int | list[int]]:
    """The qcc_perm_t fields of a walk over `shape` reading x at `strides`, with axes of one element
    dropped and neighbours merged where the outer one's stride spans the inner one (a channel
    shuffle's (g, c/g, h, w) transpose walks 3 axes, the last one a contiguous h*w run the kernel
    copies in a loop of its own). The elements are read in the same order."""
    dims = [(n, st) for n, st in zip(shape, strides) if n != 1]
    merged: list[tuple[int, int]] = []
    for n, st in dims:
        if merged and merged[-1][1] == st * n:
            merged[-1] = (merged[-1][0] * n, st)
        else:
            merged.append((n, st))
    if not merged and 0 not in shape:
        merged = [(1, 1)]
    if 0 in shape:
        merged = [(0, 1)]
    pad = [0] * (MAX_RANK - len(merged))
    return [len(merged), [*(n for n, _ in merged), *pad], [*(st for _, st in merged), *pad]]


def perm_params(lw: Lowering, node: Node) -> str:
    """The qcc_perm_t of a Transpose: output shape and the input stride each output axis walks."""
    x, y = node.input(0), node.outputs[0]
    perm = node.attrs["perm"]
    xs = static_shape(x)
    if len(xs) > MAX_RANK:
        raise lw.unsupported(node, f"rank {len(xs)} > {MAX_RANK}")
    in_strides = [int(np.prod(xs[i + 1:])) for i in range(len(xs))]
    fields = walk_fields(list(static_shape(y)), [in_strides[p] for p in perm])
    return lw.struct("qcc_perm_t", f"qcc_p_{node.name}", fields)


def float_literal(value: float) -> str:
    """A float attribute as the C float literal of its float32 value."""
    text = repr(float(np.float32(value)))
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return f"{text}f"
