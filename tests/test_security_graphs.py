"""Issue 20, low: invalid graphs are clear errors, every error is one line, outputs do not depend
on how the model path was typed, and useless calibration data is said to be so.

Each hostile or odd model is built here; onnxruntime is the oracle where qcc now computes
something it computed wrongly before (Flatten with a negative axis, scalar constants).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qcc
from qcc.errors import InvalidInputError, UsageError
from tests.cli_util import DIGITS, ROOT
from tests.onnx_zoo import ort_run
from tests.test_hardening import one_error, rewrite_zip, run_all, run_qcc, small_pt2

MODEL = DIGITS / "digits_cnn.onnx"


def _onnx(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto] | None = None,
          outputs: list[onnx.ValueInfoProto] | None = None, inits: dict[str, np.ndarray] | None = None,
          opset: int = 13) -> Path:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])] if inputs is None else inputs
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)] if outputs is None else outputs
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString())
    return path


INVALID = {
    "two producers": ([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")],
                      "writes 'y', which node 'a' (Relu) already defines"),
    "producer of an input": ([helper.make_node("Relu", ["x"], ["x"], name="a"),
                              helper.make_node("Neg", ["x"], ["y"], name="b")], "which a graph input already defines"),
    "string for ints": ([helper.make_node("Transpose", ["x"], ["y"], name="t", perm="ab")],
                        "attribute 'perm' is string, Transpose takes ints"),
    "string for an int": ([helper.make_node("Concat", ["x", "x"], ["y"], name="c", axis="1")],
                          "attribute 'axis' is string, Concat takes int"),
    "unknown attribute": ([helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.5)],
                          "has attribute 'alpha', which Relu (opset 13) does not define"),
    "softmax axis": ([helper.make_node("Softmax", ["x"], ["y"], name="s", axis=7)], "axis 7 out of range for rank 2"),
    "flatten axis": ([helper.make_node("Flatten", ["x"], ["y"], name="f", axis=9)], "axis 9 out of range for rank 2"),
    "no nodes": ([], "the graph has no nodes"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_onnx_graphs_are_refused_naming_what_is_wrong(tmp_path: Path, case: str) -> None:
    nodes, needle = INVALID[case]
    outputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])] if not nodes else None
    path = _onnx(tmp_path / "m.onnx", nodes, outputs=outputs)
    with pytest.raises(InvalidInputError) as info:
        qcc.load(path)
    assert str(path) in str(info.value) and needle in str(info.value), str(info.value)


def test_a_graph_without_outputs_is_refused(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")], outputs=[])
    with pytest.raises(InvalidInputError, match="no outputs"):
        qcc.load(path)


def test_softmax_axis_out_of_range_is_refused_in_old_opsets_too(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", [helper.make_node("Softmax", ["x"], ["y"], name="s", axis=-5)], opset=11)
    with pytest.raises(InvalidInputError, match="axis -5 out of range"):
        qcc.load(path)


def test_flatten_with_a_negative_axis_counts_from_the_back_like_onnxruntime(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    for axis in (-1, -3, -4, 2):
        path = _onnx(tmp_path / f"f{axis}.onnx", [helper.make_node("Flatten", ["x"], ["y"], name="f", axis=axis)],
                     inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])])
        (expected,) = ort_run(str(path), {"x": x})
        model = qcc.load(path)
        got = qcc.run(model, {"x": x})[model.graph.outputs[0].name]
        assert got.shape == expected.shape and np.array_equal(got, expected), axis


def test_scalar_constants_keep_rank_zero_like_onnxruntime(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "s.onnx", [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                 inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                 outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits={"w": np.array(2.5, np.float32)})
    x = np.array(1.25, np.float32)
    (expected,) = ort_run(str(path), {"x": x})
    model = qcc.load(path)
    got = qcc.run(model, {"x": x})["y"]
    assert got.shape == expected.shape == () and got == expected


def test_bool_tensors_holding_other_bytes_are_refused(tmp_path: Path) -> None:
    tensor = TensorProto(name="w", data_type=TensorProto.BOOL, dims=[4], raw_data=bytes([0, 1, 206, 1]))
    nodes = [helper.make_node("Cast", ["w"], ["wf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "wf"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "b", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[tensor])
    path = tmp_path / "b.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    with pytest.raises(InvalidInputError, match="holds byte value 206"):
        qcc.load(path)


def _edited_nnp(tmp_path: Path, edit: tuple[str, str]) -> Path:
    nnp = tmp_path / "digits.nnp"
    if not nnp.exists():
        qcc.compile(MODEL, nnp)
    out = tmp_path / f"edited{len(list(tmp_path.iterdir()))}.nnp"
    buffer = io.BytesIO()
    with zipfile.ZipFile(nnp) as zin, zipfile.ZipFile(buffer, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "network.nntxt":
                text = data.decode()
                assert edit[0] in text
                data = text.replace(edit[0], edit[1], 1).encode()
            zout.writestr(info, data)
    out.write_bytes(buffer.getvalue())
    return out


def test_nnp_executor_naming_a_missing_network_and_two_producers_are_refused(tmp_path: Path) -> None:
    missing = _edited_nnp(tmp_path, ('network_name: "digits_cnn"', 'network_name: "gone"'))
    with pytest.raises(InvalidInputError, match="executor 'Runtime' names a missing network 'gone'"):
        qcc.load(missing)
    twice = _edited_nnp(tmp_path, ('output: "bn1"', 'output: "conv1"'))
    with pytest.raises(InvalidInputError, match="writes variable 'conv1', which function 'conv1' writes too"):
        qcc.load(twice)


@pytest.mark.parametrize("size", [0, -3])
def test_a_batch_size_that_is_not_positive_is_a_usage_error(tmp_path: Path, size: int) -> None:
    with pytest.raises(UsageError, match="--batch-size"):
        qcc.compile(MODEL, tmp_path / "out.onnx", batch_size=size)
    assert not (tmp_path / "out.onnx").exists()


def _bad_pt2(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.pt2"

    def unresolvable(name: str, data: bytes) -> bytes:  # an op torch cannot resolve: it logs a traceback
        if not name.endswith("models/model.json"):
            return data
        return data.replace(b"torch.ops.aten.linear.default", b"torch.ops.aten.nosuch.default", 1)

    rewrite_zip(small_pt2(tmp_path / "good.pt2"), bad, unresolvable)
    return bad


def test_a_pt2_torch_cannot_read_is_one_line_without_torch_s_logged_traceback(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    pt2 = _bad_pt2(tmp_path)
    capfd.readouterr()
    with pytest.raises(InvalidInputError) as info:
        qcc.load(pt2)
    message = str(info.value)
    assert "\n" not in message and str(pt2) in message and "nosuch" in message, message
    assert "Traceback" not in capfd.readouterr().err  # torch logs one on stderr; qcc keeps it off


def test_errors_are_one_line_whatever_the_library_printed(tmp_path: Path) -> None:
    yaml = tmp_path / "bad.yaml"
    yaml.write_text("variables:\n  x: [\n")
    spec = "fold-bn{standalone=co\nnv}"
    runs = run_all([["compile", MODEL, "-o", tmp_path / "b.onnx", "--settings", yaml],
                    ["compile", MODEL, "-o", tmp_path / "c.onnx", "--passes", spec],
                    ["compile", MODEL, "-o", tmp_path / "d.onnx", "--limit", "max_nodes=inf"],
                    ["compile", MODEL, "-o", tmp_path / "e.onnx", "--quantize", "fixed8", "--calib",
                     DIGITS / "calib.npz", "--override", "*=FIXED8_99"]])
    one_error(runs[0], 3, yaml)
    one_error(runs[1], 2, "fold-bn.standalone")
    one_error(runs[2], 2, "max_nodes")
    assert "position 99" in one_error(runs[3], 2, "FIXED8_99")
    assert not any((tmp_path / f"{n}.onnx").exists() for n in "bcde")


def test_outputs_are_the_same_bytes_however_the_model_path_was_typed(tmp_path: Path) -> None:
    folder = tmp_path / "private" / "project"
    folder.mkdir(parents=True)
    shutil.copy(MODEL, folder / "model.onnx")
    code = ("import sys, qcc\n"
            "for target, out in (('onnx', 'float.onnx'), ('onnx-qdq', 'qdq.onnx')):\n"
            "    qcc.compile(sys.argv[1], sys.argv[2] + '/' + out, target=target, quantize='int8' if target != 'onnx' "
            "else 'none', calib=sys.argv[3] if target != 'onnx' else None)\n")
    outputs = []
    for model, cwd in (("model.onnx", folder), (str(folder / "model.onnx"), ROOT), ("../project/model.onnx", folder)):
        out = tmp_path / f"out{len(outputs)}"
        out.mkdir()
        proc = subprocess.run([sys.executable, "-c", code, model, str(out), str(DIGITS / "calib.npz")], cwd=cwd,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outputs.append({p.name: p.read_bytes() for p in out.iterdir()})
    assert outputs[0] == outputs[1] == outputs[2]
    for data in outputs[0].values():
        assert b"private" not in data and str(tmp_path).encode() not in data
        props = {p.key: p.value for p in onnx.load_from_string(data).metadata_props}
        assert props["qcc.source"] == "model.onnx"


@pytest.mark.parametrize("kind", ["zeros", "constant", "subnormal"])
def test_useless_calibration_data_is_warned_about(tmp_path: Path, kind: str) -> None:
    shape = (8, 1, 8, 8)
    data = {"zeros": np.zeros(shape, np.float32), "constant": np.full(shape, 0.5, np.float32),
            "subnormal": np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32)}[kind]
    if kind == "subnormal":
        data[0, 0, 0, :4] = 1e-41
    calib = tmp_path / f"{kind}.npz"
    np.savez(calib, x=data)
    report = tmp_path / "report.json"
    run = run_qcc("compile", MODEL, "-o", tmp_path / "q.onnx", "--target", "onnx-qdq", "--quantize", "int8",
                  "--calib", calib, "--report", report)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("qcc: warning: ")]
    expected = {"zeros": "is all zeros", "constant": "holds one value (0.5)", "subnormal": "4 subnormal value(s)"}
    assert len(warnings) == 1 and str(calib) in warnings[0] and expected[kind] in warnings[0], run.stderr
    assert json.loads(report.read_text())["warnings"] == [warnings[0][len("qcc: warning: "):]]


@pytest.mark.parametrize("form", ["dict", "list of batches", "callable"])
def test_useless_python_data_is_warned_about_too(tmp_path: Path, form: str) -> None:
    """Data given from Python has no file: the same warnings, found batch by batch in a stream."""
    batches = [{"x": np.zeros((4, 1, 8, 8), np.float32)} for _ in range(2)]
    calib = {"dict": {"x": np.concatenate([b["x"] for b in batches])}, "list of batches": batches,
             "callable": lambda: iter(batches)}[form]
    _, report = qcc.compile(MODEL, tmp_path / "q.onnx", target="onnx-qdq", quantize="int8", calib=calib)
    assert len(report["warnings"]) == 1 and "calibration array 'x' is all zeros" in report["warnings"][0], report
    assert report["warnings"][0].startswith("calibration data ("), report["warnings"]


def test_real_calibration_data_gets_no_warning() -> None:
    from qcc.data import calibration_warnings, load_npz

    assert calibration_warnings(load_npz(DIGITS / "calib.npz"), "calib.npz") == []


def test_settings_read_by_a_target_refuse_special_files_too(tmp_path: Path) -> None:
    link = tmp_path / "settings.yaml"
    os.symlink("/dev/zero", link)
    with pytest.raises(InvalidInputError, match="not a regular file"):
        from qcc.formats.settings_yaml import load_settings

        load_settings(link)


def test_rank_0_constants_quantize_like_any_other() -> None:
    """Scalars stay rank 0 (issue 20); the quantizers wrote into numpy's result in place, which is
    a scalar, not an array, for a 0-d input (an int8 attention block's scale crashed)."""
    from qcc.quant.numerics import quantize_affine, quantize_fixed

    for value in (np.float32(12.7), np.float32(-300.0)):
        scalar, vector = np.array(value), np.array([value])
        q = quantize_affine(scalar, 0.1, 0, "int8")
        assert q.shape == () and q == quantize_affine(vector, 0.1, 0, "int8")[0]
        f = quantize_fixed(scalar, 8, 3)
        assert f.shape == () and f == quantize_fixed(vector, 8, 3)[0]
