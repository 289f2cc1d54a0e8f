"""Helpers for testing passes: build a small model, run a pass the way the compiler does, compare.

A pass test should check what the pass promises on real outputs: the IR it leaves (op counts or
the exact text), that the IR still verifies, and that the reference interpreter computes the same
outputs before and after within a tolerance. `check_pass` does all three. Plain `assert`s and
`AssertionError`s only, so it works under pytest, unittest or a script.
"""

from __future__ import annotations

import copy
import difflib
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from qcc.ir.core import Graph, Model, Value
from qcc.ir.text import print_model
from qcc.ir.types import DTYPES, Dim, TensorType
from qcc.ir.verify import verify_model
from qcc.plugins import Registry, scoped_registry
from qcc.pm.base import Pass, PassContext, PassResult
from qcc.pm.manager import PassManager
from qcc.pm.spec import PassSpec
from qcc.sim.interpreter import run_model

InputSpec = Sequence[Dim] | TensorType


def make_model(
    inputs: Mapping[str, InputSpec],
    build: Callable[..., Value | Sequence[Value]],
    name: str = "test",
) -> Model:
    """`build(graph, *input_values)` adds nodes and returns the output value(s); verified.

    An input given as a shape is float32; give a `TensorType` for anything else.
    """
    graph = Graph(name)
    values = [graph.add_input(key, spec if isinstance(spec, TensorType) else TensorType("float32", tuple(spec)))
              for key, spec in inputs.items()]
    result = build(graph, *values)
    graph.outputs = [result] if isinstance(result, Value) else list(result)
    model = Model(graph)
    problems = verify_model(model)
    assert not problems, "make_model built an invalid model: " + "; ".join(problems)
    return model


def constant(graph: Graph, value: Any, name: str = "c", dtype: str = "float32") -> Value:
    """A constant with a fresh name (scalars become 1-element tensors)."""
    return graph.add_constant(graph.unique_name(name), np.atleast_1d(np.asarray(value, dtype=DTYPES[dtype])))


def random_feeds(model: Model, batch: int = 2, seed: int = 0, low: float = -4.0, high: float = 4.0,
                 dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Uniform random arrays for every graph input; symbolic dims get `dims[sym]` or `batch`."""
    rng = np.random.default_rng(seed)
    sizes = dict(dims or {})
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.inputs:
        shape = tuple(d if isinstance(d, int) else sizes.get(d, batch) for d in value.type.shape)
        dtype = DTYPES[value.type.dtype]
        if dtype.kind == "f":
            feeds[value.name] = rng.uniform(low, high, shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(int(low), int(high) + 1, shape).astype(dtype)
    return feeds


def clone_model(model: Model) -> Model:
    """An independent copy (passes mutate in place; keep one to compare against)."""
    return copy.deepcopy(model)


def op_counts(model: Model) -> dict[str, int]:
    """How many nodes of each op the graph has."""
    return dict(Counter(node.op for node in model.graph.nodes))


def run_pass(
    model: Model,
    p: Pass | PassSpec | str,
    ctx: PassContext | None = None,
    verify: bool = True,
) -> PassResult:
    """Run one pass (an instance or a spec string such as "my-pass{k=v}") through the PassManager.

    This is the path the compiler takes: ordering checks, verification after the pass, a
    crash reported as an InternalError naming the pass. The model is changed in place.
    """
    spec: Any = p if isinstance(p, str) else [p]
    return PassManager(spec, verify=verify).run(model, ctx or PassContext())


def assert_outputs_close(
    expected: Model,
    actual: Model,
    feeds: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    quantized: bool = False,
) -> None:
    """Both models give the same outputs (by position) on `feeds` (default: random_feeds)."""
    data = dict(feeds) if feeds is not None else random_feeds(expected)
    want = list(run_model(expected, data, quantized=quantized).items())
    got = list(run_model(actual, data, quantized=quantized).items())
    assert len(want) == len(got), f"output count changed: {len(want)} -> {len(got)}"
    for (name_w, w), (name_g, g) in zip(want, got):
        assert w.shape == g.shape, f"output {name_g!r} (was {name_w!r}): shape {w.shape} -> {g.shape}"
        if not np.allclose(w, g, rtol=rtol, atol=atol):
            err = np.abs(w.astype(np.float64) - g.astype(np.float64))
            raise AssertionError(
                f"output {name_g!r} (was {name_w!r}) differs: max abs error {err.max():.3g} at "
                f"{np.unravel_index(int(err.argmax()), err.shape)} (rtol={rtol}, atol={atol})"
            )


def check_pass(
    model: Model,
    p: Pass | PassSpec | str,
    feeds: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    expect_modified: bool | None = True,
    ctx: PassContext | None = None,
) -> Model:
    """Run `p` on a copy of `model` with verification, compare outputs, return the result.

    `expect_modified=None` accepts either answer; True/False asserts what the pass reported.
    """
    after = clone_model(model)
    result = run_pass(after, p, ctx)
    if expect_modified is not None:
        assert result.modified == expect_modified, f"pass reported modified={result.modified}, expected {expect_modified}"
    assert_outputs_close(model, result.model, feeds, rtol=rtol, atol=atol)
    return result.model


_PAYLOAD = re.compile(r' = (data|elided) "[^"]*"$')


def ir_text(model: Model, constants: bool = False) -> str:
    """The printed IR; without constant payloads unless `constants` (keeps tests readable)."""
    text = print_model(model)
    if not constants:
        text = "\n".join(_PAYLOAD.sub("", line) for line in text.splitlines())
    return text.strip()


def assert_ir(model: Model, expected: str, constants: bool = False) -> None:
    """The model prints as `expected` (dedented; constant payloads left out unless asked)."""
    want = textwrap.dedent(expected).strip()
    got = ir_text(model, constants)
    if got != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "expected", "actual", lineterm=""))
        raise AssertionError("IR differs from the expected text:\n" + diff)


@contextmanager
def isolated_registry(autoload: bool = False) -> Iterator[Registry]:
    """A fresh plugin registry for one test, so `qcc.register_pass` does not leak between tests."""
    with scoped_registry(autoload) as reg:
        yield reg
