"""ArgMax, TopK, Gather (constant indices into a computed tensor), DepthToSpace/SpaceToDepth and
ReduceL2 (issue 17): ONNX and torch in; ONNX, QDQ, .nnb (DepthToSpace/SpaceToDepth as Reshape,
Transpose, Reshape) and C out. Element indices are int64 in the IR, int32 in C, never quantized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import qcc
from qcc.errors import UnsupportedError
from qcc.ir import Graph, Model, TensorType
from tests.op_check import check_c, check_onnx, check_qdq, needs_gcc, onnx_model

SHAPE = (2, 8, 6, 4)


def feeds(n: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(5).standard_normal((n, *SHAPE[1:])).astype(np.float32)}


def test_onnx_ops_match_onnxruntime(tmp_path: Path) -> None:
    make = helper.make_node
    nodes = [
        make("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0),
        make("ArgMax", ["x"], ["argmax_last"], axis=-1, select_last_index=1),
        make("TopK", ["x", "k"], ["top_values", "top_indices"], axis=1, largest=0),
        make("Gather", ["x", "rows"], ["gathered"], axis=2),
        make("Gather", ["x", "first"], ["first_channel"], axis=1),
        make("DepthToSpace", ["x"], ["d2s"], blocksize=2, mode="DCR"),
        make("DepthToSpace", ["x"], ["d2s_crd"], blocksize=2, mode="CRD"),
        make("SpaceToDepth", ["x"], ["s2d"], blocksize=2),
        make("ReduceL2", ["x", "axes"], ["l2"], keepdims=0),
    ]
    outputs = {"argmax": TensorProto.INT64, "argmax_last": TensorProto.INT64, "top_values": None,
               "top_indices": TensorProto.INT64, "gathered": None, "first_channel": None, "d2s": None, "d2s_crd": None,
               "s2d": None, "l2": None}
    inits = {"k": np.array([3], np.int64), "rows": np.array([[0, -1], [2, 2]], np.int64),
             "first": np.array(0, np.int64), "axes": np.array([2, 3], np.int64)}
    model = check_onnx(tmp_path, onnx_model(nodes, {"x": SHAPE}, outputs, inits), feeds())
    assert {n.op for n in model.graph.nodes} == {"ArgMax", "TopK", "Gather", "DepthToSpace", "SpaceToDepth", "ReduceL2"}


def test_gather_with_computed_indices_is_refused(tmp_path: Path) -> None:
    node = helper.make_node("Gather", ["x", "i"], ["y"], name="lookup")
    path = tmp_path / "g.onnx"
    proto = onnx_model([node], {"x": SHAPE}, {"y": None})
    from onnx import load_from_string

    m = load_from_string(proto)
    m.graph.input.append(helper.make_tensor_value_info("i", TensorProto.INT64, [2]))
    path.write_bytes(m.SerializeToString())
    with pytest.raises(UnsupportedError, match=r"node 'lookup' \(Gather\): indices computed at run time"):
        qcc.load(path)


def test_torch_ops() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def forward(self, x: object) -> object:
            values, indices = torch.topk(x, 2, dim=1)
            return (torch.argmax(x, dim=1), values, indices, torch.linalg.vector_norm(x, dim=(2, 3)),
                    torch.nn.functional.pixel_shuffle(x, 2), torch.index_select(x, 1, torch.tensor([3, 0])))

    x = torch.from_numpy(feeds()["x"])
    model = qcc.load(Net(), example_inputs=x)
    got = qcc.run(model, {model.graph.inputs[0].name: x.numpy()})
    for want, value in zip(Net()(x), model.graph.outputs):
        np.testing.assert_allclose(got[value.name], want.numpy(), rtol=0, atol=1e-6)


def movers() -> Model:
    g = Graph("movers")
    x = g.add_input("x", TensorType("float32", ("N", *SHAPE[1:])))
    d2s = g.add("DepthToSpace", x, blocksize=2, mode="CRD", name="d2s")
    s2d = g.add("SpaceToDepth", d2s, blocksize=2, name="s2d")
    gathered = g.add("Gather", s2d, axis=1, indices=[7, 0, 3], indices_shape=[3], name="gather")
    top = g.add_node("TopK", [gathered], {"k": 2, "axis": 1}, name="topk")
    g.outputs = [*top.outputs, g.add("ArgMax", x, axis=1, keepdims=False, name="argmax"),
                 g.add("ReduceL2", x, axes=[2, 3], keepdims=True, name="l2")]
    return Model(g)


def test_qdq(tmp_path: Path) -> None:
    compiled = check_qdq(tmp_path, movers(), feeds(8))
    assert compiled.graph.outputs[1].quant is None and compiled.graph.outputs[1].type.dtype == "int64"


@needs_gcc
def test_c_float_and_affine(tmp_path: Path) -> None:
    """Indices come out of C as float values; in affine int8 every op but ReduceL2 moves or
    compares stored integers."""
    compiled = check_c(tmp_path, movers, feeds(4))
    islands = compiled.metadata["test.report"]["c"]["float_islands"]
    assert [i["op"] for i in islands] == ["ReduceL2"]


def test_nnb_depth_to_space_and_refusals(tmp_path: Path) -> None:
    from qcc.backends.nnb.format import read_nnb
    from qcc.backends.nnb.lift import lift_nnb

    from qcc.sim.fixed import FixedRunner

    g = Graph("d2s")
    x = g.add_input("x", TensorType("float32", (1, *SHAPE[1:])))
    g.outputs = [g.add("SpaceToDepth", g.add("DepthToSpace", x, blocksize=2, name="d2s"), blocksize=2, name="s2d")]
    feed = feeds(1)
    np.savez(tmp_path / "calib.npz", **feed)
    model, _ = qcc.compile(Model(g), tmp_path / "m.nnb", quantize="fixed8", calib=str(tmp_path / "calib.npz"))
    lifted = lift_nnb(read_nnb((tmp_path / "m.nnb").read_bytes(), "m.nnb"))
    assert [n.op for n in lifted.graph.nodes] == ["Reshape", "Transpose", "Reshape"] * 2
    assert np.array_equal(FixedRunner(lifted).run_stored({lifted.graph.inputs[0].name: feed["x"]})[lifted.graph.outputs[0].name],
                          FixedRunner(model).run_stored(feed)["s2d"])
    with pytest.raises(UnsupportedError) as exc:
        qcc.compile(movers(), tmp_path / "movers.nnb")
    assert "ArgMax ('argmax')" in str(exc.value) and "Gather ('gather')" in str(exc.value)
    assert "nnb" in str(exc.value) and "\n" not in str(exc.value)
