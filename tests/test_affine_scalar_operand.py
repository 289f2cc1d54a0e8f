"""Div and Pow by a constant scalar in the affine int8 mode (issue 17: PP-OCR's HardSwish is
x * clip(x + 3, 0, 6) / 6, LayerNorm patterns square with Pow): a lookup table of input 0, bit-exact
between the C program and qcc.sim.affine_int, within one output step of the fake-quant reading."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from qcc.errors import UnsupportedError
from qcc.ir.core import Graph, Model
from qcc.ir.types import TensorType
from qcc.pm import PassContext, PassManager, build_passes
from qcc.sim.affine_int import run_affine_int
from qcc.sim.interpreter import run_model

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _model(divisor_is_tensor: bool = False) -> Model:
    g = Graph("hswish")
    x = g.add_input("x", TensorType("float32", ("N", 2, 5, 5)))
    w = g.add_constant("w", np.random.default_rng(0).normal(0, 0.5, (3, 2, 3, 3)).astype(np.float32))
    c = g.add("Conv", x, w, name="conv", strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1)
    gate = g.add("Clip", g.add("Add", c, g.add_constant("three", np.array(3.0, np.float32)), name="add3"),
                 name="clip", min=0.0, max=6.0)
    prod = g.add("Mul", c, gate, name="mul")
    six = g.add_constant("six", np.array([6.0], np.float32))
    divided = g.add("Div", prod, c if divisor_is_tensor else six, name="div6")
    g.outputs = [g.add("Pow", divided, g.add_constant("two", np.array(2.0, np.float32)), name="square")]
    return Model(g)


def _quantize(model: Model) -> Model:
    ctx = PassContext()
    ctx.calib_data = {"x": np.random.default_rng(1).normal(0, 1.5, (16, 2, 5, 5)).astype(np.float32)}
    return PassManager(build_passes("calibrate,quantize-affine")).run(model, ctx).model


def test_div_and_pow_by_a_constant_are_tables_bit_exact_in_c(tmp_path: Path) -> None:
    from tests.test_backend_c import build, run_c

    model = _quantize(_model())
    exe = build(model, tmp_path / "hsw")
    x = np.random.default_rng(2).normal(0, 1.5, (20, 2, 5, 5)).astype(np.float32)
    got = run_c(exe, x, 75)
    want = run_affine_int(model, {"x": x})["square"].reshape(20, -1)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    fake = run_model(model, {"x": x}, quantized=True)["square"].reshape(20, -1)
    step = model.graph.outputs[0].quant.scale[0]  # type: ignore[union-attr]
    assert np.abs(got - fake).max() <= step * 1.001 and np.mean(got == fake) > 0.9


def test_div_by_a_tensor_is_refused_naming_the_node(tmp_path: Path) -> None:
    from qcc.backends.c import BACKEND

    model = _quantize(_model(divisor_is_tensor=True))
    with pytest.raises(UnsupportedError, match=r"op Div \(node 'div6'\) is not supported in affine mode: only with "
                                               "a constant scalar"):
        BACKEND.write(model, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_pow_in_c_float_matches_onnxruntime(tmp_path: Path) -> None:
    """PP-OCR's recognizer squares in its LayerNorm pattern: Pow by a scalar and by a broadcast
    tensor of exponents. pow() in double rounded once to float32 and onnxruntime's powf are each
    within an ulp of the exact power: elementwise within 2 ulps."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    import qcc
    from tests.onnx_zoo import ort_run
    from tests.test_backend_c import build, run_c

    consts = [nh.from_array(np.array(2.0, np.float32), "two"),
              nh.from_array(np.array([0.5, 1.5, 3.0], np.float32).reshape(3, 1), "e")]
    nodes = [h.make_node("Pow", ["x", "two"], ["sq"]), h.make_node("Abs", ["x"], ["a"]),
             h.make_node("Pow", ["a", "e"], ["p"]), h.make_node("Add", ["sq", "p"], ["y"])]
    graph = h.make_graph(nodes, "pow", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 8])], consts)
    path = tmp_path / "pow.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    exe = build(qcc.load(path), tmp_path / "pow_c")
    xs = np.random.default_rng(3).normal(0, 2, (6, 1, 3, 8)).astype(np.float32)
    got = run_c(exe, xs.reshape(6, -1), 24)
    want = np.concatenate([ort_run(str(path), {"x": x})[0].reshape(1, -1) for x in xs])
    np.testing.assert_allclose(got, want, rtol=2 * 2.0**-23, atol=0)
