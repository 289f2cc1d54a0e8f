"""LayerNorm, GroupNorm and InstanceNorm (issue 17): from ONNX (LayerNormalization 17,
GroupNormalization 18, InstanceNormalization), torch and .nnp; written to ONNX, QDQ, .nnp and C
(float; affine int8 as float islands, each a report line); .nnb and C fixed point refuse them
in one line (nnabla-c-runtime has no such function)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import qcc
from qcc.errors import UnsupportedError
from qcc.ir import Graph, Model, TensorType
from tests.op_check import check_c, check_onnx, check_qdq, check_torch, needs_gcc, onnx_model

SHAPE = (2, 8, 6, 5)
RNG = np.random.default_rng(7)


def feeds(n: int = 2) -> dict[str, np.ndarray]:
    return {"x": (np.random.default_rng(1).standard_normal((n, *SHAPE[1:])) * 3 + 1).astype(np.float32)}


def params(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.5 + 1).astype(np.float32)


@pytest.mark.parametrize("op,attrs,shapes,opset", [
    ("LayerNormalization", {"axis": -1}, [(5,), (5,)], 17),
    ("LayerNormalization", {"axis": 1, "epsilon": 1e-3}, [(8, 6, 5), (8, 6, 5)], 17),
    ("LayerNormalization", {"axis": 2}, [(6, 5)], 17),
    ("InstanceNormalization", {"epsilon": 1e-4}, [(8,), (8,)], 13),
    ("GroupNormalization", {"num_groups": 4}, [(4,), (4,)], 18),
])
def test_onnx_normalizations_match_onnxruntime(tmp_path: Path, op: str, attrs: dict, shapes: list, opset: int) -> None:
    names = ["s", "b"][:len(shapes)]
    node = helper.make_node(op, ["x", *names], ["y"], **attrs)
    inits = {n: params(*s) for n, s in zip(names, shapes)}
    model = check_onnx(tmp_path, onnx_model([node], {"x": SHAPE}, {"y": None}, inits, opset), feeds(), rtol=32e-7)
    assert len(model.graph.nodes) == 1


def test_torch_normalizations() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln, self.gn = torch.nn.LayerNorm([6, 5]), torch.nn.GroupNorm(2, 8)
            self.inorm = torch.nn.InstanceNorm2d(8, affine=True)
            for p in self.parameters():
                torch.nn.init.normal_(p, 1.0, 0.3)

        def forward(self, x: object) -> object:
            return self.inorm(self.gn(self.ln(x)))

    check_torch(Net().eval(), torch.from_numpy(feeds()["x"]), ["LayerNorm", "GroupNorm", "InstanceNorm"], atol=1e-5)


def test_nnabla_normalizations(tmp_path: Path) -> None:
    nn = pytest.importorskip("nnabla")
    import nnabla.parametric_functions as PF

    from tests.nnabla_zoo import _save, nnabla_run

    nn.clear_parameters()
    v = nn.Variable((1, *SHAPE[1:]))
    h = PF.group_normalization(PF.instance_normalization(PF.layer_normalization(v, name="ln"), name="in"),
                               num_groups=4, name="gn")
    for p in nn.get_parameters().values():
        p.d = np.random.default_rng(2).standard_normal(p.shape) * 0.3 + 1
    _save(tmp_path / "m.nnp", v, h)
    x = feeds(1)["x"]
    want, functions = nnabla_run(tmp_path / "m.nnp", x)
    model = qcc.load(tmp_path / "m.nnp")
    assert [n.op for n in model.graph.nodes] == ["LayerNorm", "InstanceNorm", "GroupNorm"]
    np.testing.assert_allclose(qcc.run(model, {"x": x})["y"], want, rtol=0, atol=2e-5)
    qcc.compile(tmp_path / "m.nnp", tmp_path / "copy.nnp")
    again, copied = nnabla_run(tmp_path / "copy.nnp", x)
    assert copied == functions and np.array_equal(again, want)


def norms() -> Model:
    rng = np.random.default_rng(4)
    g = Graph("norms")
    x = g.add_input("x", TensorType("float32", ("N", *SHAPE[1:])))

    def c(name: str, *shape: int) -> object:
        return g.add_constant(name, (rng.standard_normal(shape) * 0.3 + 1).astype(np.float32))

    h = g.add("LayerNorm", x, c("ls", 5), c("lb", 5), name="ln")
    h = g.add("GroupNorm", h, c("gs", 8), c("gb", 8), num_groups=2, name="gn")
    g.outputs = [g.add("InstanceNorm", h, c("is", 8), c("ib", 8), epsilon=1e-3, name="inorm")]
    return Model(g)


def test_qdq(tmp_path: Path) -> None:
    compiled = check_qdq(tmp_path, norms(), feeds(8))
    assert all(v.quant is not None for v in compiled.graph.outputs)


@needs_gcc
def test_c_float_and_affine_islands(tmp_path: Path) -> None:
    compiled = check_c(tmp_path, norms, feeds(4))
    islands = compiled.metadata["test.report"]["c"]["float_islands"]
    assert [i["node"] for i in islands] == ["ln", "gn", "inorm"]
    assert all("float32 between affine tensors" in i["reason"] for i in islands)


def test_targets_without_them_fail_in_one_line(tmp_path: Path) -> None:
    np.savez(tmp_path / "calib.npz", **feeds())
    with pytest.raises(UnsupportedError) as nnb:
        qcc.compile(norms(), tmp_path / "m.nnb")
    assert "LayerNorm ('ln')" in str(nnb.value) and "nnb" in str(nnb.value) and "\n" not in str(nnb.value)
    with pytest.raises(UnsupportedError) as fixed:
        qcc.compile(norms(), tmp_path / "cfixed", target="c", quantize="fixed8", calib=str(tmp_path / "calib.npz"))
    assert "op LayerNorm (node 'ln')" in str(fixed.value) and "fixed" in str(fixed.value)
