"""Resize (issue 17): nearest and linear with the coordinate modes PyTorch, Paddle and TF exports
use, from scales or sizes, read from ONNX (Resize, Upsample), torch (interpolate) and .nnp
(Interpolate), written to ONNX, QDQ, .nnp, .nnb (Unpooling) and C (float, fixed, affine)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import qcc
from qcc.errors import UnsupportedError
from qcc.ir import Graph, Model, TensorType
from tests.op_check import check_c, check_onnx, check_qdq, needs_gcc, onnx_model

SHAPE = (2, 3, 6, 5)
COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]


def feeds(n: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((n, *SHAPE[1:])).astype(np.float32)}


def resize_proto(mode: str, coordinates: str, nearest: str, scales: list[float] | None,
                 sizes: list[int] | None = None) -> bytes:
    inputs = ["x", "", "scales" if scales else "", "sizes" if sizes else ""]
    inits = {"scales": np.array(scales, np.float32)} if scales else {"sizes": np.array(sizes, np.int64)}
    node = helper.make_node("Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode=coordinates,
                            nearest_mode=nearest)
    return onnx_model([node], {"x": SHAPE}, {"y": None}, inits, opset=13)


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode,nearest", [("nearest", "round_prefer_floor"), ("nearest", "round_prefer_ceil"),
                                          ("nearest", "floor"), ("nearest", "ceil"), ("linear", "floor")])
def test_onnx_resize_matches_onnxruntime(tmp_path: Path, coordinates: str, mode: str, nearest: str) -> None:
    if coordinates == "tf_half_pixel_for_nn" and mode == "linear":
        pytest.skip("tf_half_pixel_for_nn is a nearest mode")
    for i, (scales, sizes) in enumerate([([1, 1, 2, 2], None), ([1, 1, 1.5, 0.6], None), (None, [2, 3, 11, 4])]):
        (tmp_path / str(i)).mkdir()
        model = check_onnx(tmp_path / str(i), resize_proto(mode, coordinates, nearest, scales, sizes), feeds())
        assert [n.op for n in model.graph.nodes] == ["Resize"]


def test_upsample_and_opset_10_resize(tmp_path: Path) -> None:
    """Opset < 11: asymmetric coordinates; ONNX Runtime floors when upsampling."""
    up = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    check_onnx(tmp_path, onnx_model([up], {"x": SHAPE}, {"y": None}, {"scales": np.array([1, 1, 2, 3], np.float32)},
                                    opset=9), feeds())
    old = helper.make_node("Resize", ["x", "scales"], ["y"], mode="linear")
    (tmp_path / "10").mkdir()
    check_onnx(tmp_path / "10", onnx_model([old], {"x": SHAPE}, {"y": None},
                                           {"scales": np.array([1, 1, 2, 1.5], np.float32)}, opset=10), feeds())


def test_unsupported_resize_is_one_line(tmp_path: Path) -> None:
    cubic = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="cubic")
    path = tmp_path / "cubic.onnx"
    path.write_bytes(onnx_model([cubic], {"x": SHAPE}, {"y": None}, {"scales": np.array([1, 1, 2, 2], np.float32)}))
    with pytest.raises(UnsupportedError, match=r"node 'up' \(Resize\): mode 'cubic'") as exc:
        qcc.load(path)
    assert "\n" not in str(exc.value)


def test_torch_interpolate() -> None:
    torch = pytest.importorskip("torch")
    f = torch.nn.functional

    class Net(torch.nn.Module):
        def forward(self, x: object) -> object:
            return (f.interpolate(x, scale_factor=2, mode="nearest"), f.interpolate(x, size=(9, 7), mode="bilinear"),
                    f.interpolate(x, scale_factor=3, mode="bilinear", align_corners=True),
                    f.interpolate(x, size=(4, 3), mode="nearest-exact"), f.interpolate(x, size=(1, 1), mode="bilinear"))

    x = torch.from_numpy(feeds()["x"])
    model = qcc.load(Net(), example_inputs=x)
    assert {n.op for n in model.graph.nodes} == {"Resize"}
    got = qcc.run(model, {model.graph.inputs[0].name: x.numpy()})
    for want, value in zip(Net()(x), model.graph.outputs):
        np.testing.assert_allclose(got[value.name], want.numpy(), rtol=0, atol=2e-6)


def test_nnabla_interpolate(tmp_path: Path) -> None:
    nn = pytest.importorskip("nnabla")
    import nnabla.functions as F

    from tests.nnabla_zoo import _save, nnabla_run

    x = feeds(1)["x"]
    for mode, align, half, half_nn in [("linear", False, True, False), ("linear", True, False, False),
                                       ("nearest", False, False, False), ("nearest", False, False, True)]:
        nn.clear_parameters()
        v = nn.Variable(x.shape)
        _save(tmp_path / "m.nnp", v, F.interpolate(v, output_size=(9, 13), mode=mode, align_corners=align,
                                                    half_pixel=half, half_pixel_for_nn=half_nn))
        want, functions = nnabla_run(tmp_path / "m.nnp", x)
        model = qcc.load(tmp_path / "m.nnp")
        assert functions == ["Interpolate"] and [n.op for n in model.graph.nodes] == ["Resize"]
        np.testing.assert_allclose(qcc.run(model, {"x": x})["y"], want, rtol=0, atol=2e-6)
        qcc.compile(tmp_path / "m.nnp", tmp_path / "copy.nnp")
        again, functions = nnabla_run(tmp_path / "copy.nnp", x)
        assert functions == ["Interpolate"] and np.array_equal(again, want)


def two_resizes() -> Model:
    g = Graph("resize")
    x = g.add_input("x", TensorType("float32", ("N", *SHAPE[1:])))
    up = g.add("Resize", x, sizes=[0, 3, 12, 10], scales=[1, 1, 2, 2], mode="linear", name="linear")
    g.outputs = [g.add("Resize", up, sizes=[0, 3, 7, 23], scales=[1, 1, 7 / 12, 2.3], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor", name="nearest")]
    return Model(g)


def test_qdq_resize_runs_on_integers_in_onnxruntime(tmp_path: Path) -> None:
    from tests import ort_quant

    check_qdq(tmp_path, two_resizes(), feeds(8))
    assert dict(ort_quant.float_ops(tmp_path / "q.onnx")) == {}


@needs_gcc
def test_c_float_and_affine(tmp_path: Path) -> None:
    compiled = check_c(tmp_path, two_resizes, feeds(4))
    islands = compiled.metadata["test.report"]["c"]["float_islands"]
    assert [(i["node"], i["op"]) for i in islands] == [("linear", "Resize")]  # nearest moves integers


def upsample_x2(mode: str = "nearest") -> Model:
    g = Graph("up")
    x = g.add_input("x", TensorType("float32", (1, *SHAPE[1:])))
    g.outputs = [g.add("Resize", x, sizes=[1, 3, 12, 10], scales=[1, 1, 2, 2], mode=mode, name="up",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    return Model(g)


def test_nnb_unpooling_and_c_fixed(tmp_path: Path) -> None:
    """Nearest by whole factors is nnabla-c-runtime's Unpooling (the emulation of the file is
    exact); linear is refused by .nnb and C fixed point in one line."""
    from qcc.backends.nnb.format import read_nnb
    from qcc.backends.nnb.lift import lift_nnb

    from qcc.sim.fixed import FixedRunner

    x = feeds(1)["x"]
    np.savez(tmp_path / "calib.npz", x=x)
    model, _ = qcc.compile(upsample_x2(), tmp_path / "up.nnb", quantize="fixed8", calib=str(tmp_path / "calib.npz"))
    lifted = lift_nnb(read_nnb((tmp_path / "up.nnb").read_bytes(), "up.nnb"))
    assert [n.op for n in lifted.graph.nodes] == ["Resize"]
    want = FixedRunner(model).run_stored({"x": x})["up"]
    assert np.array_equal(FixedRunner(lifted).run_stored({lifted.graph.inputs[0].name: x})[lifted.graph.outputs[0].name],
                          want)
    for target, out in (("nnb", tmp_path / "lin.nnb"), ("c", tmp_path / "lin_c")):
        with pytest.raises(UnsupportedError) as exc:
            qcc.compile(upsample_x2("linear"), out, target=target, quantize="fixed8", calib=str(tmp_path / "calib.npz"))
        assert "Resize" in str(exc.value) and "'up'" in str(exc.value) and "\n" not in str(exc.value)
        assert not out.exists()
