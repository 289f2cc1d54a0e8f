"""Which nnabla function computes which IR op: the one table every nnabla reader and writer uses.

The .nnp frontend, the .nnp writer, the .nnb lowering and its emulation (`lift`), and the
passes that accept nnabla's names for ops (`insert-quantize{after=ReLU}`) all look names up
here, so a function is named the same way everywhere and an op added here (`DIRECT`) is read
and written by all of them at once (the .nnb lowering only when nnabla-c-runtime implements
the function).

- `PAIRS`: functions that compute one IR op; the reader/writer translates the arguments.
- `DIRECT`: functions that are an attribute-free IR op under fixed arguments: generic readers
  and writers handle them, with no code of their own per function.
- `SCALARS`: the one-input scalar functions (`x + val`, `val - x`) and the binary op they are.

Both directions are one-to-one (`ir_op`, `nnabla_function`). Functions that become several IR
nodes (Split, Stack, BinaryWeightConvolution...) or several functions (Clip -> ReLU6,
MaximumScalar + MinimumScalar) are the readers' and writers' own business.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

PAIRS: tuple[tuple[str, str], ...] = (
    # (nnabla function, IR op)
    ("Convolution", "Conv"), ("Deconvolution", "ConvTranspose"), ("Affine", "Dense"),
    ("BatchMatmul", "MatMul"), ("BatchNormalization", "BatchNorm"),
    ("MaxPooling", "MaxPool"), ("AveragePooling", "AvgPool"), ("SumPooling", "SumPool"),
    ("LeakyReLU", "LeakyRelu"), ("ELU", "Elu"), ("GELU", "Gelu"), ("HardSigmoid", "HardSigmoid"),
    ("Add2", "Add"), ("Sub2", "Sub"), ("Mul2", "Mul"), ("Div2", "Div"), ("Pow2", "Pow"),
    ("Maximum2", "Max"), ("Minimum2", "Min"),
    ("Softmax", "Softmax"), ("Dropout", "Dropout"), ("Concatenate", "Concat"), ("Reshape", "Reshape"),
    ("Transpose", "Transpose"), ("Pad", "Pad"), ("Slice", "Slice"),
    ("Mean", "ReduceMean"), ("Sum", "ReduceSum"), ("Max", "ReduceMax"),
    ("PReLU", "PRelu"), ("LayerNormalization", "LayerNorm"), ("InstanceNormalization", "InstanceNorm"),
    ("GroupNormalization", "GroupNorm"), ("Interpolate", "Resize"), ("Norm", "ReduceL2"),
)
"""Functions that compute one IR op, arguments translated by each reader and writer."""


@attrs.frozen
class Direct:
    """A function that is an attribute-free IR op when its arguments are `args`.

    Writers write `args`; readers refuse a function whose arguments differ (except
    EXECUTION_ARGS), naming the argument.
    """

    function: str
    op: str
    args: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda d: MappingProxyType(dict(d)))


EXECUTION_ARGS = frozenset({"inplace"})
"""Arguments that change how a runtime schedules a function, not what it computes."""

DIRECT: tuple[Direct, ...] = (
    Direct("ReLU", "Relu", {"inplace": False}),
    Direct("Sigmoid", "Sigmoid"),
    Direct("Tanh", "Tanh"),
    Direct("Swish", "Silu"),
    Direct("Abs", "Abs"),
    Direct("Exp", "Exp"),
    Direct("Log", "Log"),
    Direct("Erf", "Erf"),
    Direct("Identity", "Identity"),
    Direct("GlobalAveragePooling", "GlobalAvgPool"),
    Direct("SoftPlus", "Softplus", {"beta": 1.0}),
    Direct("Mish", "Mish"),
)
"""Functions generic readers and writers map on their own (one line adds an op to all of them)."""

SCALARS: Mapping[str, tuple[str, bool]] = MappingProxyType({
    "AddScalar": ("Add", False), "MulScalar": ("Mul", False), "PowScalar": ("Pow", False),
    "RSubScalar": ("Sub", True), "RDivScalar": ("Div", True), "RPowScalar": ("Pow", True),
    "MaximumScalar": ("Max", False), "MinimumScalar": ("Min", False),
})
"""Scalar function -> (IR binary op, whether `val` is the left operand): `x op val` / `val op x`."""

_COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min"})

DIRECT_BY_OP: Mapping[str, Direct] = MappingProxyType({d.op: d for d in DIRECT})
DIRECT_BY_FUNCTION: Mapping[str, Direct] = MappingProxyType({d.function: d for d in DIRECT})
FUNCTION_OPS: Mapping[str, str] = MappingProxyType({**dict(PAIRS), **{d.function: d.op for d in DIRECT}})
"""nnabla function -> the IR op it computes (PAIRS and DIRECT)."""
OP_FUNCTIONS: Mapping[str, str] = MappingProxyType({op: fn for fn, op in FUNCTION_OPS.items()})
"""IR op -> the nnabla function that computes it."""


def _check_one_to_one() -> None:
    functions = [fn for fn, _ in PAIRS] + [d.function for d in DIRECT]
    ops = [op for _, op in PAIRS] + [d.op for d in DIRECT]
    for what, names in (("function", functions), ("op", ops)):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"nnabla function table: {what}(s) listed twice: {twice}")


_check_one_to_one()


def ir_op(function: str) -> str | None:
    """The IR op an nnabla function computes (None: no one-to-one counterpart)."""
    return FUNCTION_OPS.get(function)


def nnabla_function(op: str) -> str:
    """The nnabla function computing IR op `op` (KeyError for an op without one)."""
    return OP_FUNCTIONS[op]


def direct_mismatch(direct: Direct, args: Mapping[str, Any]) -> str | None:
    """Why a function with `args` is not its direct IR op (None: it is)."""
    for name, wanted in direct.args.items():
        if name in EXECUTION_ARGS or name not in args:
            continue
        given = args[name]
        if (float(given) != wanted) if isinstance(wanted, float) else given != wanted:
            return f"{name} = {given!r}; qcc's {direct.op} is {direct.function} with {name} = {wanted!r}"
    return None


def scalar_function(op: str, scalar_left: bool) -> tuple[str, bool] | None:
    """The scalar function computing `x op c` (or `c op x` when scalar_left) and whether its `val`
    is -c; None when no scalar function computes it exactly (x / c is not x * (1/c))."""
    for function, (target, left) in SCALARS.items():
        if target == op and (left == scalar_left or (op in _COMMUTATIVE and not left)):
            return function, False
    if op == "Sub" and not scalar_left:
        return "AddScalar", True
    return None


INTERPOLATE_COORDINATES: Mapping[tuple[str, bool, bool, bool], str] = MappingProxyType({
    ("linear", False, False, False): "asymmetric", ("linear", True, False, False): "align_corners",
    ("linear", False, True, False): "half_pixel", ("nearest", False, False, False): "asymmetric",
    ("nearest", True, False, False): "align_corners", ("nearest", False, True, False): "half_pixel",
    ("nearest", False, False, True): "tf_half_pixel_for_nn",
})
"""nnabla Interpolate (mode, align_corners, half_pixel, half_pixel_for_nn) -> the ONNX coordinate
transformation it computes (scales = output / input sizes; nearest indices are floored)."""


def interpolate_coordinates(mode: str, align_corners: bool, half_pixel: bool, half_pixel_for_nn: bool) -> str | None:
    """The ONNX coordinate mode of an Interpolate (half_pixel_for_nn wins for nearest); None: undefined."""
    if mode == "nearest" and half_pixel_for_nn:
        return "tf_half_pixel_for_nn"
    return INTERPOLATE_COORDINATES.get((mode, bool(align_corners), bool(half_pixel), False))
