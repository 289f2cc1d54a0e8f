"""ONNX MatMul and Einsum: products of two tensors as Dense (a constant matrix: the IR's op with
a weight role, so per-channel int8 weights and BN folding apply) or MatMul (activation x
activation, e.g. attention), with the Transpose/Reshape/ReduceSum an Einsum equation needs.
Registered in `qcc.frontends.onnx.IMPORTERS` (which loads this module).
"""

from __future__ import annotations

import math
import string
from typing import Any

import attrs

from qcc.errors import UnsupportedError
from qcc.frontends.onnx import _Ctx, importer
from qcc.ir.core import Graph, Value
from qcc.ir.types import Dim

PRODUCT_OPS = ("Dense", "Reshape", "MatMul")


def product(graph: Graph, a: Value, b: Value, name: str) -> Value:
    """a @ b (rank >= 2): Dense on a 2-D view of a when b is a constant matrix, else MatMul."""
    if not (b.is_const and b.type.rank == 2):
        return graph.add("MatMul", a, b, name=name)
    if a.type.rank == 2:
        return graph.add("Dense", a, b, name=name)
    k, m = (int(d) for d in b.type.shape)
    lead = list(a.type.shape[:-1])
    if sum(not isinstance(d, int) for d in lead) > 1:
        raise UnsupportedError(f"node {name!r}: a product over several symbolic dims {a.type.shape}")
    flat = graph.add("Reshape", a, shape=[-1, k], name=f"{name}_rows")
    y = graph.add("Dense", flat, b, name=f"{name}_dense")
    return graph.add("Reshape", y, shape=[d if isinstance(d, int) else -1 for d in lead] + [m], name=name)


@importer("MatMul", emits=PRODUCT_OPS)
def _matmul(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    a, b = ctx.value(node.input[0]), ctx.value(node.input[1])
    assert a is not None and b is not None
    if a.type.rank < 2 or b.type.rank < 2:
        raise UnsupportedError(f"{ctx.source}: node {node.name!r} (MatMul) with a 1-D operand")
    ctx.bind(node.output[0], product(ctx.graph, a, b, node.name))


# ----------------------------------------------------------------------------- einsum
@attrs.frozen
class Equation:
    inputs: tuple[str, ...]
    output: str


def parse_equation(equation: str, ranks: list[int]) -> Equation:
    """One letter per axis; `...` expands to the broadcast axes (upper-case letters not used
    elsewhere); an implicit output is the letters used once, sorted."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"{len(terms)} terms for {len(ranks)} inputs")
    spare = [c for c in string.ascii_uppercase if c not in text]
    width = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    dots = "".join(spare[:width])
    expanded = [t.replace("...", dots[len(dots) - (r - len(t.replace("...", ""))):] if "..." in t else "")
                for t, r in zip(terms, ranks)]
    if not arrow:
        counts = {c: "".join(expanded).count(c) for c in "".join(expanded)}
        rhs = dots + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in dots))
    rhs = rhs.replace("...", dots)
    for term, rank in zip(expanded, ranks):
        if len(term) != rank or len(set(term)) != len(term):
            raise ValueError(f"term {term!r} does not name {rank} distinct axes")
    return Equation(tuple(expanded), rhs)


class _Einsum:
    """Builds the IR of one two-input (or one-input) Einsum."""

    def __init__(self, ctx: _Ctx, node: Any) -> None:
        self.ctx, self.node, self.graph = ctx, node, ctx.graph

    def fail(self, why: str) -> UnsupportedError:
        return UnsupportedError(f"{self.ctx.source}: node {self.node.name!r} (Einsum {self.equation!r}): {why}")

    @property
    def equation(self) -> str:
        value = next(a for a in self.node.attribute if a.name == "equation").s
        return value.decode() if isinstance(value, bytes) else str(value)

    def add(self, op: str, x: Value, part: str, **attributes: Any) -> Value:
        return self.graph.add(op, x, name=f"{self.node.name}_{part}", **attributes)

    def arrange(self, x: Value, term: str, order: str, part: str) -> Value:
        """x (axes named by term) with its axes in `order`; letters of term missing from order are summed."""
        gone = [i for i, c in enumerate(term) if c not in order]
        if gone:
            x = self.add("ReduceSum", x, f"{part}_sum", axes=gone, keepdims=False)
            term = "".join(c for c in term if c in order)
        perm = [term.index(c) for c in order if c in term]
        if perm != list(range(len(perm))):
            x = self.add("Transpose", x, f"{part}_transpose", perm=perm)
        return x

    def reshape(self, x: Value, dims: list[Dim], part: str) -> Value:
        if list(x.type.shape) == dims:
            return x
        symbolic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        if len(symbolic) > 1:
            raise self.fail(f"several symbolic axes {dims}")
        return self.add("Reshape", x, part, shape=[d if isinstance(d, int) else -1 for d in dims])

    def build(self, values: list[Value]) -> Value:
        eq = parse_equation(self.equation, [v.type.rank for v in values])
        if len(values) == 1:
            return self.arrange(values[0], eq.inputs[0], eq.output, "a")
        if len(values) != 2:
            raise self.fail("more than two operands")
        (ta, tb), out = eq.inputs, eq.output
        size = {c: d for t, v in zip(eq.inputs, values) for c, d in zip(t, v.type.shape)}
        for c in set(ta) & set(tb):
            da, db = values[0].type.shape[ta.index(c)], values[1].type.shape[tb.index(c)]
            if da != db:
                raise self.fail(f"axis {c!r} has sizes {da} and {db} (no broadcasting)")
        batch = [c for c in out if c in ta and c in tb]
        contract = [c for c in ta if c in tb and c not in out]
        free_a = [c for c in ta if c not in tb and c in out]
        free_b = [c for c in tb if c not in ta and c in out]
        a = self.arrange(values[0], ta, "".join(batch + free_a + contract), "a")
        b = self.arrange(values[1], tb, "".join(batch + contract + free_b), "b")
        lead = [size[c] for c in batch]
        rows, depth, cols = (self.prod([size[c] for c in axes]) for axes in (free_a, contract, free_b))
        a = self.reshape(a, [*lead, rows, depth], "a_3d")
        b = self.reshape(b, [*lead, depth, cols], "b_3d")
        y = product(self.graph, a, b, f"{self.node.name}_product")
        y = self.reshape(y, lead + [size[c] for c in free_a] + [size[c] for c in free_b], "unflatten")
        return self.arrange(y, "".join(batch + free_a + free_b), out, "out")

    def prod(self, dims: list[Dim]) -> Dim:
        if all(isinstance(d, int) for d in dims):
            return math.prod(int(d) for d in dims)
        if len(dims) == 1:
            return dims[0]
        raise self.fail(f"merges the symbolic axis of {dims}")


@importer("Einsum", emits=("MatMul", "Dense", "Reshape", "Transpose", "ReduceSum", "Identity"))
def _einsum(ctx: _Ctx, node: Any, attrs: dict[str, Any]) -> None:
    values = [ctx.value(n) for n in node.input]
    builder = _Einsum(ctx, node)
    try:
        y = builder.build([v for v in values if v is not None])
    except ValueError as exc:
        raise builder.fail(str(exc)) from None
    if y.producer() is None or y in values:
        y = ctx.graph.add("Identity", y, name=node.name)
    ctx.bind(node.output[0], y)
