"""Issue 17 (silero-vad): an input whose batch is not on axis 0 (a recurrent state (layers, batch,
hidden)) is calibrated and evaluated from data that holds its samples on that axis, or stacks
whole inputs on a new leading axis (qcc.ir.samples). The ranges equal those calibrated one
sample at a time; the C int8 code is bit-exact with qcc.sim.affine_int; bad data is one line
naming the input and the axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qcc
from qcc.errors import InvalidInputError, UsageError
from tests.cli_util import one_error_line
from tests.cli_util import qcc as qcc_cli

HIDDEN, LAYERS, N = 8, 2, 12


def state_model(path: Path, batch: int = 1, layers: int = LAYERS) -> Path:
    """y = Relu(Gemm(Concat(x, state as (batch, layers * hidden)))), state_n = state / 2: the state
    (layers, batch, hidden) keeps its batch on axis 1, as an ONNX GRU/LSTM state does."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((HIDDEN + layers * HIDDEN, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([batch, layers * HIDDEN], np.int64), "shape"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Transpose", ["state"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "shape"], ["flat"]),
             helper.make_node("Concat", ["x", "flat"], ["joined"], axis=1),
             helper.make_node("Gemm", ["joined", "W", "b"], ["g"]),
             helper.make_node("Relu", ["g"], ["y"]),
             helper.make_node("Mul", ["state", "half"], ["state_n"])]
    graph = helper.make_graph(
        nodes, "state", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, HIDDEN]),
                         helper.make_tensor_value_info("state", TensorProto.FLOAT, [layers, batch, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("state_n", TensorProto.FLOAT, [layers, batch, HIDDEN])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    onnx.save(proto, path)
    return path


def data(layers: int = LAYERS) -> tuple[np.ndarray, np.ndarray]:
    """N samples: x (N, hidden), the state with its samples on axis 1 (layers, N, hidden)."""
    rng = np.random.default_rng(1)
    return (rng.standard_normal((N, HIDDEN)).astype(np.float32),
            (2.0 * rng.standard_normal((layers, N, HIDDEN))).astype(np.float32))


def ranges(model: qcc.Model) -> dict[str, str]:
    return {v.name: str(v.quant) for v in model.graph.values() if v.quant is not None}


def test_state_on_axis_1_calibrates_as_one_sample_at_a_time(tmp_path: Path) -> None:
    path = state_model(tmp_path / "m.onnx")
    x, state = data()
    one_at_a_time = [{"x": x[i:i + 1], "state": state[:, i:i + 1]} for i in range(N)]
    want = ranges(qcc.compile(path, tmp_path / "one.onnx", quantize="int8", calib=one_at_a_time)[0])
    assert "state" in want and "y" in want
    on_axis = {"x": x, "state": state}
    stacked = {"x": x[:, None], "state": np.moveaxis(state, 1, 0)[:, :, None]}  # (N, *input shape)
    for name, arrays in (("axis", on_axis), ("stacked", stacked)):
        np.savez(tmp_path / f"{name}.npz", **arrays)
        compiled, _ = qcc.compile(path, tmp_path / f"{name}.onnx", quantize="int8", calib=str(tmp_path / f"{name}.npz"),
                                  eval=str(tmp_path / f"{name}.npz"))
        assert ranges(compiled) == want, name
    # the QDQ file runs in onnxruntime on each sample, within a few int8 steps of the float model
    import onnxruntime as ort

    q = ort.InferenceSession(str(tmp_path / "axis.onnx"), providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = max(float(s) for s in _scales(compiled, "y"))
    for feed in one_at_a_time:
        assert np.abs(q.run(["y"], feed)[0] - f.run(["y"], feed)[0]).max() < 8 * step


def _scales(model: qcc.Model, name: str) -> list[float]:
    value = next(v for v in model.graph.values() if v.name == name)
    assert value.quant is not None
    return [float(s) for s in np.ravel(value.quant.scale)]


def test_bound_batch_keeps_the_state_on_its_batch_axis(tmp_path: Path) -> None:
    """A batch of 4 bound on both inputs: the state's samples axis is the one holding that batch
    (axis 1), and calibration in batches of 4 gives the ranges of one sample at a time."""
    path = state_model(tmp_path / "m.onnx", batch=4)
    x, state = data()
    compiled, _ = qcc.compile(path, tmp_path / "b.onnx", quantize="int8", calib={"x": x, "state": state})
    by_sample = [{"x": x[i:i + 1], "state": state[:, i:i + 1]} for i in range(N)]
    again, _ = qcc.compile(path, tmp_path / "s.onnx", quantize="int8", calib=by_sample)
    assert ranges(compiled) == ranges(again)


def test_c_int8_is_bit_exact_with_the_affine_simulator(tmp_path: Path) -> None:
    from qcc.sim.affine_int import run_affine_int
    from tests.test_backend_c import build, run_c

    path = state_model(tmp_path / "m.onnx")
    x, state = data()
    stacked = {"x": x[:, None], "state": np.moveaxis(state, 1, 0)[:, :, None]}
    compiled, report = qcc.compile(path, tmp_path / "c", target="c", quantize="int8", calib=stacked,
                                   eval={"x": x, "state": state})
    if report["eval"].get("runtime"):  # --eval ran the gcc-built directory on every sample, state whole
        assert report["eval"]["runtime"]["samples"] == N
        assert report["eval"]["runtime"]["sqnr_vs_simulator_db"] is None  # exact
    exe = build(compiled, tmp_path / "build", sanitize=False)
    rows = np.stack([np.concatenate([x[i], state[:, i].reshape(-1)]) for i in range(N)])
    got = run_c(exe, rows, 4 + LAYERS * HIDDEN)
    sim = [run_affine_int(compiled, {"x": x[i:i + 1], "state": state[:, i:i + 1]}) for i in range(N)]
    want = np.stack([np.concatenate([r["y"].reshape(-1), r["state_n"].reshape(-1)]) for r in sim]).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_inconsistent_sample_counts_name_the_input_and_the_axis(tmp_path: Path) -> None:
    path = state_model(tmp_path / "m.onnx")
    x, state = data()
    with pytest.raises(InvalidInputError) as err:
        qcc.compile(path, tmp_path / "o.onnx", quantize="int8", calib={"x": x, "state": state[:, :-1]})
    assert "'state' holds 11 sample(s) on axis 1, but 'x' holds 12 on axis 0" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidInputError, match=r"'state' has shape \(12, 2, 8\).*samples on axis 1 or "
                                                r"\(-1, 2, 1, 8\)"):
        qcc.compile(path, tmp_path / "o.onnx", quantize="int8", calib={"x": x, "state": np.moveaxis(state, 1, 0)})


def test_batch_axis_names_what_the_model_cannot_tell(tmp_path: Path) -> None:
    """Layers and batch both 2: the model cannot say which axis holds the samples; --batch-axis does."""
    path = state_model(tmp_path / "m.onnx", batch=2, layers=2)
    x, state = data(layers=2)
    np.savez(tmp_path / "d.npz", x=x, state=state)
    with pytest.raises(InvalidInputError, match="'state' has shape"):
        qcc.compile(path, tmp_path / "o.onnx", quantize="int8", calib=str(tmp_path / "d.npz"))
    named, _ = qcc.compile(path, tmp_path / "a.onnx", quantize="int8", calib=str(tmp_path / "d.npz"),
                           batch_axes={"state": 1})
    by_sample = [{"x": x[i:i + 1], "state": state[:, i:i + 1]} for i in range(N)]
    again, _ = qcc.compile(path, tmp_path / "s.onnx", quantize="int8", calib=by_sample, batch_axes={"state": 1})
    assert ranges(named) == ranges(again)
    proc = qcc_cli("compile", str(path), "-o", str(tmp_path / "cli.onnx"), "--quantize", "int8", "--calib",
                   str(tmp_path / "d.npz"), "--batch-axis", "state=1")
    assert proc.returncode == 0, proc.stderr
    assert onnx.load(str(tmp_path / "cli.onnx")) == onnx.load(str(tmp_path / "a.onnx"))


@pytest.mark.parametrize(("args", "expected"), [
    (("--batch-axis", "state=1"), "--batch-axis says where --calib/--eval data holds"),
    (("--batch-axis", "h=1", "--calib", "D"), "--batch-axis h=1: the model has no input 'h'"),
    (("--batch-axis", "state=3", "--calib", "D"), "--batch-axis state=3: input 'state' has 3 axes"),
    (("--batch-axis", "state", "--calib", "D"), "expected NAME=AXIS"),
])
def test_batch_axis_usage_errors(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    path = state_model(tmp_path / "m.onnx")
    x, state = data()
    np.savez(tmp_path / "d.npz", x=x, state=state)
    args = tuple(str(tmp_path / "d.npz") if a == "D" else a for a in args)
    proc = qcc_cli("compile", str(path), "-o", str(tmp_path / "o.onnx"), "--quantize", "int8", *args)
    assert proc.returncode == UsageError.exit_code, proc.stderr
    assert expected in one_error_line(proc)
    assert not (tmp_path / "o.onnx").exists()
