"""fuse-layernorm: LayerNorm as paddle2onnx writes it (ReduceMean, Sub, Pow, ReduceMean, Add,
Sqrt, Div, Mul, Add) becomes one LayerNorm in target c's legalization, so affine C runs it as a
float island instead of refusing the Div by a tensor.

Oracles: onnxruntime on the spelled-out ONNX graph (float), qcc.sim.affine_int on the compiled
int8 model (the gcc-built C program bit for bit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import qcc
from qcc.errors import UnsupportedError
from qcc.pm import PassContext, PassManager
from qcc.sim.affine_int import run_affine_int
from tests.onnx_zoo import ort_run
from tests.op_check import EPS, check_c, needs_gcc, onnx_model

SHAPE = (2, 8, 16)


def layernorm_proto(d_is_output: bool = False, square: str = "Pow") -> bytes:
    """Add -> LayerNorm spelled out as paddle2onnx does (opset 12) -> Mul, on (N, 8, 16)."""
    rng = np.random.default_rng(5)
    inits = {"shift": (rng.standard_normal(16) * 0.5).astype(np.float32),
             "out_scale": rng.uniform(-2.0, 2.0, 16).astype(np.float32),
             "gamma": rng.uniform(0.5, 1.5, 16).astype(np.float32),
             "beta": (rng.standard_normal(16) * 0.2).astype(np.float32),
             "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    squared = (helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "Pow"
               else helper.make_node("Mul", ["d", "d"], ["sq"]))
    nodes = [
        helper.make_node("Add", ["x", "shift"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["h", "mean"], ["d"]),
        squared,
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["root"]),
        helper.make_node("Div", ["d", "root"], ["n"], name="ln_div"),
        helper.make_node("Mul", ["n", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["ln"]),
        helper.make_node("Mul", ["ln", "out_scale"], ["y"]),
    ]
    outputs = {"y": None, **({"d": None} if d_is_output else {})}
    return onnx_model(nodes, {"x": ("N", *SHAPE[1:])}, outputs, inits, opset=12)


def feeds(n: int = SHAPE[0]) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(9).standard_normal((n, *SHAPE[1:])).astype(np.float32)}


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_fused_float_model_matches_onnxruntime(tmp_path: Path, square: str) -> None:
    from qcc.passes.fuse_layernorm import FuseLayerNorm

    source = tmp_path / "ln.onnx"
    source.write_bytes(layernorm_proto(square=square))
    model = qcc.load(source)
    ctx = PassContext()
    model = PassManager([FuseLayerNorm(only_affine=False)]).run(model, ctx).model
    assert [n.op for n in model.graph.nodes] == ["Add", "LayerNorm", "Mul"]
    (note,) = ctx.report["legalization"]
    assert "'ln_div'" in note and "LayerNorm(axis 2" in note
    x = feeds()["x"]
    want = ort_run(str(source), {"x": x})[0]
    got = qcc.run(model, {"x": x})["y"]
    # float32 rounding of two reductions and a division, in another order: a few ulps of |y|
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * EPS * float(np.abs(want).max()))


def test_only_affine_leaves_a_float_model_alone(tmp_path: Path) -> None:
    from qcc.passes.fuse_layernorm import FuseLayerNorm

    source = tmp_path / "ln.onnx"
    source.write_bytes(layernorm_proto())
    model = qcc.load(source)
    ops = [n.op for n in model.graph.nodes]
    result = PassManager([FuseLayerNorm()]).run(model, PassContext())
    assert not result.modified and [n.op for n in result.model.graph.nodes] == ops


@needs_gcc
def test_c_int8_runs_the_pattern_as_one_float_island(tmp_path: Path) -> None:
    """C float computes the spelled-out ops; C int8 fuses them, bit-exact with qcc.sim.affine_int,
    with one float-island line and one legalization line; the int8 output stays near ORT's float."""
    source = tmp_path / "ln.onnx"
    source.write_bytes(layernorm_proto())
    x = feeds(8)
    compiled = check_c(tmp_path, lambda: qcc.load(source), x)
    assert "Div" not in [n.op for n in compiled.graph.nodes]
    report = compiled.metadata["test.report"]
    islands = report["c"]["float_islands"]
    assert [i["op"] for i in islands] == ["LayerNorm"]
    assert any("LayerNorm" in line for line in report["legalization"])
    want = ort_run(str(source), x)[0]
    got = run_affine_int(compiled, x)["y"]
    sqnr = 10 * np.log10(np.sum(want**2) / np.sum((got - want) ** 2))
    assert sqnr > 20.0, sqnr


def test_a_chain_read_elsewhere_is_not_fused(tmp_path: Path) -> None:
    """x - mean is also a graph output: nothing is fused and C int8 names the Div it cannot run."""
    source = tmp_path / "ln.onnx"
    source.write_bytes(layernorm_proto(d_is_output=True))
    np.savez(tmp_path / "calib.npz", **feeds(8))
    with pytest.raises(UnsupportedError) as exc:
        qcc.compile(source, tmp_path / "c", target="c", quantize="int8", calib=str(tmp_path / "calib.npz"))
    assert "Div" in str(exc.value) and "'ln_div'" in str(exc.value) and "\n" not in str(exc.value)
