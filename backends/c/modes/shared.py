"""Lowerings more than one numeric mode uses: the mode object supplies element types, the
getter/setter scales and the arguments of an element conversion, so the op's code is written once."""

from __future__ import annotations

import numpy as np
from qcc.backends.c.ctype import FLOAT, INDEX
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import indexing as KI
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.kernels import normalization as KN
from qcc.backends.c.kernels import reduce as KRd
from qcc.backends.c.kernels import resize as KR
from qcc.backends.c.lower import MAX_RANK, Arg, Call, Lowering, Ptr, Step, numel, static_shape
from qcc.backends.c.params import float_literal, perm_params, walk_fields

import qcc.sim.f32 as f32
from qcc.ir.core import Node
from qcc.ir.ops.indexing import gather_indices
from qcc.ir.ops.normalization import groups_of
from qcc.ir.ops.tensor import block_transpose
from qcc.sim import affine_int as ai
from qcc.sim import fixed as fx


def unary_params(lw: Lowering, node: Node) -> list[Arg]:
    """The float parameters of a one-input activation (kernels.elementwise.UNARY), as C literals."""
    extra: list[Arg] = []
    for key in KE.UNARY[node.op][1]:
        if node.op == "Gelu":
            extra.append("1.0f" if node.attrs["approximate"] == "tanh" else "0.0f")
        elif node.op == "Clip":
            bound = node.attrs["min" if key == "lo" else "max"]
            if bound is None:
                lw.kernels.uses_math = True
            extra.append(("-HUGE_VALF" if key == "lo" else "HUGE_VALF") if bound is None else float_literal(bound))
        else:
            extra.append(float_literal(node.attrs[key]))
    return extra


def unary(lw: Lowering, node: Node) -> Step:
    """A one-input activation in float32 between the getter of x and the setter of y."""
    x, y = node.input(0), node.outputs[0]
    cx, cy = lw.ctype(x), lw.ctype(y)
    fn = KE.unary(lw.kernels, node.op, cx, cy)
    step = Step(node, [Call(fn, (Ptr(x), Ptr(y), str(numel(y)), *lw.scales(x, y), *unary_params(lw, node)))])
    step.inplace = (0,) if cx.size == cy.size else ()
    return step


def softmax(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    axis = node.attrs["axis"] % len(shape)
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    fn = KN.softmax(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (Ptr(x), Ptr(y), str(outer), str(shape[axis]), str(inner), *lw.scales(x, y)))])
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


def batchnorm_arrays(lw: Lowering, node: Node) -> list[Arg]:
    """mean, gamma, beta and sqrt(var + eps) as float32 arrays (computed by qcc.sim.fixed)."""
    params = [node.input(i) for i in range(1, 5)]
    for value in params:
        if value.const is None:
            raise lw.unsupported(node, f"parameter {value.name!r} is not a constant")
    stored = [np.zeros(0)] + [fx.quantize_param(v) for v in params]
    arrays = fx.batchnorm_params(node, stored)
    return [lw.array(a.astype(np.float32), FLOAT, f"qcc_bn_{node.name}_{what}", f"{node.name} {what}")
            for a, what in zip(arrays, ("mean", "gamma", "beta", "std"))]


def batchnorm(lw: Lowering, node: Node) -> Step:
    """Float32 between the getter and the setter (every mode; parameters computed by qcc)."""
    x, y = node.input(0), node.outputs[0]
    names = batchnorm_arrays(lw, node)
    shape = static_shape(x)
    inner = int(np.prod(shape[2:]))
    fn = KN.batchnorm(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (Ptr(x), Ptr(y), *names, str(shape[0]), str(shape[1]), str(inner),
                                 *lw.scales(x, y)))])
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


def concat(lw: Lowering, node: Node) -> Step:
    """One copy per input into its slice of the output, converting each element to y's type."""
    y = node.outputs[0]
    shape = static_shape(y)
    axis = node.attrs["axis"] % len(shape)
    outer, total = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    calls, offset = [], 0
    for value in node.inputs:
        assert value is not None
        inner = int(np.prod(static_shape(value)[axis:]))
        fn = KM.concat_part(lw.kernels, lw.ctype(value), lw.ctype(y))
        calls.append(Call(fn, (lw.operand(value, node), Ptr(y), str(outer), str(inner), str(total), str(offset),
                               *lw.mode.copy_args(lw, node, value, y))))
        offset += inner
    return Step(node, calls)


def transpose(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    fn = KM.transpose(lw.kernels, lw.ctype(x), lw.ctype(y))
    args: list[Arg] = [lw.operand(x, node), Ptr(y), perm_params(lw, node), *lw.mode.copy_args(lw, node, x, y)]
    return Step(node, [Call(fn, tuple(args))])


def view(lw: Lowering, node: Node) -> Step:
    """A view with the input's annotation is the input's storage; with another one, a
    requantizing copy (in place when the input dies here and the element size is the same)."""
    x, y = node.input(0), node.outputs[0]
    if x.quant == y.quant:
        return Step(node, alias=True)
    fn = KM.requant(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (lw.operand(x, node), Ptr(y), str(numel(y)), *lw.mode.copy_args(lw, node, x, y)))])
    step.inplace = (0,) if x.const is None and lw.ctype(x).size == lw.ctype(y).size else ()
    return step


# ---------------------------------------------------------------- issue 17: layers in every mode


def index_array(lw: Lowering, data: np.ndarray, base: str, comment: str) -> str:
    return lw.array(np.asarray(data, dtype=np.int64), INDEX, base, comment)


def float_array(lw: Lowering, data: np.ndarray, base: str, comment: str) -> str:
    return lw.array(np.asarray(data, dtype=np.float32), FLOAT, base, comment)


def float_param(lw: Lowering, node: Node, index: int, what: str) -> str:
    """A parameter of a float32 kernel, as every mode reads it (qcc.sim.fixed.param_values)."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        return "NULL"
    if value.const is None:
        raise lw.unsupported(node, f"{what} {value.name!r} is not a constant")
    return float_array(lw, fx.param_values(value), f"qcc_{what}_{node.name}", f"{what} of {node.name}")


def _own_buffer(lw: Lowering, step: Step) -> Step:
    x, y = step.node.input(0), step.node.outputs[0]
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


def layernorm(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    axis = node.attrs["axis"] % len(shape)
    rows, n = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    fn = KN.layernorm(lw.kernels, lw.ctype(x), lw.ctype(y))
    args = (Ptr(x), Ptr(y), float_param(lw, node, 1, "scale"), float_param(lw, node, 2, "bias"), str(rows), str(n),
            float_literal(node.attrs["epsilon"]), *lw.scales(x, y))
    return _own_buffer(lw, Step(node, [Call(fn, args)]))


def groupnorm(lw: Lowering, node: Node) -> Step:
    """GroupNorm and InstanceNorm (one group per channel)."""
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    groups = groups_of(node)
    fn = KN.groupnorm(lw.kernels, lw.ctype(x), lw.ctype(y))
    args = (Ptr(x), Ptr(y), float_param(lw, node, 1, "scale"), float_param(lw, node, 2, "bias"), str(shape[0]),
            str(groups), str(shape[1] // groups), str(int(np.prod(shape[2:]))), float_literal(node.attrs["epsilon"]),
            *lw.scales(x, y))
    return _own_buffer(lw, Step(node, [Call(fn, args)]))


def resize(lw: Lowering, node: Node) -> Step:
    """Nearest: a move (the mode's element copy); linear: float32 between getter and setter."""
    x, y = node.input(0), node.outputs[0]
    try:
        py, px = f32.resize_axes(node)
    except ValueError as exc:
        raise lw.unsupported(node, str(exc)) from None
    xs, ys = static_shape(x), static_shape(y)
    geometry = [str(int(np.prod(xs[:-2]))), str(xs[-2]), str(xs[-1]), str(ys[-2]), str(ys[-1])]
    base = f"qcc_r_{node.name}"
    if node.attrs["mode"] == "nearest":
        rows, cols = (index_array(lw, p.lo, f"{base}_{a}", f"source {a} of {node.name}") for p, a in ((py, "y"), (px, "x")))
        fn = KR.nearest(lw.kernels, lw.ctype(x), lw.ctype(y))
        return Step(node, [Call(fn, (Ptr(x), Ptr(y), *geometry, rows, cols, *lw.mode.copy_args(lw, node, x, y)))])
    extra = []
    for plan, axis in ((py, "y"), (px, "x")):
        extra += [index_array(lw, plan.lo, f"{base}_{axis}0", f"first source {axis} of {node.name}"),
                  index_array(lw, plan.hi, f"{base}_{axis}1", f"second source {axis} of {node.name}"),
                  float_array(lw, plan.w_lo, f"{base}_w{axis}0", f"weight of the first {axis}"),
                  float_array(lw, plan.w_hi, f"{base}_w{axis}1", f"weight of the second {axis}")]
    fn = KR.linear(lw.kernels, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), *geometry, *extra, *lw.scales(x, y)))])


def block_move(lw: Lowering, node: Node) -> Step:
    """DepthToSpace/SpaceToDepth: the transpose of a 6-D view (qcc.ir.ops.tensor.block_transpose)."""
    x, y = node.input(0), node.outputs[0]
    view, perm = block_transpose(node)
    strides = [int(np.prod(view[i + 1:])) for i in range(len(view))]
    fields = walk_fields([view[p] for p in perm], [strides[p] for p in perm])
    params = lw.struct("qcc_perm_t", f"qcc_p_{node.name}", fields)
    fn = KM.transpose(lw.kernels, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, *lw.mode.copy_args(lw, node, x, y)))])


def _axis_view(shape: tuple[int, ...], axis: int) -> tuple[str, str, str]:
    return str(int(np.prod(shape[:axis]))), str(shape[axis]), str(int(np.prod(shape[axis + 1:])))


def gather(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    axis = node.attrs["axis"] % len(shape)
    index = index_array(lw, gather_indices(node).reshape(-1), f"qcc_i_{node.name}", f"indices of {node.name}")
    fn = KM.gather(lw.kernels, lw.ctype(x), lw.ctype(y))
    outer, size, inner = _axis_view(shape, axis)
    args = (Ptr(x), Ptr(y), outer, size, inner, str(len(node.attrs["indices"])), index,
            *lw.mode.copy_args(lw, node, x, y))
    return Step(node, [Call(fn, args)])


def argmax(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    fn = KI.argmax(lw.kernels, lw.ctype(x))
    args = (Ptr(x), Ptr(y), *_axis_view(shape, node.attrs["axis"] % len(shape)),
            str(int(node.attrs["select_last_index"])))
    return Step(node, [Call(fn, args)])


def topk(lw: Lowering, node: Node) -> Step:
    x, (values, indices) = node.input(0), node.outputs
    shape = static_shape(x)
    fn = KI.topk(lw.kernels, lw.ctype(x), lw.ctype(values))
    args = (Ptr(x), Ptr(values), Ptr(indices), *_axis_view(shape, node.attrs["axis"] % len(shape)),
            str(node.attrs["k"]), str(int(node.attrs["largest"])), *lw.mode.copy_args(lw, node, x, values))
    return Step(node, [Call(fn, args)])


def reduce_geometry(lw: Lowering, node: Node) -> list[str]:
    try:
        return [str(d) for d in f32.reduce_geometry(node, static_shape(node.input(0)))]
    except ValueError as exc:
        raise lw.unsupported(node, str(exc)) from None


def reduce_float(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    fn = KRd.reduce_f32(lw.kernels, node.op, lw.ctype(x), lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), *reduce_geometry(lw, node), *lw.scales(x, y)))])


def matmul_args(lw: Lowering, node: Node) -> list[Arg]:
    """a, b, y, the batch count and element offsets of each batch's a and b matrices (broadcast
    batch axes repeat one), m, k, n."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    sa, sb, sy = static_shape(a), static_shape(b), static_shape(y)
    batch_shape = sy[:-2]
    offsets = []
    for shape in (sa, sb):
        dims = (1,) * (len(batch_shape) - (len(shape) - 2)) + shape[:-2]
        size = shape[-2] * shape[-1]
        strides = [int(np.prod(dims[i + 1:])) * size if d != 1 else 0 for i, d in enumerate(dims)]
        grid = np.indices(batch_shape).reshape(len(batch_shape), -1) if batch_shape else np.zeros((0, 1), np.int64)
        offsets.append((np.asarray(strides, dtype=np.int64).reshape(-1, 1) * grid).sum(axis=0))
    count = int(np.prod(batch_shape))
    ao, bo = (index_array(lw, off, f"qcc_o{w}_{node.name}", f"batch offsets of {w} in {node.name}")
              for off, w in zip(offsets, "ab"))
    return [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(count), ao, bo, str(sa[-2]), str(sa[-1]),
            str(sb[-1])]


def _strided_copy(lw: Lowering, node: Node, y_index: int, slices: list[slice]) -> Call:
    """The call copying x[slices] into output `y_index` (requantized like any move)."""
    x, y = node.input(0), node.outputs[y_index]
    xs = static_shape(x)
    if len(xs) > MAX_RANK:
        raise lw.unsupported(node, f"rank {len(xs)} > {MAX_RANK}")
    strides = [int(np.prod(xs[i + 1:])) for i in range(len(xs))]
    start, shape, steps = 0, [], []
    for size, stride, s in zip(xs, strides, slices):
        first, stop, step = s.indices(size)
        shape.append(len(range(first, stop, step)))
        steps.append(stride * step)
        start += first * stride
    params = lw.struct("qcc_perm_t", f"qcc_p_{y.name}", walk_fields(shape, steps))
    fn = KM.strided(lw.kernels, lw.ctype(x), lw.ctype(y))
    return Call(fn, (lw.operand(x, node), Ptr(y), params, str(start), *lw.mode.copy_args(lw, node, x, y)))


def pad(lw: Lowering, node: Node) -> Step:
    """Per-axis source index maps (np.pad of the indices, -1 for the constant fill) and the fill in
    y's storage (affine: quantized like a graph input, qcc.sim.affine_int.pad_kernel)."""
    x, y = node.input(0), node.outputs[0]
    xs, ys = static_shape(x), static_shape(y)
    pads, mode = node.attrs["pads"], node.attrs["mode"]
    if len(xs) > MAX_RANK or min(pads, default=0) < 0:
        raise lw.unsupported(node, f"rank {len(xs)} > {MAX_RANK}" if len(xs) > MAX_RANK else "negative pads (a crop)")
    maps = [np.pad(np.arange(n), (pads[d], pads[d + len(xs)]), mode=mode, **({"constant_values": -1}
            if mode == "constant" else {})) for d, n in enumerate(xs)]
    strides = [int(np.prod(xs[d + 1:])) for d in range(len(xs))]
    zeros = [0] * (MAX_RANK - len(xs))
    params = lw.struct("qcc_perm_t", f"qcc_p_{node.name}", [len(xs), [*ys, *zeros], [*strides, *zeros]])
    index = index_array(lw, np.concatenate(maps), f"qcc_i_{node.name}", f"source indices of {node.name} by axis")
    ct = lw.ctype(y)
    fill = str(int(ai.pad_fill(node))) if ct.affine is not None else float_literal(node.attrs["value"])
    fn = KM.pad(lw.kernels, lw.ctype(x), ct)
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, index, fill, *lw.mode.copy_args(lw, node, x, y)))])


def slice_(lw: Lowering, node: Node) -> Step:
    x = node.input(0)
    slices = [slice(None)] * x.type.rank
    steps = node.attrs["steps"] or [1] * len(node.attrs["axes"])
    for first, last, axis, step in zip(node.attrs["starts"], node.attrs["ends"], node.attrs["axes"], steps):
        slices[axis % x.type.rank] = slice(first, last, step)
    return Step(node, [_strided_copy(lw, node, 0, slices)])


def split(lw: Lowering, node: Node) -> Step:
    x = node.input(0)
    axis = node.attrs["axis"] % x.type.rank
    calls, offset = [], 0
    for i, size in enumerate(node.attrs["split"]):
        slices = [slice(None)] * x.type.rank
        slices[axis] = slice(offset, offset + size)
        calls.append(_strided_copy(lw, node, i, slices))
        offset += size
    return Step(node, calls)
