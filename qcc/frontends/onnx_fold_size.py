"""How big a folded ONNX constant will be, computed from its inputs' shapes before it exists.

The ONNX importer folds every node whose inputs are all constants. A small file can ask for a
huge result: a broadcast Add of a (65536, 1) and a (1, 65536) constant is 2^32 elements, a
Gather with a large index tensor, a Pad or a ConvTranspose with huge pads or strides, a Tile or
an Expand. The importer reserves the bytes this module predicts (against `max_tensor_elements`,
`max_parameter_bytes` and the model's running total) before it lets numpy or onnx's reference
evaluator allocate anything. Predictions are exact or upper bounds; an op without a rule is
bounded by the sum of its inputs' sizes (true of every op the importer folds without a rule
here: reshapes, slices, transposes, splits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Shape = tuple[int, ...]
SizeRule = Callable[[list[Any], dict[str, Any]], float]

ELEMENTWISE = ("Abs", "BatchNormalization", "Cast", "Ceil", "Clip", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu",
               "HardSigmoid", "HardSwish", "Identity", "LRN", "LeakyRelu", "Log", "Neg", "Reciprocal", "Relu",
               "Sigmoid", "Softmax", "Sqrt", "Tanh")
BROADCAST = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Equal", "Where")


def _shape(array: Any) -> Shape:
    return tuple(int(d) for d in np.shape(array))


def _count(shape: Sequence[float]) -> float:
    """Element count as a float: a hostile shape must not overflow int64 on the way to the check."""
    return float(math.prod(float(d) for d in shape))


def _ints(array: Any) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _first(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _count(_shape(ins[0]))


def _broadcast(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _count(np.broadcast_shapes(*(_shape(a) for a in ins if a is not None)))


def _matmul(ins: list[Any], attrs: dict[str, Any]) -> float:
    a, b = _shape(ins[0]), _shape(ins[1])
    if len(a) < 2 or len(b) < 2:
        return _count(a) + _count(b)  # a vector operand: never more than its partner
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return _count((*batch, a[-2], b[-1]))


def _gemm(ins: list[Any], attrs: dict[str, Any]) -> float:
    a, b = _shape(ins[0]), _shape(ins[1])
    rows = a[1] if attrs.get("transA", 0) else a[0]
    cols = b[0] if attrs.get("transB", 0) else b[1]
    return _count((rows, cols))


def _gather(ins: list[Any], attrs: dict[str, Any]) -> float:
    data, indices = _shape(ins[0]), _shape(ins[1])
    axis = int(attrs.get("axis", 0)) % max(len(data), 1)
    return _count((*data[:axis], *indices, *data[axis + 1:]))


def _pad(ins: list[Any], attrs: dict[str, Any]) -> float:
    shape = _shape(ins[0])
    rank = len(shape)
    pads = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(attrs.get("pads", []))
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(rank))
    grown = [float(d) for d in shape]
    for i, axis in enumerate(axes):
        if i + len(axes) < len(pads):
            grown[axis % rank] += pads[i] + pads[i + len(axes)]
    return _count([max(d, 0.0) for d in grown])


def _concat(ins: list[Any], attrs: dict[str, Any]) -> float:
    return sum(_count(_shape(a)) for a in ins if a is not None)


def _window(ins: list[Any], attrs: dict[str, Any], channels: float, transposed: bool = False) -> float:
    """Conv, pools, ConvTranspose: batch x channels x every spatial size grown by pads/strides."""
    x = _shape(ins[0])
    spatial = len(x) - 2
    pads = list(attrs.get("pads", [])) or [0] * (2 * spatial)
    strides = list(attrs.get("strides", [])) or [1] * spatial
    kernel = list(attrs.get("kernel_shape", [])) or (list(_shape(ins[1])[2:]) if len(ins) > 1 else [1] * spatial)
    out = []
    for i in range(spatial):
        if transposed:
            extra = list(attrs.get("output_padding", [])) or [0] * spatial
            out.append(float(x[2 + i] - 1) * max(strides[i], 1) + kernel[i] + extra[i])
        else:
            out.append(float(x[2 + i]) + pads[i] + pads[i + spatial])
    return _count((x[0], channels, *(max(d, 1.0) for d in out)))


def _conv(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _window(ins, attrs, _shape(ins[1])[0])


def _conv_transpose(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _window(ins, attrs, _shape(ins[1])[1] * int(attrs.get("group", 1)), transposed=True)


def _pool(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _window(ins, attrs, _shape(ins[0])[1])


def _reduce(ins: list[Any], attrs: dict[str, Any]) -> float:
    shape = _shape(ins[0])
    axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(attrs.get("axes", []))
    if not axes:
        axes = [] if attrs.get("noop_with_empty_axes", 0) else list(range(len(shape)))
    reduced = {a % max(len(shape), 1) for a in axes}
    return _count([1 if i in reduced else d for i, d in enumerate(shape)])


def _nonzero(ins: list[Any], attrs: dict[str, Any]) -> float:
    shape = _shape(ins[0])
    return _count(shape) * max(len(shape), 1)


def _shape_op(ins: list[Any], attrs: dict[str, Any]) -> float:
    return float(len(_shape(ins[0])))


def _expand(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _count(np.broadcast_shapes(_shape(ins[0]), tuple(_ints(ins[1]))))


def _tile(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _count(_shape(ins[0])) * _count(_ints(ins[1]))


def _range(ins: list[Any], attrs: dict[str, Any]) -> float:
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in ins[:3])
    if not delta:
        return math.inf
    return max(0.0, math.ceil((limit - start) / delta))


def _constant_of_shape(ins: list[Any], attrs: dict[str, Any]) -> float:
    return _count(_ints(ins[0]))


RULES: dict[str, SizeRule] = {
    **{op: _first for op in ELEMENTWISE}, **{op: _broadcast for op in BROADCAST},
    "MatMul": _matmul, "Gemm": _gemm, "Gather": _gather, "Pad": _pad, "Concat": _concat, "Conv": _conv,
    "ConvTranspose": _conv_transpose, "MaxPool": _pool, "AveragePool": _pool, "NonZero": _nonzero,
    **{op: _reduce for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceProd")},
    "Shape": _shape_op, "Expand": _expand, "Tile": _tile, "Range": _range, "ConstantOfShape": _constant_of_shape,
}  # fmt: skip


def _sum_of_inputs(ins: list[Any], attrs: dict[str, Any]) -> float:
    return sum(_count(_shape(a)) for a in ins if a is not None)


def folded_elements(op: str, ins: list[Any], attrs: dict[str, Any]) -> float:
    """Elements of all outputs of folding `op` on constant inputs `ins` (exact or an upper bound).

    Raises ValueError/IndexError/TypeError on inputs that cannot describe a result.
    """
    return RULES.get(op, _sum_of_inputs)(ins, attrs)


def folding_work(op: str, ins: list[Any], attrs: dict[str, Any], elements: float) -> float:
    """Elements of working memory onnx's reference evaluator needs to fold `op` (at least its result).

    Its Conv and pools copy the padded input and gather every window (im2col): a 1x1 Conv of one
    pixel padded to 8193x8193 (a 256 MiB result) took 1.3 GB. Charged as a multiple of the result:
    the copies plus one per kernel element.
    """
    if op in ("Conv", "ConvTranspose"):
        w = _shape(ins[1])
        return elements * (8 + math.prod(w[1:]))
    if op in ("MaxPool", "AveragePool"):
        return elements * (8 + math.prod(attrs.get("kernel_shape", [1])))
    return elements


def folded_itemsize(op: str, ins: list[Any], attrs: dict[str, Any], to_dtype: Any = None) -> int:
    """Bytes per element of the result: the target type of a Cast, 8 for index results, else the widest input."""
    if op == "Cast" and to_dtype is not None:
        return int(np.dtype(to_dtype).itemsize)
    if op in ("NonZero", "Shape", "Range"):
        return 8
    return max((np.asarray(a).dtype.itemsize for a in ins if a is not None), default=8)
