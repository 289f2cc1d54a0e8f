"""Fixed-point mode: every activation FixedPoint(8|16, frac); exactly the arithmetic of
`qcc.sim.fixed` (nnabla-c-runtime's), so outputs are bit-identical to `run_fixed`.

Ops with an integer kernel in the simulator (`fx.dedicated_problem` is None) get the integer C
kernel; LeakyRelu, Clip, Sigmoid, Tanh, HardSwish, PRelu, Relu of mixed widths, Softmax and
BatchNorm compute in float32 between the runtime's getter and setter; nearest Resize, DepthToSpace,
SpaceToDepth, Slice and Split move stored values; every other op the float mode lowers has no
bit-exact fixed-point kernel and is refused. fixed4's 4-bit Conv/Dense weights run on the 8-bit
kernels; stored two a byte (option weights4=packed), each layer unpacks them, a slice of output
channels at a time, into the arena's end (`Lowering.unpacked`) and runs its kernel per slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import qcc.backends.c.modes.shared as shared
from qcc.backends.c.ctype import CType, pow2
from qcc.backends.c.kernels import conv as KC
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.kernels import pool as KP
from qcc.backends.c.kernels.helpers import KernelSet
from qcc.backends.c.lower import (
    Arg,
    Call,
    LowerFn,
    Lowering,
    NumericMode,
    Ptr,
    Step,
    numel,
    static_shape,
    where,
)
from qcc.backends.c.modes.float32 import FLOAT_MODE
from qcc.backends.c.params import bcast_params, conv_params, pool_params

from qcc.errors import UnsupportedError
from qcc.ir.core import Node, Value
from qcc.ir.types import FixedPoint
from qcc.sim import fixed as fx

GENERIC_UNARY = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSwish")
"""One-input activations computed in float32 between getter and setter (the runtime's generic path)."""


def frac(value: Value) -> int:
    fixed = fx.fixed_of(value)
    assert fixed is not None
    return fixed.frac


def shift(lw: Lowering, node: Node, n: int) -> str:
    """A rescale by 2**-n as a kernel argument (the simulator's range)."""
    if abs(n) > fx.MAX_SHIFT:
        raise lw.unsupported(node, f"fixed-point rescale by 2**{-n} is out of range")
    return str(n)


def require_dedicated(lw: Lowering, node: Node) -> None:
    """The node's operands are what the simulator's integer kernel needs (or UnsupportedError)."""
    problem = fx.dedicated_problem(node)
    if problem is not None:
        raise lw.unsupported(node, problem)


def _bias(lw: Lowering, node: Node, b: Value | None, cy: CType) -> str:
    if b is None:
        return "NULL"
    if b.const is None:
        raise lw.unsupported(node, f"bias {b.name!r} is not a constant")
    data = fx.bias_ints(node, fx.quantize_param(b))
    return lw.array(data, cy, f"qcc_b_{node.name}", f"bias of {node.name} at the output's position")


def _epilogue(lw: Lowering, node: Node) -> tuple[KC.Epilogue, list[Arg]]:
    """The saturating bias add, then the dedicated Relu when it alone reads the output and keeps
    its width (computed as qcc_relu_* would)."""
    y = node.outputs[0]
    cy = lw.ctype(y)
    ep, args = KC.fixed_epilogue(cy), []
    nxt = lw.consumer(y)
    if nxt is not None and nxt.op == "Relu" and fx.dedicated_problem(nxt) is None and \
            lw.ctype(nxt.outputs[0]).bits == cy.bits:
        ep = KC.with_fixed_relu(ep, lw.ctype(nxt.outputs[0]))
        args.append(shift(lw, nxt, frac(y) - frac(nxt.outputs[0])))
        lw.fuse(nxt)
    return ep, args


def _conv(lw: Lowering, node: Node) -> Step:
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    sliced = _is4(w) and lw.pack4  # parameter structs per slice, below
    params = "" if sliced else conv_params(lw, node)
    require_dedicated(lw, node)
    if w.const is None:
        raise lw.unsupported(node, "weights must be constant")
    cx, cw, cy = lw.ctype(x), lw.ctype(w), lw.ctype(y)
    n = frac(x) + frac(w) - frac(y)
    rescale = shift(lw, node, n)
    bias = _bias(lw, node, b, cy)
    stored = fx.quantize_param(w)
    taps = int(np.prod(stored.shape[2:]))
    ep, extra = _epilogue(lw, node)
    if KC.is_depthwise(stored.shape, node.attrs["group"]):
        fn = KC.depthwise(lw.kernels, cx, cw, cy, ep, "fixed", taps, n)
    else:
        fn = KC.conv_fixed(lw.kernels, cx, cw, cy, ep, taps, n)
    if not _is4(w):
        return Step(node, [Call(fn, (Ptr(x), lw.const(w, node), bias, Ptr(y), params, rescale, *extra))])
    packed = _weights4(lw, w, stored, f"qcc_w_{node.name}", w.name)
    if not sliced:
        return Step(node, [Call(fn, (Ptr(x), packed, bias, Ptr(y), params, rescale, *extra))])
    calls = []
    xs, ys = static_shape(x), static_shape(y)
    group, (o, cg) = int(node.attrs["group"]), stored.shape[:2]
    per_group = (o // group) * cg * taps  # weights of one group's output channels
    # one sample per call: a slice of output channels (whole groups) reads and writes contiguous
    # runs of x and y; with a static batch > 1 the layer unpacks whole
    whole = xs[0] != 1 or o * cg * taps <= lw.unpack_limit
    step = o if whole else (max(1, lw.unpack_limit // (cg * taps)) if group == 1 else
                            max(1, lw.unpack_limit // per_group) * (o // group))
    for o0 in range(0, o, step):
        count = min(step, o - o0)
        groups = group if group == 1 or whole else count // (o // group)
        first_in = 0 if group == 1 else (o0 // (o // group)) * cg
        params = conv_params(lw, node, None if whole else (xs[1] if group == 1 else groups * cg, count, groups))
        target = lw.unpacked(count * cg * taps)
        calls.append(Call(_unpack4(lw.kernels), (packed, str(o0 * cg * taps), target, str(count * cg * taps))))
        calls.append(Call(fn, (Ptr(x, first_in * xs[2] * xs[3]), target, _plus(bias, o0),
                               Ptr(y, o0 * ys[2] * ys[3]), params, rescale, *extra)))
    return Step(node, calls)


def _plus(array: str, offset: int) -> str:
    return array if array == "NULL" or not offset else f"{array} + {offset}"


def _is4(w: Value) -> bool:
    fixed = fx.fixed_of(w)
    return fixed is not None and fixed.bits == 4


def _weights4(lw: Lowering, w: Value, data: np.ndarray, base: str, comment: str) -> str:
    """The C array of fixed4's weights: int8 (lw.pack4 false), else two a byte (`qcc_unpack4`
    restores int8 slices of them into the arena's tail before they are used)."""
    ctype, count = lw.ctype(w), int(data.size)
    if not lw.pack4:
        lw.weights4.append((w.type.numel(), count))
        return lw.array(data, ctype, base, f"{comment}: 4-bit weights, one a byte")
    packed = pack4(data)
    lw.weights4.append((w.type.numel(), int(packed.size)))
    return lw.array(packed, ctype, base, f"{comment}: {count} 4-bit weights, two a byte, low nibble first")


def pack4(q: np.ndarray) -> np.ndarray:
    """Values -8..7, two a byte (the first in the low nibble), as the int8 the C array holds."""
    flat = np.asarray(q, np.int64).reshape(-1)
    if flat.size % 2:
        flat = np.append(flat, 0)
    byte = (flat[0::2] & 15) | ((flat[1::2] & 15) << 4)
    return np.where(byte >= 128, byte - 256, byte)


def _unpack4(ks: KernelSet) -> str:
    return ks.kernel("qcc_unpack4", lambda: """
/* n 4-bit weights from the `start`-th on (two a byte, low nibble first), sign-extended into int8. */
static void qcc_unpack4(const int8_t *restrict p, long start, int8_t *restrict w, long n)
{
    for (long i = 0; i < n; ++i) {
        const long j = start + i;
        const unsigned b = (uint8_t)p[j >> 1];
        const unsigned nibble = (j & 1) ? b >> 4 : b & 15u;
        w[i] = (int8_t)((int)(nibble ^ 8u) - 8);
    }
}
""")


def _dense(lw: Lowering, node: Node) -> Step:
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    n, k = static_shape(x)
    dims = (str(n), str(k), str(static_shape(y)[1]))
    require_dedicated(lw, node)
    if w.const is None:
        raise lw.unsupported(node, "weights must be constant")
    cx, cw, cy = lw.ctype(x), lw.ctype(w), lw.ctype(y)
    data, base, comment = KC.pack_dense_weights(fx.quantize_param(w)), f"qcc_w_{node.name}", \
        f"{w.name} packed in blocks of {KC.OB} columns"
    weights = _weights4(lw, w, data, base, comment) if _is4(w) else lw.array(data, cw, base, comment)
    rescale = shift(lw, node, frac(x) + frac(w) - frac(y))
    bias = _bias(lw, node, b, cy)
    ep, extra = _epilogue(lw, node)
    fn = KC.dense(lw.kernels, cx, cw, cy, ep, "fixed")
    if not (_is4(w) and lw.pack4):
        return Step(node, [Call(fn, (Ptr(x), weights, bias, Ptr(y), *dims, rescale, *extra))])
    packed = weights
    # slices of whole OB-column blocks (one sample per call: y's columns are contiguous)
    m, block = int(dims[2]), k * KC.OB
    step = m if n != 1 or data.size <= lw.unpack_limit else max(1, lw.unpack_limit // block) * KC.OB
    calls = []
    for c0 in range(0, m, step):
        count = min(step, m - c0)
        size = -(-count // KC.OB) * block
        target = lw.unpacked(size)
        calls.append(Call(_unpack4(lw.kernels), (packed, str(c0 // KC.OB * block), target, str(size))))
        calls.append(Call(fn, (Ptr(x), target, _plus(bias, c0), Ptr(y, c0), dims[0], dims[1], str(count),
                               rescale, *extra)))
    return Step(node, calls)


def _pool(lw: Lowering, node: Node) -> Step:
    x, y = node.input(0), node.outputs[0]
    params, _ = pool_params(lw, node)
    require_dedicated(lw, node)
    cx = lw.ctype(x)
    average = node.op in ("AvgPool", "GlobalAvgPool")
    fn = KP.avgpool(lw.kernels, cx) if average else KP.maxpool(lw.kernels, cx, lw.ctype(y))
    return Step(node, [Call(fn, (Ptr(x), Ptr(y), params, shift(lw, node, frac(x) - frac(y))))])


def _unary(lw: Lowering, node: Node) -> Step:
    """Relu with one width is an integer kernel; the rest is the float32 generic path."""
    x, y = node.input(0), node.outputs[0]
    if node.op == "Relu" and fx.dedicated_problem(node) is None:
        fn = KE.relu_fixed(lw.kernels, lw.ctype(x))
        step = Step(node, [Call(fn, (Ptr(x), Ptr(y), str(numel(y)), shift(lw, node, frac(x) - frac(y))))])
        step.inplace = (0,)
        return step
    return shared.unary(lw, node)


def _binary(lw: Lowering, node: Node) -> Step:
    """Add/Sub align both inputs to the coarser position; Mul truncates the product (sim rules)."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    out = static_shape(y)
    bcast = bcast_params(lw, node)
    args: list[Arg] = [lw.operand(a, node), lw.operand(b, node), Ptr(y), str(numel(y)), bcast]
    require_dedicated(lw, node)
    fa, fb, fy = frac(a), frac(b), frac(y)
    if node.op == "Mul":
        args += ["0", "0", shift(lw, node, fa + fb - fy)]
    else:
        common = min(fa, fb)
        args += [shift(lw, node, fa - common), shift(lw, node, fb - common), shift(lw, node, common - fy)]
    step = Step(node, [Call(KE.binary(lw.kernels, node.op, lw.ctype(y)), tuple(args))])
    step.inplace = tuple(i for i, v in enumerate((a, b))
                         if v.const is None and static_shape(v) == out and lw.ctype(v).size == lw.ctype(y).size)
    return step


def _transpose(lw: Lowering, node: Node) -> Step:
    require_dedicated(lw, node)
    return shared.transpose(lw, node)


def _resize(lw: Lowering, node: Node) -> Step:
    """Nearest moves stored values (nnabla-c-runtime's Unpooling); linear has no fixed-point kernel."""
    if node.attrs["mode"] != "nearest":
        raise lw.unsupported(node, "linear resize has no bit-exact fixed-point kernel (nnabla-c-runtime resizes "
                                   "with Unpooling: nearest)")
    return shared.resize(lw, node)


def _prelu(lw: Lowering, node: Node) -> Step:
    """The runtime's PReLU: float32 between getter and setter, slopes as float32 (qcc.sim.fixed's
    generic kernel)."""
    x, y = node.input(0), node.outputs[0]
    slopes = shared.float_param(lw, node, 1, "slope")
    fn = KE.prelu_generic(lw.kernels, lw.ctype(x), lw.ctype(y))
    args = (Ptr(x), Ptr(y), str(numel(y)), bcast_params(lw, node, always=True), slopes, *lw.scales(x, y))
    step = Step(node, [Call(fn, args)])
    step.inplace = (0,) if lw.ctype(x).size == lw.ctype(y).size else ()
    return step


MOVES: dict[str, LowerFn] = {"Resize": _resize, "DepthToSpace": shared.block_move,
                             "SpaceToDepth": shared.block_move, "Slice": shared.slice_, "Split": shared.split}
"""Ops that move stored values (requantized like Transpose): functions nnabla-c-runtime has."""


class FixedMode(NumericMode):
    name = "fixed"
    title = "fixed point (nnabla-c-runtime arithmetic, bit-identical to qcc.sim.fixed.run_fixed)"
    integer = True
    lowerings: ClassVar[dict[str, LowerFn]] = {
        "Conv": _conv, "Dense": _dense, "MaxPool": _pool, "AvgPool": _pool, "GlobalAvgPool": _pool,
        "GlobalMaxPool": _pool, "Softmax": shared.softmax, "BatchNorm": shared.batchnorm, "Concat": shared.concat,
        "Transpose": _transpose, "Add": _binary, "Sub": _binary, "Mul": _binary,
        **{op: _unary for op in GENERIC_UNARY}, **MOVES, "PRelu": _prelu,
    }

    def claims(self, acts: Sequence[Value]) -> bool:
        return any(isinstance(v.quant, FixedPoint) for v in acts)

    def check(self, acts: Sequence[Value]) -> None:
        for value in acts:
            quant = value.quant
            if not isinstance(quant, FixedPoint):
                raise UnsupportedError(
                    f"target c: tensor {value.name!r}{where(value)} is {quant or 'float'} while other activations "
                    "are fixed point; target c needs every activation fixed point (or none)")
            if quant.bits not in (8, 16):
                raise UnsupportedError(f"target c: tensor {value.name!r} is {quant}; only 8- and 16-bit fixed "
                                       "point is supported")

    def ctype(self, value: Value) -> CType:
        return CType(fx.fixed_of(value))

    def param(self, lw: Lowering, value: Value, node: Node) -> tuple[CType, np.ndarray, str]:
        fixed = fx.fixed_of(value)
        stored = fx.quantize_param(value)
        if fixed is None:
            raise UnsupportedError(f"target c: node {node.name!r} ({node.op}): parameter {value.name!r} is "
                                   "not fixed point")
        return CType(fixed), stored, f"{value.name}: {value.type} {value.quant or ''}".rstrip()

    def scales(self, x: Value, y: Value) -> list[str]:
        """2**-fx (the getter's factor) and 2**fy (the setter's)."""
        cx, cy = self.ctype(x), self.ctype(y)
        out = []
        if cx.fixed is not None:
            out.append(pow2(-cx.fixed.frac))
        if cy.fixed is not None:
            out.append(pow2(cy.fixed.frac))
        return out

    def copy_args(self, lw: Lowering, node: Node, x: Value, y: Value) -> list[str]:
        return [shift(lw, node, frac(x) - frac(y))]

    def transfer(self, ks: KernelSet, value: Value, inbound: bool) -> tuple[str, list[str]] | None:
        ct = self.ctype(value)
        assert ct.fixed is not None
        fn = (KM.quantize_input if inbound else KM.dequantize)(ks, ct)
        return fn, [pow2(ct.fixed.frac if inbound else -ct.fixed.frac)]

    def tensor_macros(self, key: str, value: Value) -> list[str]:
        quant = value.quant
        lines = [f'#define {key}_TYPE "{quant}"']
        if isinstance(quant, FixedPoint):
            lines += [f"#define {key}_BITS {quant.bits}", f"#define {key}_FRAC {quant.frac}"]
        return lines

    def view(self, lw: Lowering, node: Node) -> Step:
        if node.input(0).quant != node.outputs[0].quant:
            require_dedicated(lw, node)
        return shared.view(lw, node)

    def refusal(self, op: str) -> str:
        return "no bit-exact fixed-point kernel" if FLOAT_MODE.lowering(op) is not None else ""

    def float_ops(self) -> frozenset[str]:
        # the runtime's generic path (Relu has a dedicated kernel), and Softmax/BatchNorm
        return frozenset({*GENERIC_UNARY, "Softmax", "BatchNorm", "PRelu"} - {"Relu"})


FIXED_MODE = FixedMode()
