"""One small model per IR op (input x, and x2 for two-input ops), to check what each target says
it supports (tests/test_op_tables.py) by compiling it.

One-input ops and broadcasting two-input ops without required attributes are built from their
schema; every other op has a builder here. An op with neither is an error naming it, so a
new op cannot slip past the support checks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qcc.ir import Graph, Model, TensorType, Value, get_schema
from qcc.ir.registry import REQUIRED

SHAPE = (1, 4, 8, 8)

Build = Callable[[Graph, Value, Callable[..., Value]], Value | list[Value]]


def _second(g: Graph) -> Value:
    return g.add_input("x2", TensorType("float32", SHAPE))


BUILDERS: dict[str, Build] = {
    "Conv": lambda g, x, c: g.add("Conv", x, c("w", 4, 4, 3, 3), c("b", 4), pads=[1, 1, 1, 1]),
    "ConvTranspose": lambda g, x, c: g.add("ConvTranspose", x, c("w", 4, 4, 3, 3), c("b", 4)),
    "Dense": lambda g, x, c: g.add("Dense", g.add("Flatten", x), c("w", 256, 10), c("b", 10)),
    "BatchNorm": lambda g, x, c: g.add("BatchNorm", x, *(c(k, 4, low=0.5) for k in ("s", "b", "m", "v"))),
    "MaxPool": lambda g, x, c: g.add("MaxPool", x, kernel=[2, 2], strides=[2, 2]),
    "AvgPool": lambda g, x, c: g.add("AvgPool", x, kernel=[2, 2], strides=[2, 2]),
    "SumPool": lambda g, x, c: g.add("SumPool", x, kernel=[2, 2], strides=[2, 2]),
    "Concat": lambda g, x, c: g.add("Concat", x, _second(g), axis=1),
    "Split": lambda g, x, c: list(g.add_node("Split", [x], {"axis": 1, "split": [2, 2]}).outputs),
    "Slice": lambda g, x, c: g.add("Slice", x, starts=[1], ends=[3], axes=[1], steps=[1]),
    "Pad": lambda g, x, c: g.add("Pad", x, pads=[0, 0, 1, 1, 0, 0, 1, 1]),
    "Transpose": lambda g, x, c: g.add("Transpose", x, perm=[0, 2, 3, 1]),
    "Reshape": lambda g, x, c: g.add("Reshape", x, shape=[1, -1]),
    "Flatten": lambda g, x, c: g.add("Flatten", x),
    "Squeeze": lambda g, x, c: g.add("Squeeze", x, axes=[0]),
    "Unsqueeze": lambda g, x, c: g.add("Unsqueeze", x, axes=[0]),
    "Softmax": lambda g, x, c: g.add("Softmax", x, axis=1),
    "LogSoftmax": lambda g, x, c: g.add("LogSoftmax", x, axis=1),
    "LRN": lambda g, x, c: g.add("LRN", x, size=3),
    "ReduceMean": lambda g, x, c: g.add("ReduceMean", x, axes=[2, 3], keepdims=True),
    "ReduceSum": lambda g, x, c: g.add("ReduceSum", x, axes=[2, 3], keepdims=True),
    "ReduceMax": lambda g, x, c: g.add("ReduceMax", x, axes=[2, 3], keepdims=True),
    "Clip": lambda g, x, c: g.add("Clip", x, min=0.2, max=1.0),
    "Gelu": lambda g, x, c: g.add("Gelu", x, approximate="tanh"),  # nnabla's GELU is this one
    "ReduceL2": lambda g, x, c: g.add("ReduceL2", x, axes=[2, 3], keepdims=True),
    "PRelu": lambda g, x, c: g.add("PRelu", x, c("slope", 4, 1, 1)),
    "LayerNorm": lambda g, x, c: g.add("LayerNorm", x, c("s", 8), c("b", 8), axis=-1),
    "GroupNorm": lambda g, x, c: g.add("GroupNorm", x, c("s", 4), c("b", 4), num_groups=2),
    "InstanceNorm": lambda g, x, c: g.add("InstanceNorm", x, c("s", 4), c("b", 4)),
    "Resize": lambda g, x, c: g.add("Resize", x, sizes=[1, 4, 16, 16], scales=[1.0, 1.0, 2.0, 2.0],
                                    coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    "DepthToSpace": lambda g, x, c: g.add("DepthToSpace", x, blocksize=2),
    "SpaceToDepth": lambda g, x, c: g.add("SpaceToDepth", x, blocksize=2),
    "TopK": lambda g, x, c: list(g.add_node("TopK", [x], {"k": 2, "axis": 1}).outputs),
    "Gather": lambda g, x, c: g.add("Gather", x, axis=1, indices=[2, 0], indices_shape=[2]),
    "MatMul": lambda g, x, c: g.add("MatMul", x, g.add("Transpose", x, perm=[0, 1, 3, 2])),
}


def one_op_model(op: str, seed: int = 0) -> Model:
    """A model whose only computing node is `op` (a Flatten may feed Dense/MatMul)."""
    rng = np.random.default_rng(seed)
    g = Graph(f"one_{op.lower()}")
    x = g.add_input("x", TensorType("float32", SHAPE))

    def const(name: str, *shape: int, low: float | None = None) -> Value:
        data = rng.uniform(low, 1.5, shape) if low is not None else rng.standard_normal(shape) * 0.3
        return g.add_constant(name, data.astype(np.float32))

    schema = get_schema(op)
    build = BUILDERS.get(op)
    if build is not None:
        y = build(g, x, const)
    elif not any(spec.default is REQUIRED for spec in schema.attrs.values()) and schema.min_inputs == 1:
        y = g.add(op, x)
    elif not any(spec.default is REQUIRED for spec in schema.attrs.values()) and schema.has("broadcast"):
        y = g.add(op, x, _second(g))
    else:
        raise AssertionError(f"tests/op_models.py has no model for IR op {op!r}: add a builder to BUILDERS")
    g.outputs = y if isinstance(y, list) else [y]
    return Model(g)


def calibration(model: Model, samples: int = 8, seed: int = 1) -> dict[str, np.ndarray]:
    """Positive inputs (Log, Sqrt, Pow and Div are defined on them)."""
    rng = np.random.default_rng(seed)
    return {v.name: rng.uniform(0.1, 2.0, (samples, *SHAPE[1:])).astype(np.float32) for v in model.graph.inputs}
