"""IR -> kernel calls for target c: numeric mode, support checks, parameters as C arrays.

Everything a model needs is checked here, before any file is written: an op, an annotation or
an operand kind the C target cannot compute raises UnsupportedError naming the node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np
from qcc.backends.c.ctype import FLOAT, CType, comment_text, hexfloat, pow2
from qcc.backends.c.kernels import conv as KC
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import helpers as KH
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.kernels import normalization as KN
from qcc.backends.c.kernels import pool as KP

from qcc.errors import UnsupportedError
from qcc.ir.core import Model, Node, Value
from qcc.ir.ops._common import attr_list
from qcc.ir.types import Affine, FixedPoint
from qcc.sim import affine_int as ai
from qcc.sim import fixed as fx

VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Quantize")
INPLACE_UNARY = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Silu", "Elu",
                 "Exp", "Abs", "Neg", "Reciprocal", "BatchNorm", "Softmax")
FIXED_GENERIC_UNARY = ("LeakyRelu", "Clip", "Sigmoid", "Tanh")
MAX_RANK = 6


@attrs.frozen
class Ptr:
    """A tensor's data pointer, resolved once the arena plan is known."""

    value: Value


Arg = str | Ptr


@attrs.frozen
class Call:
    fn: str
    args: tuple[Arg, ...]


@attrs.define
class Step:
    node: Node
    calls: list[Call] = attrs.field(factory=list)
    alias: bool = False
    inplace: tuple[int, ...] = ()
    """Inputs whose storage the output may take over when they die here (kernel reads before writes)."""


@attrs.frozen
class ConstArray:
    name: str
    ctype: CType
    data: np.ndarray
    comment: str


def static_shape(value: Value) -> tuple[int, ...]:
    """Symbolic dims (the batch) are bound to 1: the generated code runs one sample per call."""
    return tuple(d if isinstance(d, int) else 1 for d in value.type.shape)


def numel(value: Value) -> int:
    return int(np.prod(static_shape(value), dtype=np.int64))


def c_identifier(text: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)
    return out if out and not out[0].isdigit() else f"_{out}"


def numeric_mode(model: Model) -> str:
    """'float' (no activation annotated), 'fixed' (every activation FixedPoint, 8 or 16 bits) or
    'affine' (every activation per-tensor affine int8/uint8: qcc.sim.affine_int's arithmetic)."""
    graph = model.graph
    acts = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    if any(isinstance(v.quant, Affine) for v in acts):
        for value in acts:
            if not isinstance(value.quant, Affine):
                raise UnsupportedError(
                    f"target c: tensor {value.name!r}{_where(value)} is {value.quant or 'float'} while other "
                    "activations are affine; target c needs every activation affine int8/uint8 (or none)")
            try:
                ai.act(value)
            except UnsupportedError as exc:
                raise UnsupportedError(f"target c: {exc}{_where(value)}") from None
        return "affine"
    fixed = [v for v in acts if isinstance(v.quant, FixedPoint)]
    if not fixed:
        for value in acts:
            if value.type.dtype != "float32":
                raise UnsupportedError(f"target c: tensor {value.name!r} has dtype {value.type.dtype}; "
                                       "only float32 tensors are supported")
        return "float"
    for value in acts:
        quant = value.quant
        if not isinstance(quant, FixedPoint):
            raise UnsupportedError(
                f"target c: tensor {value.name!r}{_where(value)} is {quant or 'float'} while other activations are "
                "fixed point; target c needs every activation fixed point (or none)")
        if quant.bits not in (8, 16):
            raise UnsupportedError(f"target c: tensor {value.name!r} is {quant}; only 8- and 16-bit fixed "
                                   "point is supported")
    return "fixed"


def _where(value: Value) -> str:
    node = value.producer()
    return f" (output of node {node.name!r}, {node.op})" if node is not None else ""


class Lowering:
    """Walks the graph once; collects kernels, constant arrays, parameter structs and steps."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.mode = numeric_mode(model)
        self.kernels = KH.KernelSet()
        self.consts: dict[int, ConstArray] = {}
        self.defs: list[str] = []
        self._names: set[str] = set()
        self.steps = [self._lower(node) for node in model.graph.nodes]

    # ------------------------------------------------------------ helpers
    def ctype(self, value: Value) -> CType:
        if self.mode == "affine":
            return CType(affine=ai.affine_of(value))
        return FLOAT if self.mode == "float" else CType(fx.fixed_of(value))

    def unique(self, base: str) -> str:
        name = c_identifier(base)
        candidate, k = name, 1
        while candidate in self._names:
            candidate, k = f"{name}_{k}", k + 1
        self._names.add(candidate)
        return candidate

    def array(self, data: np.ndarray, ctype: CType, base: str, comment: str) -> str:
        arr = ConstArray(self.unique(base), ctype, np.ascontiguousarray(data).reshape(-1), comment)
        self.defs.append(_format_array(arr))
        return arr.name

    def const(self, value: Value, node: Node) -> str:
        """The C array of a constant operand (float32, or the integers the simulator stores)."""
        if value.const is None:
            raise UnsupportedError(f"target c: node {node.name!r} ({node.op}) needs input {value.name!r} "
                                   "to be a constant")
        if id(value) not in self.consts and self.mode == "affine":
            quant = ai.affine_of(value)
            if quant is None or quant.axis is not None or quant.dtype not in ai.ACT_DTYPES:
                raise self.unsupported(node, f"parameter {value.name!r} is {quant or 'float'}, not per-tensor "
                                             "int8/uint8")
            self.consts[id(value)] = ConstArray(self.unique(f"qcc_c_{value.name}"), CType(affine=quant),
                                                ai.store_param(value).reshape(-1), f"{value.name}: {quant}")
            self.defs.append(_format_array(self.consts[id(value)]))
        if id(value) not in self.consts:
            fixed = fx.fixed_of(value)
            stored = fx.quantize_param(value)
            if self.mode == "fixed" and fixed is None:
                raise UnsupportedError(f"target c: node {node.name!r} ({node.op}): parameter {value.name!r} is "
                                       "not fixed point")
            if self.mode == "float" and fixed is not None:
                stored = fx.dequantize_stored(value, stored)
            ctype = CType(fixed) if self.mode == "fixed" else FLOAT
            arr = ConstArray(self.unique(f"qcc_c_{value.name}"), ctype, np.asarray(stored).reshape(-1),
                             f"{value.name}: {value.type} {value.quant or ''}".rstrip())
            self.consts[id(value)] = arr
            self.defs.append(_format_array(arr))
        return self.consts[id(value)].name

    def operand(self, value: Value, node: Node) -> Arg:
        return self.const(value, node) if value.const is not None else Ptr(value)

    def struct(self, ctype: str, base: str, fields: Sequence[int | Sequence[int]]) -> str:
        """A static const parameter struct; a list field is an array member."""
        name = self.unique(base)
        text = ", ".join(str(int(f)) if isinstance(f, (int, np.integer)) else "{" + ", ".join(map(str, f)) + "}"
                         for f in fields)
        self.defs.append(f"static const {ctype} {name} = {{{text}}};\n")
        return f"&{name}"

    def unsupported(self, node: Node, why: str = "") -> UnsupportedError:
        extra = f": {why}" if why else ""
        return UnsupportedError(f"target c: op {node.op} (node {node.name!r}) is not supported in {self.mode} "
                                f"mode{extra}")

    def require_dedicated(self, node: Node) -> None:
        problem = fx.dedicated_problem(node)
        if problem is not None:
            raise self.unsupported(node, problem)

    def scales(self, x: Value, y: Value) -> list[str]:
        """The arguments of `ctype.scale_params`: 2**-fx and 2**fy, or the affine (scale, zero point)s."""
        if self.mode == "affine":
            (sx, zx, _), (sy, zy, _) = ai.act(x), ai.act(y)
            return [hexfloat(sx), str(zx), hexfloat(sy), str(zy)]
        cx, cy = self.ctype(x), self.ctype(y)
        out = []
        if cx.is_int:
            out.append(pow2(-cx.fixed.frac))  # type: ignore[union-attr]
        if cy.is_int:
            out.append(pow2(cy.fixed.frac))  # type: ignore[union-attr]
        return out

    def frac(self, value: Value) -> int:
        fixed = fx.fixed_of(value)
        assert fixed is not None
        return fixed.frac

    def shift(self, node: Node, n: int) -> str:
        """A rescale by 2**-n as a kernel argument (the simulator's range)."""
        if abs(n) > fx.MAX_SHIFT:
            raise self.unsupported(node, f"fixed-point rescale by 2**{-n} is out of range")
        return str(n)

    # ------------------------------------------------------------ dispatch
    def _lower(self, node: Node) -> Step:
        if self.mode == "affine":
            from qcc.backends.c.affine_lower import lowering_for

            fn = lowering_for(node.op)
        else:
            fn = LOWERINGS.get(node.op)
        if fn is None:
            raise self.unsupported(node)
        try:
            return fn(self, node)
        except UnsupportedError as exc:
            text = str(exc)
            raise UnsupportedError(text if text.startswith("target c") else f"target c: {text}") from None


# ---------------------------------------------------------------- per-op lowerings


def conv_params(lw: Lowering, node: Node) -> str:
    """The qcc_conv_t of a Conv; a pointwise one is one long row (longer inner loops)."""
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    xs, ys = static_shape(x), static_shape(y)
    s, p, d = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
    o, _, kh, kw = static_shape(w)
    geom = [xs[0], xs[1], xs[2], xs[3], o, ys[2], ys[3], kh, kw, s[0], s[1], p[0], p[1], d[0], d[1],
            node.attrs["group"]]
    if (kh, kw, *s, *p) == (1, 1, 1, 1, 0, 0, 0, 0):
        geom[2:4], geom[5:7] = [1, xs[2] * xs[3]], [1, ys[2] * ys[3]]
    return lw.struct("qcc_conv_t", f"qcc_p_{node.name}", geom)


def _conv(lw: Lowering, node: Node) -> Step:
    x, w, y = node.inputs[0], node.input(1), node.outputs[0]
    assert x is not None
    b = node.inputs[2] if len(node.inputs) > 2 else None
    kh, kw = static_shape(w)[2:]
    params = conv_params(lw, node)
    if lw.mode == "float":
        fn = KC.conv_f32(lw.kernels)
        bias = lw.const(b, node) if b is not None else "NULL"
        return Step(node, [Call(fn, (Ptr(x), lw.const(w, node), bias, Ptr(y), params))])
    lw.require_dedicated(node)
    cx, cw, cy = lw.ctype(x), lw.ctype(w), lw.ctype(y)
    fn = KC.conv_fixed(lw.kernels, cx, cw, cy, pointwise=kh * kw == 1)
    bias = _bias(lw, node, b, cy)
    shift = lw.frac(x) + lw.frac(w) - lw.frac(y)
    return Step(node, [Call(fn, (Ptr(x), lw.const(w, node), bias, Ptr(y), params, lw.shift(node, shift)))])


def _bias(lw: Lowering, node: Node, b: Value | None, cy: CType) -> str:
    if b is None:
        return "NULL"
    if b.const is None:
        raise lw.unsupported(node, f"bias {b.name!r} is not a constant")
    data = fx.bias_ints(node, fx.quantize_param(b))
    return lw.array(data, cy, f"qcc_b_{node.name}", f"bias of {node.name} at the output's position")


def _dense(lw: Lowering, node: Node) -> Step:
    x, w, y = node.inputs[0], node.input(1), node.outputs[0]
    assert x is not None
    b = node.inputs[2] if len(node.inputs) > 2 else None
    n, k = static_shape(x)
    m = static_shape(y)[1]
    dims = (str(n), str(k), str(m))
    if lw.mode == "float":
        fn = KC.dense_f32(lw.kernels)
        bias = lw.const(b, node) if b is not None else "NULL"
        return Step(node, [Call(fn, (Ptr(x), lw.const(w, node), bias, Ptr(y), *dims))])
    lw.require_dedicated(node)
    if w.const is None:
        raise lw.unsupported(node, "weights must be constant")
    cx, cw, cy = lw.ctype(x), lw.ctype(w), lw.ctype(y)
    wt = lw.array(fx.quantize_param(w).T, cw, f"qcc_wt_{node.name}", f"{w.name} transposed (out, in)")
    shift = lw.frac(x) + lw.frac(w) - lw.frac(y)
    fn = KC.dense_fixed(lw.kernels, cx, cw, cy)
    return Step(node, [Call(fn, (Ptr(x), wt, _bias(lw, node, b, cy), Ptr(y), *dims, lw.shift(node, shift)))])


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


def _pool(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    params, _ = pool_params(lw, node)
    average = node.op in ("AvgPool", "GlobalAvgPool")
    if lw.mode == "float":
        fn = KP.avgpool(lw.kernels, FLOAT) if average else KP.maxpool(lw.kernels, FLOAT, FLOAT)
        return Step(node, [Call(fn, (Ptr(x), Ptr(y), params))])
    lw.require_dedicated(node)
    cx = lw.ctype(x)
    fn = KP.avgpool(lw.kernels, cx) if average else KP.maxpool(lw.kernels, cx, lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, lw.shift(node, lw.frac(x) - lw.frac(y))))])


def _unary(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    cx, cy = lw.ctype(x), lw.ctype(y)
    if lw.mode == "fixed":
        if node.op == "Relu" and fx.dedicated_problem(node) is None:
            fn = KE.relu_fixed(lw.kernels, cx)
            step = Step(node, [Call(fn, (Ptr(x), Ptr(y), str(numel(y)), lw.shift(node, lw.frac(x) - lw.frac(y))))])
            step.inplace = (0,)
            return step
        if node.op not in (*FIXED_GENERIC_UNARY, "Relu"):
            raise lw.unsupported(node, "no bit-exact fixed-point kernel")
    extra = []
    for key in KE.UNARY[node.op][1]:
        if node.op == "Clip":
            bound = node.attrs["min" if key == "lo" else "max"]
            if bound is None:
                lw.kernels.uses_math = True
            extra.append(("-HUGE_VALF" if key == "lo" else "HUGE_VALF") if bound is None else _flt(bound))
        else:
            extra.append(_flt(node.attrs[key]))
    fn = KE.unary(lw.kernels, node.op, cx, cy)
    step = Step(node, [Call(fn, (Ptr(x), Ptr(y), str(numel(y)), *lw.scales(x, y), *extra))])
    step.inplace = (0,) if cx.size == cy.size else ()
    return step


def _flt(value: float) -> str:
    text = repr(float(np.float32(value)))
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return f"{text}f"


def lower_softmax(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    axis = node.attrs["axis"] % len(shape)
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    fn = KN.softmax(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (Ptr(x), Ptr(y), str(outer), str(shape[axis]), str(inner), *lw.scales(x, y)))])
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


def lower_batchnorm(lw: Lowering, node: Node) -> Step:
    """Float32 between the getter and the setter (every mode; parameters computed by qcc)."""
    x, y = node.input(0), node.outputs[0]
    params = [node.input(i) for i in range(1, 5)]
    for value in params:
        if value.const is None:
            raise lw.unsupported(node, f"parameter {value.name!r} is not a constant")
    stored = [np.zeros(0)] + [fx.quantize_param(v) for v in params]
    arrays = fx.batchnorm_params(node, stored)
    names = [lw.array(a.astype(np.float32), FLOAT, f"qcc_bn_{node.name}_{what}", f"{node.name} {what}")
             for a, what in zip(arrays, ("mean", "gamma", "beta", "std"))]
    shape = static_shape(x)
    inner = int(np.prod(shape[2:]))
    fn = KN.batchnorm(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (Ptr(x), Ptr(y), *names, str(shape[0]), str(shape[1]), str(inner),
                                 *lw.scales(x, y)))])
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


def _binary(lw: Lowering, node: Node) -> Step:
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    out = static_shape(y)
    bcast = _bcast(lw, node, static_shape(a), static_shape(b), out)
    args: list[Arg] = [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(numel(y)), bcast]
    if lw.mode == "float":
        fn = KE.binary(lw.kernels, node.op, FLOAT)
    else:
        if node.op not in ("Add", "Sub", "Mul"):
            raise lw.unsupported(node, "no bit-exact fixed-point kernel")
        lw.require_dedicated(node)
        fa, fb, fy = lw.frac(a), lw.frac(b), lw.frac(y)
        if node.op == "Mul":
            args += ["0", "0", lw.shift(node, fa + fb - fy)]
        else:
            common = min(fa, fb)
            args += [lw.shift(node, fa - common), lw.shift(node, fb - common), lw.shift(node, common - fy)]
        fn = KE.binary(lw.kernels, node.op, lw.ctype(y))
    step = Step(node, [Call(fn, tuple(args))])
    step.inplace = tuple(i for i, v in enumerate((a, b))
                         if v.const is None and static_shape(v) == out and lw.ctype(v).size == lw.ctype(y).size)
    return step


def _bcast(lw: Lowering, node: Node, sa: tuple[int, ...], sb: tuple[int, ...], out: tuple[int, ...]) -> str:
    if sa == out and sb == out:
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

    pad = [0] * (MAX_RANK - rank)
    fields: list[int | list[int]] = [rank, [*out, *pad], [*strides(sa), *pad], [*strides(sb), *pad]]
    return lw.struct("qcc_bcast_t", f"qcc_p_{node.name}", fields)


def _concat(lw: Lowering, node: Node) -> Step:
    y = node.outputs[0]
    shape = static_shape(y)
    axis = node.attrs["axis"] % len(shape)
    outer = int(np.prod(shape[:axis]))
    total = int(np.prod(shape[axis:]))
    calls, offset = [], 0
    cy = lw.ctype(y)
    for value in node.inputs:
        assert value is not None
        inner = int(np.prod(static_shape(value)[axis:]))
        cx = lw.ctype(value)
        fn = KM.concat_part(lw.kernels, cx, cy)
        args: list[Arg] = [lw.operand(value, node), Ptr(y), str(outer), str(inner), str(total), str(offset)]
        if cx.is_int:
            args.append(lw.shift(node, cx.fixed.frac - lw.frac(y)))  # type: ignore[union-attr]
        calls.append(Call(fn, tuple(args)))
        offset += inner
    return Step(node, calls)


def _view(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    if lw.mode == "float" or x.quant == y.quant:
        return Step(node, alias=True)
    lw.require_dedicated(node)
    fn = KM.requant(lw.kernels, lw.ctype(x), lw.ctype(y))
    step = Step(node, [Call(fn, (lw.operand(x, node), Ptr(y), str(numel(y)), lw.shift(node, lw.frac(x) - lw.frac(y))))])
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


def perm_params(lw: Lowering, node: Node) -> str:
    """The qcc_perm_t of a Transpose: output shape and the input stride each output axis walks."""
    x, y = node.input(0), node.outputs[0]
    perm = node.attrs["perm"]
    xs = static_shape(x)
    if len(xs) > MAX_RANK:
        raise lw.unsupported(node, f"rank {len(xs)} > {MAX_RANK}")
    in_strides = [int(np.prod(xs[i + 1:])) for i in range(len(xs))]
    pad = [0] * (MAX_RANK - len(xs))
    fields: list[int | list[int]] = [len(xs), [*static_shape(y), *pad], [*(in_strides[p] for p in perm), *pad]]
    return lw.struct("qcc_perm_t", f"qcc_p_{node.name}", fields)


def _transpose(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    args: list[Arg] = [lw.operand(x, node), Ptr(y), perm_params(lw, node)]
    if lw.mode == "fixed":
        lw.require_dedicated(node)
        args.append(lw.shift(node, lw.frac(x) - lw.frac(y)))
    return Step(node, [Call(KM.transpose(lw.kernels, lw.ctype(x), lw.ctype(y)), tuple(args))])


def _lrn(lw: Lowering, node: Node) -> Step:
    if lw.mode == "fixed":
        raise lw.unsupported(node, "no bit-exact fixed-point kernel")
    x, y = node.input(0), node.outputs[0]
    shape = static_shape(x)
    a = node.attrs
    args = (Ptr(x), Ptr(y), str(shape[0]), str(shape[1]), str(int(np.prod(shape[2:]))), str(a["size"]),
            _flt(a["alpha"]), _flt(a["beta"]), _flt(a["bias"]))
    return Step(node, [Call(KN.lrn_f32(lw.kernels), args)])


def _float_only(fn: Callable[[Lowering, Node], Step]) -> Callable[[Lowering, Node], Step]:
    def lower(lw: Lowering, node: Node) -> Step:
        if lw.mode == "fixed":
            raise lw.unsupported(node, "no bit-exact fixed-point kernel")
        return fn(lw, node)

    return lower


LOWERINGS: dict[str, Callable[[Lowering, Node], Step]] = {
    "Conv": _conv, "Dense": _dense, "MaxPool": _pool, "AvgPool": _pool, "GlobalAvgPool": _pool,
    "GlobalMaxPool": _pool, "Softmax": lower_softmax, "BatchNorm": lower_batchnorm, "Concat": _concat,
    "Transpose": _transpose, "LRN": _lrn,
    **{op: _unary for op in KE.UNARY},
    **{op: _binary for op in KE.BINARY_F32},
    **{op: _view for op in VIEW_OPS},
}


def _format_array(arr: ConstArray) -> str:
    data = arr.data
    if arr.ctype.is_int:
        body = ",".join(map(str, data.astype(np.int64).tolist()))
    else:
        values = data.astype(np.float32)
        if not np.isfinite(values).all():
            raise UnsupportedError(f"target c: constant {arr.comment.split(':')[0]!r} contains NaN or Inf")
        texts = [f"{v:.9g}" for v in values.tolist()]
        body = ",".join([t + "f" if "." in t or "e" in t else t + ".f" for t in texts])
    lines = _wrap(body)
    return f"/* {comment_text(arr.comment)} */\nstatic const {arr.ctype.name} {arr.name}[{max(len(data), 1)}] = {{\n{lines}\n}};\n"


def _wrap(body: str, width: int = 100) -> str:
    out, start = [], 0
    while start < len(body):
        end = start + width
        if end < len(body):
            cut = body.rfind(",", start, end)
            end = cut + 1 if cut > start else body.find(",", end) + 1 or len(body)
        out.append(body[start:end])
        start = end
    return "\n".join(out) if out else "0"
