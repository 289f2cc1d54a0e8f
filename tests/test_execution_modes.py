"""One execution loop for every simulator; target c's numeric modes as objects; no import cycles.

The simulators (float interpreter, fixed point, affine integers) share `qcc.sim.engine.Runner`;
target c's float, fixed-point and affine modes are `NumericMode` objects that read op categories
from the registry, so an op registered with a trait is simulated and compiled without editing
either. Oracles: the simulators themselves (bit for bit) and gcc.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.backends.c import generate
from qcc.backends.c.modes import AFFINE_MODE, FIXED_MODE, FLOAT_MODE, MODES

import qcc.ir.registry as registry
from qcc.ir.core import Graph, Model
from qcc.ir.registry import OpDef, all_ops, register
from qcc.ir.types import Affine, FixedPoint, TensorType
from qcc.sim import affine_int as ai
from qcc.sim.affine_int import run_affine_int
from qcc.sim.fixed import FixedRunner, run_fixed
from qcc.sim.interpreter import Interpreter, run_model
from tests.cli_util import ROOT

# ---------------------------------------------------------------- layers


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "backends":
        parts.insert(0, "qcc")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of `known` that `path` imports anywhere (function bodies included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found & known


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


@pytest.mark.parametrize("folder", ["qcc/sim", "backends/c"])
def test_no_import_cycles(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    names = {f: _module_name(f) for f in files}
    known = set(names.values())
    graph = {names[f]: _imports(f, names[f], known) - {names[f]} for f in files}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


# ---------------------------------------------------------------- modes read the registry


def test_affine_mode_compiles_exactly_what_the_affine_simulator_runs() -> None:
    simulated = {op for op in all_ops() if ai.kernel_for(op) is not None}
    assert AFFINE_MODE.lowered_ops() == simulated
    assert {"Gelu", "Erf", "Log", "Sqrt"} <= simulated  # tables for any one-input elementwise op


def test_fixed_mode_refuses_with_a_reason_what_only_float_has() -> None:
    fixed, floating = FIXED_MODE.lowered_ops(), FLOAT_MODE.lowered_ops()
    assert fixed < floating
    for op in floating - fixed:
        assert FIXED_MODE.refusal(op) == "no bit-exact fixed-point kernel", op
    assert FIXED_MODE.refusal("LogSoftmax") == ""  # float does not lower it either
    assert [m.name for m in MODES] == ["float", "fixed", "affine"]


class Shuffle(OpDef):
    """A view op a plugin could register: only the `view` trait says what it is."""

    name = "TestShuffleView"
    traits = frozenset({"view"})
    attrs = {"shape": registry.AttrSpec("ints")}

    @staticmethod
    def infer(types: list[TensorType], attrs: dict[str, Any], consts: list[Any]) -> list[TensorType]:
        return [TensorType(types[0].dtype, (types[0].shape[0], *attrs["shape"]))]

    @staticmethod
    def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0].reshape(len(xs[0]), *node.attrs["shape"])]


@pytest.fixture
def view_op() -> Iterator[str]:
    register(Shuffle)
    try:
        yield Shuffle.name
    finally:
        registry._REGISTRY.pop(Shuffle.name, None)
        registry._DERIVED.clear()


def _view_model(op: str) -> Model:
    g = Graph("viewnet")
    x = g.add_input("x", TensorType("float32", ("N", 2, 3)))
    r = g.add("Relu", x, name="relu")
    v = g.add(op, r, name="shuffle", shape=[3, 2])
    g.outputs = [g.add("Relu", v, name="relu2")]
    return Model(g)


def test_an_op_with_the_view_trait_is_simulated_and_compiled_in_every_mode(tmp_path: Path, view_op: str) -> None:
    assert all(view_op in mode.lowered_ops() for mode in MODES)
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 2, 3)
    model = _view_model(view_op)
    assert generate(model, "f").mode == "float"
    fixed = _view_model(view_op)
    quants = [FixedPoint(8, 5), FixedPoint(8, 5), FixedPoint(8, 3), FixedPoint(8, 3)]  # the view requantizes
    for value, quant in zip([fixed.graph.inputs[0], *(n.outputs[0] for n in fixed.graph.nodes)], quants):
        value.quant = quant
    gen = generate(fixed, "q")
    assert "qcc_requant_i8_i8(" in gen.files["q.c"]
    got = run_fixed(fixed, {"x": x})["relu2"]
    q5 = np.maximum(np.rint(x * 32), 0)  # input rounded half to even at frac 5, Relu
    assert np.array_equal(got, (np.trunc(q5 / 4) / 8).reshape(4, 3, 2))  # truncated to frac 3
    if shutil.which("gcc") is not None:
        from tests.test_backend_c import build, run_c

        exe = build(fixed, tmp_path / "q")
        assert np.array_equal(run_c(exe, x, 6).view(np.uint32), got.reshape(4, 6).view(np.uint32))
    affine = _view_model(view_op)
    for value in [affine.graph.inputs[0], *(n.outputs[0] for n in affine.graph.nodes)]:
        value.quant = Affine((1 / 32,), (0,), "int8")
    assert "view of relu" in generate(affine, "a").files["a.c"]  # same annotation: no copy
    want = np.maximum(np.rint(x * 32), 0) / 32
    assert np.array_equal(run_affine_int(affine, {"x": x})["relu2"], want.reshape(4, 3, 2))


# ---------------------------------------------------------------- one loop


def test_a_quantized_run_follows_the_store_rule_of_the_annotations() -> None:
    """run_model(quantized=True) runs nnabla-c-runtime's integer kernels only for a model whose
    computed values are stored by truncation (the .nnb and C targets); the same positions for a
    runtime that rounds to nearest (onnx-qdq) are fake-quantized value by value."""
    from qcc.sim.interpreter import runner_for

    g = Graph("fc")
    x = g.add_input("x", TensorType("float32", ("N", 4)))
    w = g.add_constant("w", np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32))
    y = g.add("Dense", x, w, name="fc")
    g.outputs = [y]
    model = Model(g)
    w.quant = FixedPoint(8, 6)
    feeds = {"x": np.random.default_rng(1).uniform(-4, 4, (64, 4)).astype(np.float32)}
    for rounding in ("half_even", "trunc"):
        x.quant, y.quant = FixedPoint(8, 4, rounding), FixedPoint(8, 4, rounding)
        got = run_model(model, feeds, quantized=True)["fc"]
        fake = Interpreter(model, quantized=True).run(feeds)["fc"]
        integer = run_fixed(model, feeds)["fc"]
        assert isinstance(runner_for(model, quantized=True), FixedRunner) == (rounding == "trunc")
        assert np.array_equal(got, integer if rounding == "trunc" else fake)
        assert not np.array_equal(fake, integer)


def test_every_runner_returns_every_graph_output_and_observes_floats() -> None:
    g = Graph("passthrough")
    x = g.add_input("x", TensorType("float32", ("N", 4)))
    y = g.add("Relu", x, name="relu")
    g.outputs = [y, x]  # a graph output that is a graph input
    model = Model(g)
    feeds = {"x": np.array([[-1.0, 0.25, 0.5, 2.0]], np.float32)}
    floats = run_model(model, feeds, keep_all=True)
    assert list(floats) == ["relu", "x"]
    x.quant = y.quant = FixedPoint(8, 4)
    seen: list[tuple[str, np.dtype[Any]]] = []
    runner = FixedRunner(model, observer=lambda v, a: seen.append((v.name, a.dtype)), keep_all=True)
    assert list(runner.run(feeds)) == ["relu", "x"]
    assert seen == [("x", np.dtype(np.float32)), ("relu", np.dtype(np.float32))]
    seen.clear()
    Interpreter(model, quantized=True, observer=lambda v, a: seen.append((v.name, a.dtype))).run(feeds)
    assert seen == [("x", np.dtype(np.float32)), ("relu", np.dtype(np.float32))]
