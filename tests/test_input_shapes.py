"""Issue 17 item 1: input shapes from the user bind dynamic dims before anything else runs.

Models with dynamic dims are built here (ONNX with a symbolic batch and height and a -1 width,
torch.export with dynamic shapes, an .nnp with nnabla's -1 batch); onnxruntime, torch and the
gcc-built C program are the oracles.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import qcc
from qcc.errors import UsageError
from qcc.frontends.input_shapes import bind_inputs, parse_input_shape, parse_input_shapes
from tests.cli_util import one_error_line
from tests.cli_util import qcc as run_qcc
from tests.onnx_zoo import ort_run


def dynamic_onnx(path: Path) -> Path:
    """x[batch, 3, height, -1] -> Conv; a ramp from Shape/Range/Expand, a ConstantOfShape factor, and
    Shape -> Gather -> Unsqueeze -> Concat -> Reshape to [batch, -1]: only folds once dims are bound."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "i0": np.array(0, np.int64),
              "i2": np.array(2, np.int64), "i3": np.array(3, np.int64), "ax0": np.array([0], np.int64),
              "m1": np.array([-1], np.int64), "one": np.array([1], np.int64), "z": np.array(0.0, np.float32),
              "d": np.array(0.25, np.float32)}
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i3"], ["wd"], axis=0),
        h.make_node("Cast", ["wd"], ["wf"], to=T.FLOAT),
        h.make_node("Mul", ["wf", "d"], ["wlim"]),
        h.make_node("Range", ["z", "wlim", "d"], ["ramp"]),
        h.make_node("Expand", ["ramp", "s"], ["ramp4"]),
        h.make_node("Add", ["x", "ramp4"], ["xr"]),
        h.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        h.make_node("Gather", ["s", "i2"], ["hd"], axis=0),
        h.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        h.make_node("Unsqueeze", ["hd", "ax0"], ["hu"]),
        h.make_node("Unsqueeze", ["wd", "ax0"], ["wu"]),
        h.make_node("Concat", ["bu", "one", "hu", "wu"], ["fshape"], axis=0),
        h.make_node("ConstantOfShape", ["fshape"], ["half"],
                    value=nh.from_array(np.array([0.5], np.float32))),
        h.make_node("Mul", ["xr", "half"], ["xs"]),
        h.make_node("Conv", ["xs", "w"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("Shape", ["r"], ["rs"]),
        h.make_node("Gather", ["rs", "i0"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "ax0"], ["nu"]),
        h.make_node("Concat", ["nu", "m1"], ["shp"], axis=0),
        h.make_node("Reshape", ["r", "shp"], ["y"]),
    ]
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", 3, "height", 1])
    x.type.tensor_type.shape.dim[3].Clear()
    x.type.tensor_type.shape.dim[3].dim_value = -1  # how paddle2onnx and others write a dynamic dim
    graph = h.make_graph(nodes, "dyn", [x], [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [nh.from_array(v, k) for k, v in consts.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dynamic_onnx(tmp_path_factory.mktemp("shapes") / "dyn.onnx")


def test_parse_flag_forms() -> None:
    assert parse_input_shape("x=1,3,224,224") == ("x", (1, 3, 224, 224))
    assert parse_input_shape("1,3,32,32") == (None, (1, 3, 32, 32))
    assert parse_input_shape("input:0=2,8") == ("input:0", (2, 8))
    assert parse_input_shapes(["a=1,2", "b=3"]) == {"a": (1, 2), "b": (3,)}
    for bad in ("x=1,a", "x=", "=1,2", "x=0,3", "x=-1,3"):
        with pytest.raises(UsageError, match="--input-shape"):
            parse_input_shape(bad)
    with pytest.raises(UsageError, match="twice"):
        parse_input_shapes(["a=1", "a=2"])


def test_binding_rules() -> None:
    declared = {"x": ("N", 3, "H", "W"), "y": ("N", 10)}
    bound = bind_inputs(declared, {"x": (2, 3, 8, 9)})
    assert bound.shapes == {"x": (2, 3, 8, 9), "y": (2, 10)}  # the shared batch symbol follows
    assert bind_inputs(declared, None, batch_size=4).shapes == {"x": (4, 3, "H", "W"), "y": (4, 10)}
    with pytest.raises(UsageError, match=r"dim 1 of input 'x' is static 3"):
        bind_inputs(declared, {"x": (2, 4, 8, 9)})
    with pytest.raises(UsageError, match=r"rank 4"):
        bind_inputs(declared, {"x": (2, 3, 8)})
    with pytest.raises(UsageError, match=r"'z', which is not an input.*\['x', 'y'\]"):
        bind_inputs(declared, {"z": (1,)})
    with pytest.raises(UsageError, match="one-input model"):
        bind_inputs(declared, {None: (2, 3, 8, 9)})
    with pytest.raises(UsageError, match=r"symbol 'N', already bound to 2"):
        bind_inputs(declared, {"x": (2, 3, 8, 9), "y": (3, 10)})


def test_bound_onnx_folds_shape_chains_and_matches_onnxruntime(dyn: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(1).normal(size=(2, 3, 5, 7)).astype(np.float32)
    model = qcc.load(dyn, input_shapes={"x": x.shape})
    assert model.graph.inputs[0].type.shape == (2, 3, 5, 7)
    ops = {n.op for n in model.graph.nodes}
    assert ops.isdisjoint({"Shape", "Gather", "Range", "Expand", "ConstantOfShape"}), ops  # folded to constants
    assert model.graph.outputs[0].type.shape == (2, 4 * 5 * 7)
    (want,) = ort_run(str(dyn), {"x": x})
    got = qcc.run(model, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_cli_input_shape_compiles_to_c_matching_onnxruntime(dyn: Path, tmp_path: Path) -> None:
    from tests.test_backend_c import assert_close_to, build, run_c

    proc = run_qcc("compile", str(dyn), "-o", str(tmp_path / "dyn_c"), "--input-shape", "1,3,6,10")
    assert proc.returncode == 0, proc.stderr
    model = qcc.load(dyn, input_shapes=["x=1,3,6,10"])
    exe = build(model, tmp_path / "dyn_b")
    xs = np.random.default_rng(2).normal(size=(3, 1, 3, 6, 10)).astype(np.float32)
    want = np.concatenate([ort_run(str(dyn), {"x": x})[0] for x in xs])
    got = run_c(exe, xs.reshape(3, -1), 4 * 6 * 10)
    assert_close_to(want, got)


def test_unbound_dynamic_dim_names_input_dim_and_flag(dyn: Path, tmp_path: Path) -> None:
    line = one_error_line(run_qcc("compile", str(dyn), "-o", str(tmp_path / "o.onnx"), "--batch-size", "1"))
    assert "dim 2 of input 'x' is dynamic ('height')" in line and "--input-shape x=1,3,HEIGHT," in line, line
    line = one_error_line(run_qcc("inspect", str(dyn), "--input-shape", "x=1,4,6,10"))
    assert line.startswith("qcc: usage error") and "dim 1 of input 'x' is static 3" in line, line
    proc = run_qcc("inspect", str(dyn), "--input-shape", "image=1,3,6,10")
    assert proc.returncode == 2 and "'image', which is not an input" in one_error_line(proc)


def test_batch_size_and_input_shape_are_one_mechanism(dyn: Path) -> None:
    by_batch = qcc.load(dyn, batch_size=3, input_shapes={"x": (3, 3, 4, 4)})
    assert by_batch.graph.inputs[0].type.shape == (3, 3, 4, 4)
    with pytest.raises(UsageError, match="input_shapes binds the inputs of a model qcc loads"):
        qcc.compile(by_batch, "/nonexistent/out.onnx", input_shapes={"x": (1, 3, 4, 4)})


def test_nnp_input_shape_binds_nnablas_batch_like_batch_size(tmp_path: Path) -> None:
    pytest.importorskip("nnabla")
    from tests.nnabla_zoo import save_digits_mlp

    path = tmp_path / "mlp.nnp"
    save_digits_mlp(path, iterations=1)
    by_shape = qcc.load(path, input_shapes=[f"{qcc.load(path).graph.inputs[0].name}=5,64"])
    by_batch = qcc.load(path, batch_size=5)
    assert [v.type.shape for v in by_shape.graph.values()] == [v.type.shape for v in by_batch.graph.values()]
    assert by_shape.graph.outputs[0].type.shape == (5, 10)
    with pytest.raises(UsageError, match="static 64"):
        qcc.load(path, input_shapes={None: (5, 63)})


def test_torch_dynamic_program_is_specialized_to_the_bound_shapes() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x))
            return y.reshape(x.shape[0], -1)

    torch.manual_seed(0)
    net = Net().eval()
    dims = {0: torch.export.Dim("b", max=16), 2: torch.export.Dim("h", min=2, max=64)}
    program = torch.export.export(net, (torch.zeros(2, 3, 8, 8),), dynamic_shapes={"x": dims})
    x = torch.randn(3, 3, 6, 8)
    model = qcc.load(program, input_shapes={"x": tuple(x.shape)})
    assert model.graph.inputs[0].type.shape == (3, 3, 6, 8)
    got = qcc.run(model, {"x": x.numpy()})[model.graph.outputs[0].name]
    want = net(x).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


# ----------------------------------------------------------------------------- issue 16's rule
def static_onnx(path: Path) -> Path:
    """y = Relu(x) with x[1, 4] fully static: nothing for --input-shape to bind."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "static", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def test_input_shape_on_an_input_without_dynamic_dims_is_a_usage_error(tmp_path: Path) -> None:
    path = static_onnx(tmp_path / "static.onnx")
    line = one_error_line(run_qcc("compile", str(path), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x=1,4"))
    assert line.startswith("qcc: usage error") and "input 'x' has no dynamic dim (declared [1,4])" in line, line
    assert not (tmp_path / "o.onnx").exists()
    with pytest.raises(UsageError, match=r"input 'x' has no dynamic dim"):
        qcc.load(path, input_shapes=(1, 4))
    qcc.compile(path, tmp_path / "m.nnb")  # a decoded .nnb has no inputs to bind either
    line = one_error_line(run_qcc("inspect", str(tmp_path / "m.nnb"), "--input-shape", "x=1,4"))
    assert line.startswith("qcc: usage error") and "--input-shape applies to a model qcc imports" in line, line


def test_batch_size_on_a_static_batch_is_a_usage_error(tmp_path: Path) -> None:
    """--batch-size used to be ignored silently where the batch is static (issue 16's rule)."""
    path = static_onnx(tmp_path / "static.onnx")
    line = one_error_line(run_qcc("compile", str(path), "-o", str(tmp_path / "o.onnx"), "--batch-size", "4"))
    assert line.startswith("qcc: usage error") and "input 'x' has a static batch of 1" in line, line
    assert not (tmp_path / "o.onnx").exists()
    model = qcc.load(path, batch_size=1)  # the batch it has: nothing to change, nothing refused
    assert model.graph.inputs[0].type.shape == (1, 4)


def test_input_shapes_for_a_module_traced_on_example_inputs_is_a_usage_error() -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    with pytest.raises(UsageError, match=r"no dynamic dim \(declared \[1,3,8,8\]\)"):
        qcc.load(net, example_inputs=torch.zeros(1, 3, 8, 8), input_shapes={None: (1, 3, 8, 8)})


def test_a_frontend_that_does_not_read_input_shapes_refuses_them() -> None:
    from qcc.flags import check_load_flags

    class FixedShapes:  # a plugin frontend whose format has no dynamic dims
        name = "fixed"
        load_options = ("batch_size",)

    with pytest.raises(UsageError, match=r"--input-shape applies to .*\.onnx.* frontend 'fixed'"):
        check_load_flags(FixedShapes(), "m.fixed", {"input_shapes": {"x": (1, 4)}})
    check_load_flags(FixedShapes(), "m.fixed", {"input_shapes": None, "batch_size": 2})
