"""The driver as a user meets it: compile, inspect, errors, exit codes, no partial outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.cli_util import DIGITS, ROOT, one_error_line, qcc
from tests.onnx_zoo import ort_run


def test_help_and_version_do_not_import_frameworks() -> None:
    code = ("import sys; from qcc.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('onnx', 'onnxruntime', 'nnabla', 'torch') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    version = qcc("--version")
    assert version.returncode == 0 and version.stdout.startswith("qcc ")


def test_compile_digits_to_onnx_matches_original(tmp_path: Path) -> None:
    out = tmp_path / "digits.onnx"
    dump = tmp_path / "ir"
    proc = qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--passes", "dce,fold-constants",
               "--time-passes", "--dump-ir", str(dump), "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert "pass timings" in proc.stderr and "dce" in proc.stderr
    assert sorted(p.name for p in dump.iterdir())[0] == "00-input.qir"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["pipeline"] == ["dce", "fold-constants"] and report["target"] == "onnx"
    x = np.load(DIGITS / "test.npz")["x"][:50]
    (ref,) = ort_run(str(DIGITS / "digits_cnn.onnx"), {"x": x})
    (got,) = ort_run(str(out), {"x": x})
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    import onnx

    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props["qcc.pipeline"] == "dce,fold-constants" and props["qcc.version"]


def test_inspect_prints_layer_table() -> None:
    proc = qcc("inspect", str(DIGITS / "digits_cnn.onnx"))
    assert proc.returncode == 0, proc.stderr
    assert "conv1" in proc.stdout and "Conv" in proc.stdout and "Nx16x8x8" in proc.stdout
    js = qcc("inspect", str(DIGITS / "digits_cnn.onnx"), "--json")
    data = json.loads(js.stdout)
    conv1 = next(r for r in data["layers"] if r["name"] == "conv1")
    assert conv1["output_bytes"] == 16 * 8 * 8 * 4 and conv1["parameter_bytes"] == (16 * 9 + 16) * 4


def test_truncated_and_corrupt_onnx_fail_cleanly(tmp_path: Path) -> None:
    data = (DIGITS / "digits_cnn.onnx").read_bytes()
    for name, payload in [("truncated.onnx", data[: len(data) // 2]), ("garbage.onnx", b"\x00\xffnot onnx" * 10)]:
        src = tmp_path / name
        src.write_bytes(payload)
        out = tmp_path / f"out_{name}"
        proc = qcc("compile", str(src), "-o", str(out))
        line = one_error_line(proc)
        assert proc.returncode == 3 and name in line
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.onnx", "truncated.onnx"]


def test_unsupported_op_names_op_node_and_supported_list(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="act"), helper.make_node("Det", ["r"], ["y"], name="my_det")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    src = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(src))
    out = tmp_path / "out.onnx"
    proc = qcc("compile", str(src), "-o", str(out))
    line = one_error_line(proc)
    assert proc.returncode == 4
    assert "Det" in line and "'my_det'" in line and "Supported:" in line and "Conv" in line
    assert not out.exists()


def test_unknown_pass_and_bad_options(tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    line = one_error_line(qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--passes", "dce,nope"))
    assert "unknown pass 'nope'" in line
    line = one_error_line(qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out),
                              "--passes", "fold-constants{max_elements=lots}"))
    assert "max_elements" in line
    line = one_error_line(qcc("compile", str(tmp_path / "missing.onnx"), "-o", str(out)))
    assert "missing.onnx" in line
    assert not out.exists()


def test_failed_compile_keeps_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "model.onnx"
    out.write_bytes(b"previous")
    proc = qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--passes", "nope")
    assert proc.returncode == 2
    assert out.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
