"""The IR verifier: collects every problem at once instead of stopping at the first."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError, VerificationError
from qcc.ir.core import Graph, Model, Value
from qcc.ir.registry import get_schema, has_op
from qcc.ir.types import DTYPES, FRAC_RANGE, Affine, FixedPoint, Sign, affine_bounds

ModelCheck = Callable[[Model], list[str]]
_MODEL_CHECKS: dict[str, ModelCheck] = {}


def register_model_check(name: str, check: ModelCheck) -> None:
    """Let subsystems (e.g. memory plans) add invariants the verifier enforces."""
    _MODEL_CHECKS[name] = check


def verify_graph(graph: Graph) -> list[str]:
    problems: list[str] = []
    seen_names: dict[str, str] = {}
    defined: set[int] = set()

    def define(value: Value, where: str) -> None:
        if value.name in seen_names:
            problems.append(f"value name {value.name!r} defined twice ({seen_names[value.name]} and {where})")
        seen_names[value.name] = where
        defined.add(id(value))

    for value in graph.inputs:
        define(value, "graph input")
        if value.producer() is not None:
            problems.append(f"graph input {value.name!r} has a producer")
    for value in graph.constants:
        define(value, "constant")
        if value.const is None:
            problems.append(f"constant {value.name!r} has no data")
        else:
            problems += _check_const(value)

    node_names: set[str] = set()
    on_graph = {id(n) for n in graph.nodes}
    use_sets: dict[int, set[tuple[int, int]]] = {}

    def recorded(value: Value, node: Any, index: int) -> bool:
        uses = use_sets.get(id(value))
        if uses is None:
            uses = use_sets[id(value)] = {(id(n), i) for n, i in value._uses}
        return (id(node), index) in uses

    for node in graph.nodes:
        where = f"node {node.name!r} ({node.op})"
        if node.name in node_names:
            problems.append(f"node name {node.name!r} used twice")
        node_names.add(node.name)
        for index, operand in enumerate(node.inputs):
            if operand is None:
                continue
            if id(operand) not in defined:
                producer = operand.producer()
                if producer is not None and id(producer) in on_graph:
                    problems.append(f"{where}: input {operand.name!r} is used before its producer {producer.name!r} (not in topological order)")
                else:
                    problems.append(f"{where}: input {operand.name!r} is not defined in the graph")
            if not recorded(operand, node, index):
                problems.append(f"{where}: use-list of {operand.name!r} misses this node")
        for value in node.outputs:
            if value.producer() is not node:
                problems.append(f"{where}: output {value.name!r} names another producer")
            define(value, where)
        if not has_op(node.op):
            problems.append(f"{where}: unknown op")
            continue
        problems += _check_schema(node, where)

    for value in graph.values():
        for user, index in value._uses:
            if id(user) not in on_graph:
                problems.append(f"value {value.name!r} is used by node {user.name!r}, which is not in the graph")
            elif index >= len(user.inputs) or user.inputs[index] is not value:
                problems.append(f"use-list of {value.name!r} points at {user.name!r} input {index}, which is another value")
        problems += _check_quant(value)
    if not graph.outputs:
        problems.append(f"graph {graph.name!r} has no outputs")
    for value in graph.outputs:
        if id(value) not in defined:
            problems.append(f"graph output {value.name!r} is not defined in the graph")
    return problems


def _check_const(value: Value) -> list[str]:
    data = value.const
    assert data is not None
    problems = []
    if tuple(data.shape) != tuple(value.type.shape):
        problems.append(f"constant {value.name!r}: data shape {data.shape} != declared {value.type.shape}")
    if data.dtype != DTYPES[value.type.dtype]:
        problems.append(f"constant {value.name!r}: data dtype {data.dtype} != declared {value.type.dtype}")
    if data.dtype.kind == "f" and data.size and not np.isfinite(data).all():
        problems.append(f"constant {value.name!r} holds NaN or Inf")
    return problems


def _check_schema(node: Any, where: str) -> list[str]:
    schema = get_schema(node.op)
    problems = [f"{where}: {p}" for p in schema.check_attrs(node.attrs)]
    arity = schema.check_arity(len(node.inputs))
    if arity:
        return [*problems, f"{where}: {arity}"]
    if problems:
        return problems
    if any(v is None for v in node.inputs[: schema.min_inputs]):
        return [f"{where}: a required input is missing"]
    try:
        expected = schema.infer_types(list(node.inputs), node.attrs, node.name)
    except InvalidInputError as exc:
        return [str(exc)]
    if len(expected) != len(node.outputs):
        problems.append(f"{where}: has {len(node.outputs)} outputs, schema infers {len(expected)}")
    for value, ttype in zip(node.outputs, expected):
        if value.type != ttype:
            problems.append(f"{where}: output {value.name!r} declared {value.type}, inferred {ttype}")
    if schema.verify is not None:
        problems += [f"{where}: {p}" for p in schema.verify(node)]
    return problems


def _check_quant(value: Value) -> list[str]:
    q = value.quant
    where = f"value {value.name!r}"
    if isinstance(q, FixedPoint) and not FRAC_RANGE[0] <= q.frac <= FRAC_RANGE[1]:
        return [f"{where}: fixed-point fraction {q.frac} out of range"]
    if isinstance(q, Affine):
        problems = []
        if not all(0.0 < s < math.inf for s in q.scale):  # NaN fails both comparisons
            problems.append(f"{where}: affine scale must be finite and > 0")
        if q.axis is not None:
            if not 0 <= q.axis < max(value.type.rank, 1):
                problems.append(f"{where}: affine axis {q.axis} out of range")
            elif value.type.shape[q.axis] != len(q.scale):
                problems.append(f"{where}: {len(q.scale)} scales for axis of size {value.type.shape[q.axis]}")
        lo, hi = affine_bounds(q.dtype)
        if not lo <= min(q.zero_point) <= max(q.zero_point) <= hi:
            problems.append(f"{where}: zero point outside {q.dtype}")
        return problems
    if isinstance(q, Sign) and not value.is_const:
        return [f"{where}: SIGN is for parameters only"]
    return []


def verify_model(model: Model) -> list[str]:
    problems = verify_graph(model.graph)
    for name, check in _MODEL_CHECKS.items():
        problems += [f"{name}: {p}" for p in check(model)]
    return problems


def check_model(model: Model, where: str = "") -> None:
    problems = verify_model(model)
    if problems:
        raise VerificationError(problems, where)
