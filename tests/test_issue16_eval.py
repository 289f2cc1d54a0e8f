"""Issue 16 items 1-2: --eval measures the written file in its real runtime; `qcc run`/`qcc eval`
on any model; per-layer SQNR against the float source. The numbers are checked against what a
separate script measures by running the written file in its runtime (examples/demo.py's
runners: an onnxruntime session, the directory built with make and run per image, nnablart or
the decoded .nnb)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qcc.cli import main
from qcc.driver import compile as qcc_compile
from tests.cli_util import DIGITS, ROOT

MODEL = DIGITS / "digits_cnn.onnx"
CALIB = str(DIGITS / "calib.npz")
TEST = str(DIGITS / "test.npz")


def demo() -> Any:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import demo as module
    finally:
        sys.path.pop(0)
    return module


def top1(logits: np.ndarray) -> np.ndarray:
    return logits.reshape(len(logits), -1).argmax(axis=1)


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    test = np.load(TEST)
    x, labels = test["x"], test["labels"]
    return x, labels, demo().ort_logits(MODEL, x)


@pytest.fixture(scope="module")
def c_int8(tmp_path_factory: pytest.TempPathFactory, digits: Any) -> tuple[Path, dict[str, Any], np.ndarray]:
    """Digits in C int8 compiled with --eval, and its logits from the program main.c builds (one run per image)."""
    path = tmp_path_factory.mktemp("c") / "c_int8"
    _, report = qcc_compile(MODEL, path, quantize="int8", calib=CALIB, eval=TEST)
    return path, report, demo().c_logits(path, digits[0])


@pytest.mark.parametrize("out, quantize, runtime", [
    ("qdq.onnx", "int8", "onnxruntime"),
    ("c_int8", "int8", "gcc-built binary"),
    ("fixed8.nnb", "fixed8", "nnb"),
])
def test_report_eval_equals_the_written_file_run_in_its_runtime(tmp_path: Path, digits: Any, c_int8: Any, out: str,
                                                                quantize: str, runtime: str) -> None:
    x, labels, float_logits = digits
    d = demo()
    if runtime == "gcc-built binary":
        path, report, logits = c_int8
    else:
        path = tmp_path / out
        _, report = qcc_compile(MODEL, path, quantize=quantize, calib=CALIB, eval=TEST)
        if runtime == "onnxruntime":
            logits = d.ort_logits(path, x)
        else:  # nnablart when found, else the decoded file (what the demo prints as its runtime)
            logits, shown = d.nnb_logits(path, x)
            runtime = "nnabla-c-runtime" if shown == "nnabla-c-runtime" else "qcc emulation of the decoded .nnb"
    measured = report["eval"]["runtime"]
    assert measured["name"].startswith(runtime)
    assert measured["samples"] == len(labels)
    assert measured["accuracy"] == np.mean(top1(logits) == labels)
    assert measured["agreement_with_float"] == np.mean(top1(logits) == top1(float_logits))
    # the simulator side: integer runtimes are bit-exact with it; onnxruntime within its tolerance
    if runtime == "onnxruntime":  # None: no noise at all, as where ORT's int8 kernels match the simulator
        sqnr = measured["sqnr_vs_simulator_db"]
        assert sqnr is None or sqnr >= measured["tolerance"]["min_sqnr_vs_simulator_db"]
    else:
        assert measured["sqnr_vs_simulator_db"] is None  # exact
    assert report.get("warnings", []) == []
    assert report["eval"]["measured_in"]["written_file"] == measured["name"]


def test_a_runtime_beyond_its_tolerance_is_a_warning(tmp_path: Path) -> None:
    """A file that is not the simulated model (here: the float source run where the int8 file
    should be) is reported, not averaged away."""
    from qcc.data import bound_batches, load_npz
    from qcc.driver import load
    from qcc.evaluation import disagreement, evaluate
    from qcc.runtimes.base import EXACT
    from qcc.runtimes.onnxruntime import OrtRuntime

    reference = load(MODEL)
    compiled, _ = qcc_compile(MODEL, tmp_path / "q.onnx", quantize="int8", calib=CALIB)
    data = load_npz(TEST)
    with OrtRuntime(MODEL, EXACT) as wrong:
        section = evaluate(reference, compiled, bound_batches(reference, data, TEST, 32, "--eval"), TEST, True,
                           runtime=wrong)
    assert section["runtime"]["sqnr_vs_simulator_db"] is not None
    line = disagreement(section)
    assert line is not None and "beyond its tolerance" in line and "bit-exact" in line


def test_qcc_run_writes_the_outputs_of_the_c_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    c_int8: Any) -> None:
    folder, _, logits = c_int8
    assert main(["run", str(folder), TEST, "-o", str(tmp_path / "out.npz")]) == 0
    assert "gcc-built binary" in capsys.readouterr().out
    assert np.array_equal(np.load(tmp_path / "out.npz")["logits"], logits)


def test_qcc_eval_compares_layer_by_layer_with_the_float_model(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                digits: Any) -> None:
    x, labels, float_logits = digits
    quantized = tmp_path / "q.onnx"
    qcc_compile(MODEL, quantized, quantize="int8", calib=CALIB)
    assert main(["eval", str(quantized), TEST, "--reference", str(MODEL), "--report", "-"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    logits = demo().ort_logits(quantized, x)
    assert result["samples"] == len(labels) and result["accuracy"] == np.mean(top1(logits) == labels)
    assert result["agreement"] == np.mean(top1(logits) == top1(float_logits))
    layers = {e["tensor"]: e["sqnr_db"] for e in result["layers"]}
    # every tensor of the float model, matched by name to the QDQ file's DequantizeLinear outputs
    assert {"relu1", "concat1", "avgpool1", "logits"} <= set(layers)
    assert all(v is not None and 15 < v < 80 for v in layers.values())
    assert "relu1" in captured.err and "SQNR dB" in captured.err  # the table, on stderr with --report -


def test_tables_never_cut_names(capsys: pytest.CaptureFixture[str]) -> None:
    from qcc.running import print_layer_table
    from qcc.summary import _print_tensors

    name = "backbone/stage4/block12/conv3/BatchNormalization_output_0"
    kind = "affine(uint8,scale=[0.0123456789],zp=[0])"
    _print_tensors([{"name": name, "type": kind, "kind": "activation", "range": [0.0, 3.1], "clip_fraction": 0.0,
                     "sqnr_db": 38.5, "eval_sqnr_db": 31.25}])
    out = capsys.readouterr().out
    assert name in out and kind in out and "31.2" in out
    print_layer_table([{"tensor": name, "shape": [8, 4, 4], "sqnr_db": 31.25}, {"tensor": "y", "shape": [10],
                                                                               "sqnr_db": None}])
    out = capsys.readouterr().out
    assert name in out and "31.2" in out and "exact" in out


def test_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _, report = qcc_compile(MODEL, tmp_path / "d8.nnb", quantize="fixed8", calib=CALIB, eval=TEST,
                            plots=str(tmp_path / "plots"))
    files = [Path(f) for f in report["plots"]]
    names = {f.name for f in files}
    assert {"layer_sqnr.png", "memory_timeline.png", "relu1.png"} <= names
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
