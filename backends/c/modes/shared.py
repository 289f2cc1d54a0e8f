"""Lowerings more than one numeric mode uses: the mode object supplies element types, the
getter/setter scales and the arguments of an element conversion, so the op's code is written once."""

from __future__ import annotations

import numpy as np
from qcc.backends.c.ctype import FLOAT
from qcc.backends.c.kernels import elementwise as KE
from qcc.backends.c.kernels import movement as KM
from qcc.backends.c.kernels import normalization as KN
from qcc.backends.c.lower import Arg, Call, Lowering, Ptr, Step, numel, static_shape
from qcc.backends.c.params import float_literal, perm_params

from qcc.ir.core import Node
from qcc.sim import fixed as fx


def unary_params(lw: Lowering, node: Node) -> list[Arg]:
    """The float parameters of a one-input activation (kernels.elementwise.UNARY), as C literals."""
    extra: list[Arg] = []
    for key in KE.UNARY[node.op][1]:
        if node.op == "Clip":
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
