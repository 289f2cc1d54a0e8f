"""Softplus, log(1 + exp(x)), added by following docs/adding-an-op.md: read from ONNX, torch and
.nnp, written to ONNX, ONNX QDQ, .nnp and C (float and affine), checked against onnxruntime,
torch, nnabla and gcc; the targets without it (nnb, C fixed point) fail in one line.

Tolerance against the float64 reference: float32 kernels round exp, the sum and log (3 eps
relative) and some form 1 + exp(x) in float32 (eps absolute, which dominates for x << 0).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import qcc
from qcc.errors import UnsupportedError
from qcc.ir import Graph, Model, TensorType
from qcc.sim.affine_int import run_affine_int
from qcc.sim.interpreter import Interpreter
from tests.onnx_zoo import ort_run

EPS = float(np.finfo(np.float32).eps)
TOL = {"rtol": 4 * EPS, "atol": EPS}
SHAPE = (1, 3, 4, 4)


def inputs(n: int = 6) -> np.ndarray:
    x = np.random.default_rng(5).uniform(-9, 9, (n, *SHAPE[1:])).astype(np.float32)
    x[0, 0, 0, :] = [-30.0, -20.5, 20.5, 30.0]  # both tails (torch switches to x above 20)
    return x


def reference(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x.astype(np.float64)).astype(np.float32)


def softplus_model() -> Model:
    g = Graph("softplus")
    x = g.add_input("x", TensorType("float32", ("N", *SHAPE[1:])))
    g.outputs = [g.add("Softplus", x, name="act")]
    return Model(g)


def test_onnx_import_export_and_qdq(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Softplus", ["x"], ["y"], name="act")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *SHAPE[1:]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *SHAPE[1:]])])
    source = tmp_path / "softplus.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(source))
    x = inputs()
    (ort_y,) = ort_run(str(source), {"x": x})
    np.testing.assert_allclose(ort_y, reference(x), **TOL)
    model = qcc.load(source)
    assert [(n.op, n.name) for n in model.graph.nodes] == [("Softplus", "act")]
    np.testing.assert_allclose(qcc.run(model, {"x": x})["y"], reference(x), **TOL)
    qcc.compile(source, tmp_path / "copy.onnx")
    assert np.array_equal(ort_run(str(tmp_path / "copy.onnx"), {"x": x})[0], ort_y)

    np.savez(tmp_path / "calib.npz", x=x)
    compiled, _ = qcc.compile(source, tmp_path / "q.onnx", target="onnx-qdq", quantize="uint8",
                              calib=str(tmp_path / "calib.npz"))
    (qdq_y,) = ort_run(str(tmp_path / "q.onnx"), {"x": x}, optimize=True)
    simulated = Interpreter(compiled, quantized=True).run({"x": x})["y"]
    step = compiled.graph.outputs[0].quant.scale[0]  # type: ignore[union-attr]
    assert np.max(np.abs(qdq_y - simulated)) <= step * 1.01  # rounding may differ by one output step
    assert np.max(np.abs(qdq_y - reference(x))) <= quantization_error(compiled)


def quantization_error(model: Model) -> float:
    """Half an input step (softplus' slope is below 1) plus half an output step."""
    steps = [v.quant.scale[0] for v in (*model.graph.inputs, *model.graph.outputs)]  # type: ignore[union-attr]
    return sum(steps) / 2 * 1.01


def test_torch_softplus() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self, beta: float = 1.0) -> None:
            super().__init__()
            self.beta = beta

        def forward(self, x: object) -> object:
            return torch.nn.functional.softplus(x, beta=self.beta)

    x = inputs()
    model = qcc.load(Net(), example_inputs=torch.from_numpy(x))
    assert [n.op for n in model.graph.nodes] == ["Softplus"]
    want = Net()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(want, reference(x), **TOL)
    np.testing.assert_allclose(qcc.run(model, {model.graph.inputs[0].name: x})[model.graph.outputs[0].name],
                               want, **TOL)
    with pytest.raises(UnsupportedError, match=r"softplus.*beta=2.*qcc's Softplus: beta 1"):
        qcc.load(Net(beta=2.0), example_inputs=torch.from_numpy(x))


def _save_nnabla(path: Path, beta: float) -> None:
    import nnabla as nn
    import nnabla.functions as F

    from tests.nnabla_zoo import _save

    nn.clear_parameters()
    x = nn.Variable(SHAPE)
    _save(path, x, F.softplus(x, beta=beta))


def test_nnabla_softplus(tmp_path: Path) -> None:
    pytest.importorskip("nnabla")
    from tests.nnabla_zoo import nnabla_run

    x = inputs(1)
    _save_nnabla(tmp_path / "softplus.nnp", 1.0)
    want, functions = nnabla_run(tmp_path / "softplus.nnp", x)
    assert functions == ["SoftPlus"]
    np.testing.assert_allclose(want, reference(x), **TOL)
    model = qcc.load(tmp_path / "softplus.nnp")
    assert [n.op for n in model.graph.nodes] == ["Softplus"]
    np.testing.assert_allclose(qcc.run(model, {"x": x})["y"], want, **TOL)
    qcc.compile(tmp_path / "softplus.nnp", tmp_path / "copy.nnp")
    again, functions = nnabla_run(tmp_path / "copy.nnp", x)
    assert functions == ["SoftPlus"] and np.array_equal(again, want)

    _save_nnabla(tmp_path / "beta2.nnp", 2.0)
    with pytest.raises(UnsupportedError, match=r"function '.*SoftPlus' \(SoftPlus\): beta = 2.0; qcc's Softplus is SoftPlus with beta = 1.0"):
        qcc.load(tmp_path / "beta2.nnp")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_float_and_affine(tmp_path: Path) -> None:
    from tests.test_backend_c import build, run_c

    x = inputs()
    size = int(np.prod(SHAPE))
    got = run_c(build(softplus_model(), tmp_path / "cfloat", sanitize=False), x, size)
    np.testing.assert_allclose(got.reshape(x.shape), reference(x), **TOL)

    np.savez(tmp_path / "calib.npz", x=x)
    model, _ = qcc.compile(softplus_model(), tmp_path / "caffine", target="c", quantize="int8",
                           calib=str(tmp_path / "calib.npz"))
    got = run_c(build(model, tmp_path / "caffine_build", sanitize=False), x, size)
    want = run_affine_int(model, {"x": x})["act"]
    assert np.array_equal(got.reshape(x.shape).view(np.uint32), want.view(np.uint32))
    assert np.max(np.abs(got.reshape(x.shape) - reference(x))) <= quantization_error(model)


def test_targets_without_softplus_fail_in_one_line(tmp_path: Path) -> None:
    x = inputs()
    np.savez(tmp_path / "calib.npz", x=x)
    with pytest.raises(UnsupportedError) as nnb:
        qcc.compile(softplus_model(), tmp_path / "m.nnb")
    assert "Softplus ('act')" in str(nnb.value) and "nnb" in str(nnb.value) and "\n" not in str(nnb.value)
    with pytest.raises(UnsupportedError) as fixed:
        qcc.compile(softplus_model(), tmp_path / "cfixed", target="c", quantize="fixed8",
                    calib=str(tmp_path / "calib.npz"))
    assert "op Softplus (node 'act')" in str(fixed.value) and "fixed" in str(fixed.value)
    assert not (tmp_path / "m.nnb").exists() and not (tmp_path / "cfixed").exists()
