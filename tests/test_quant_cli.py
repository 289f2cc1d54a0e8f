"""`qcc compile --quantize ...` end to end: report JSON, --eval, usage errors, bad data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_util import DIGITS, one_error_line, qcc

MODEL = str(DIGITS / "digits_cnn.onnx")
CALIB = str(DIGITS / "calib.npz")
TEST = str(DIGITS / "test.npz")


def test_int8_compile_with_report_and_eval(tmp_path: Path) -> None:
    out, report_path = tmp_path / "q.onnx", tmp_path / "report.json"
    proc = qcc("compile", MODEL, "-o", str(out), "--quantize", "int8", "--calib", CALIB, "--eval", TEST,
               "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["pipeline"] == ["fold-bn", "calibrate", "quantize-affine", "bias-correct"]
    assert isinstance(report["tensors"], list) and isinstance(report["float_fallbacks"], list)
    assert report["float_fallbacks"] == []  # every float tensor annotated
    ev = report["eval"]
    assert {"float_accuracy", "quantized_accuracy", "agreement", "output_sqnr_db"} <= set(ev)
    assert ev["quantized_accuracy"] >= ev["float_accuracy"] - 0.01 and ev["agreement"] >= 0.98
    assert ev["output_sqnr_db"] > 25
    relu1 = next(t for t in report["tensors"] if t["name"] == "relu1")
    assert relu1["type"].startswith("affine(int8") and {"scale", "zero_point", "range", "clip_fraction",
                                                         "sqnr_db", "eval_sqnr_db"} <= set(relu1)
    assert "eval:" in proc.stdout and "relu1" in proc.stdout
    # a quantizing scheme with an output inferred as ONNX writes QDQ (never a float file that the
    # report would describe as quantized)
    assert report["target"] == "onnx-qdq"
    import onnx

    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def test_fixed_scheme_with_overrides_reports_float_fallbacks(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    proc = qcc("compile", MODEL, "-o", str(tmp_path / "f.onnx"), "--quantize", "fixed16", "--calib", CALIB,
               "--override", "logits=FLOAT32", "--override", "relu5=FIXED16_10", "--eval", TEST,
               "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["pipeline"] == ["fold-bn", "apply-overrides", "equalize", "calibrate", "assign-fixed-point",
                                  "bias-correct", "check-fixed-point"]
    fallbacks = {e["tensor"]: e["reason"] for e in report["float_fallbacks"]}
    assert "override FLOAT32" in fallbacks["logits"] and "fc.bias" in fallbacks
    relu5 = next(t for t in report["tensors"] if t["name"] == "relu5")
    assert relu5["type"] == "fixed(16,10)" and relu5["position"] == 10
    assert report["eval"]["quantized_accuracy"] >= report["eval"]["float_accuracy"] - 0.003
    assert "left in float: logits" in proc.stdout


def test_binary_weight_needs_no_calibration(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    proc = qcc("compile", MODEL, "-o", str(tmp_path / "b.onnx"), "--quantize", "binary-weight",
               "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    signs = [t for t in report["tensors"] if t["type"] == "sign"]
    assert len(signs) == 7  # six convolutions and the dense layer
    assert all(t["bytes"] == -(-int(np.prod(t["shape"])) // 8) for t in signs)  # one bit per weight
    assert any(e["kind"] == "activation" for e in report["float_fallbacks"])


@pytest.mark.parametrize("args, code, message", [
    (["--quantize", "int8"], 2, "--quantize int8 needs calibration data: add --calib"),
    (["--quantize", "fixed8", "--calib", CALIB, "--override", "nope*=FIXED8"], 2, "matches no tensor"),
    (["--quantize", "fixed8", "--calib", CALIB, "--override", "relu1=FIXED9"], 2, "unknown type"),
])
def test_usage_errors_leave_no_output(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    out = tmp_path / "o.onnx"
    proc = qcc("compile", MODEL, "-o", str(out), *args)
    assert proc.returncode == code and message in one_error_line(proc)
    assert not out.exists()


def test_bad_data_files_are_invalid_input(tmp_path: Path) -> None:
    x = np.load(CALIB)["x"]
    files = {
        "shape.npz": {"x": x[:, :, :4]},
        "nan.npz": {"x": np.where(x > 0.5, np.nan, x).astype(np.float32)},
        "names.npz": {"a": x, "b": x},
    }
    messages = {"shape.npz": "has shape (359, 1, 4, 8)", "nan.npz": "NaN or Inf", "names.npz": "no array for model input"}
    for name, arrays in files.items():
        path = tmp_path / name
        np.savez(path, **arrays)  # type: ignore[arg-type]
        out = tmp_path / "o.onnx"
        proc = qcc("compile", MODEL, "-o", str(out), "--quantize", "int8", "--calib", str(path))
        assert proc.returncode == 3 and messages[name] in one_error_line(proc), proc.stderr
        proc = qcc("compile", MODEL, "-o", str(out), "--quantize", "int8", "--calib", CALIB, "--eval", str(path))
        assert proc.returncode == 3 and messages[name] in one_error_line(proc), proc.stderr
        assert not out.exists()
