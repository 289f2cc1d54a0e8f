"""PRelu, Mish, the SiLU/Swish and hard-swish patterns fused at import, and HardSwish and LRN in
.nnb (issue 17): ONNX, torch and .nnp in; ONNX, QDQ, .nnp, .nnb and C out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import qcc
from qcc.ir import Graph, Model, TensorType
from tests.op_check import check_c, check_onnx, check_qdq, check_torch, needs_gcc, onnx_model

SHAPE = (2, 4, 5, 6)


def feeds(n: int = 2) -> dict[str, np.ndarray]:
    x = np.random.default_rng(11).uniform(-6, 6, (n, *SHAPE[1:])).astype(np.float32)
    return {"x": x}


def test_onnx_prelu_and_mish(tmp_path: Path) -> None:
    slope = np.array([0.1, -0.5, 2.0, 0.0], np.float32).reshape(4, 1, 1)
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["p"]), helper.make_node("Mish", ["p"], ["y"])]
    model = check_onnx(tmp_path, onnx_model(nodes, {"x": SHAPE}, {"y": None}, {"slope": slope}), feeds())
    assert [n.op for n in model.graph.nodes] == ["PRelu", "Mish"]


@pytest.mark.parametrize("pattern", ["silu", "silu_swapped", "hardsigmoid"])
def test_gated_activations_are_fused(tmp_path: Path, pattern: str) -> None:
    """x * sigmoid(x) -> Silu; x * hardsigmoid(x) (alpha 1/6, beta 1/2) -> HardSwish."""
    make = helper.make_node
    body = {
        "silu": [make("Sigmoid", ["x"], ["g"]), make("Mul", ["x", "g"], ["y"])],
        "silu_swapped": [make("Sigmoid", ["x"], ["g"]), make("Mul", ["g", "x"], ["y"])],
        "hardsigmoid": [make("HardSigmoid", ["x"], ["g"], alpha=1 / 6, beta=0.5), make("Mul", ["x", "g"], ["y"])],
    }[pattern]
    model = check_onnx(tmp_path, onnx_model(body, {"x": SHAPE}, {"y": None}, opset=13), feeds(), rtol=1e-6)
    assert [n.op for n in model.graph.nodes] == ["Silu" if pattern.startswith("silu") else "HardSwish"]


def test_a_gate_read_elsewhere_is_not_fused(tmp_path: Path) -> None:
    nodes = [helper.make_node("Sigmoid", ["x"], ["g"]), helper.make_node("Mul", ["x", "g"], ["y"])]
    path = tmp_path / "m.onnx"
    path.write_bytes(onnx_model(nodes, {"x": SHAPE}, {"y": None, "g": None}))
    assert [n.op for n in qcc.load(path).graph.nodes] == ["Sigmoid", "Mul"]


def test_torch_prelu_mish_silu_hardswish() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.prelu = torch.nn.PReLU(4)
            torch.nn.init.uniform_(self.prelu.weight, -1, 1)

        def forward(self, x: object) -> object:
            f = torch.nn.functional
            return f.hardswish(f.silu(f.mish(self.prelu(x))))

    check_torch(Net().eval(), torch.from_numpy(feeds()["x"]), ["PRelu", "Mish", "Silu", "HardSwish"], atol=2e-6)


def test_nnabla_prelu_mish_swish(tmp_path: Path) -> None:
    nn = pytest.importorskip("nnabla")
    import nnabla.functions as F
    import nnabla.parametric_functions as PF

    from tests.nnabla_zoo import _save, nnabla_run

    nn.clear_parameters()
    v = nn.Variable((1, *SHAPE[1:]))
    h = F.mish(PF.prelu(v, name="p", shared=False))
    nn.get_parameters()["p/prelu/slope"].d = np.array([0.1, -0.5, 2.0, 0.0])
    _save(tmp_path / "m.nnp", v, F.mul2(h, F.sigmoid(h)))
    x = feeds(1)["x"]
    want, functions = nnabla_run(tmp_path / "m.nnp", x)
    assert functions == ["PReLU", "Mish", "Sigmoid", "Mul2"]
    model = qcc.load(tmp_path / "m.nnp")
    assert [n.op for n in model.graph.nodes] == ["PRelu", "Mish", "Silu"]
    np.testing.assert_allclose(qcc.run(model, {"x": x})["y"], want, rtol=0, atol=2e-6)
    qcc.compile(tmp_path / "m.nnp", tmp_path / "copy.nnp")
    again, copied = nnabla_run(tmp_path / "copy.nnp", x)
    assert copied == ["PReLU", "Mish", "Swish"]
    np.testing.assert_allclose(again, want, rtol=0, atol=2e-6)


def activations() -> Model:
    g = Graph("act")
    x = g.add_input("x", TensorType("float32", ("N", *SHAPE[1:])))
    slope = g.add_constant("slope", np.array([0.1, -0.5, 2.0, 0.0], np.float32).reshape(4, 1, 1))
    h = g.add("PRelu", x, slope, name="prelu")
    g.outputs = [g.add("Mish", h, name="mish")]
    return Model(g)


def test_qdq(tmp_path: Path) -> None:
    check_qdq(tmp_path, activations(), feeds(8))


@needs_gcc
def test_c_float_and_affine(tmp_path: Path) -> None:
    """Affine PRelu is an integer kernel (signed multiplier per slope), Mish a lookup table."""
    compiled = check_c(tmp_path, activations, feeds(4))
    assert "c" not in compiled.metadata["test.report"]


def nnb_only(op: str) -> Model:
    g = Graph(op.lower())
    x = g.add_input("x", TensorType("float32", (1, *SHAPE[1:])))
    attrs = {"size": 3, "alpha": 0.02, "beta": 0.75, "bias": 1.5} if op == "LRN" else \
        {"alpha": 1 / 6, "beta": 0.5} if op == "HardSigmoid" else {}  # Paddle's and torch's, not nnabla's 0.2
    slope = [g.add_constant("slope", np.array([0.1, -0.5, 2.0, 0.0], np.float32).reshape(4, 1, 1))] if op == "PRelu" \
        else []
    g.outputs = [g.add(op, x, *slope, name=op.lower(), **attrs)]
    return Model(g)


@pytest.mark.parametrize("op", ["HardSwish", "HardSigmoid", "LRN", "PRelu"])
@pytest.mark.parametrize("scheme", ["none", "fixed8"])
def test_nnb_file_computes_what_the_model_does(tmp_path: Path, op: str, scheme: str) -> None:
    """HardSwish, HardSigmoid and LRN become functions nnabla-c-runtime has (in float32 between the node's
    input and output), PRelu its PReLU: the emulation of the file equals the simulation."""
    from qcc.backends.nnb.format import read_nnb
    from qcc.backends.nnb.lift import lift_nnb

    from qcc.sim.fixed import FixedRunner

    x = feeds(1)["x"]
    np.savez(tmp_path / "calib.npz", **feeds(4))
    model, _ = qcc.compile(nnb_only(op), tmp_path / "m.nnb", quantize=scheme,
                           calib=str(tmp_path / "calib.npz") if scheme != "none" else None)
    lifted = lift_nnb(read_nnb((tmp_path / "m.nnb").read_bytes(), "m.nnb"))
    want = FixedRunner(model).run_stored({"x": x})[model.graph.outputs[0].name]
    got = FixedRunner(lifted).run_stored({lifted.graph.inputs[0].name: x})[lifted.graph.outputs[0].name]
    assert np.array_equal(got, want)
    if scheme == "none":
        reference = qcc.run(nnb_only(op), {"x": x})[model.graph.outputs[0].name]
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)


@needs_gcc
@pytest.mark.parametrize("op", ["HardSwish", "PRelu"])
def test_c_fixed_point(tmp_path: Path, op: str) -> None:
    """Both compute in float32 between the runtime's getter and setter (its generic path; PRelu
    is nnabla-c-runtime's PReLU), bit for bit what qcc.sim.fixed computes."""
    from qcc.sim.fixed import run_fixed
    from tests.op_check import c_outputs, rows

    x = feeds(4)
    np.savez(tmp_path / "calib.npz", **x)
    model, _ = qcc.compile(nnb_only(op), tmp_path / "c", target="c", quantize="fixed8",
                           calib=str(tmp_path / "calib.npz"))
    model.graph.inputs[0].type = TensorType("float32", ("N", *SHAPE[1:]))
    got = c_outputs(model, x, tmp_path / "build")
    assert np.array_equal(got, rows(run_fixed(model, x), model, 4))
