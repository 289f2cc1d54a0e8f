"""--max-accuracy-drop (issue 18, item 5): promote sensitive layers until the drop is met.

Oracles: the labelled test set (top-1), the float model, the IR verifier (the returned model is
always a finished one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from qcc.driver import compile as qcc_compile
from qcc.ir.types import FixedPoint, Float32
from qcc.ir.verify import verify_model
from qcc.sim import run_model
from tests.cli_util import DIGITS, one_error_line, qcc
from tests.ptq_models import NetFiles


def test_per_tensor_int8_without_equalization_is_rescued_by_promotions(
        mobilenet_digits_files: NetFiles, tmp_path: Path) -> None:
    files = mobilenet_digits_files
    model, report = qcc_compile(str(files.model), tmp_path / "m.onnx", target="onnx-qdq", quantize="int8",
                                per_tensor=True, equalize=False, bias_correct=False, calib=str(files.calib),
                                eval=str(files.test), max_accuracy_drop=0.01)
    section = report["accuracy_control"]
    assert section["quantized_before"] < section["float"] - 0.1  # the failure equalize fixes by default
    assert section["met"] and section["drop"] <= 0.01 and section["promoted"]
    assert all(p["to"] in ("16", "float") for p in section["promoted"])
    assert report["eval"]["quantized_accuracy"] == section["quantized_after"]  # the model written is the one tuned
    assert not verify_model(model)


def _logit_error_metric(x: np.ndarray, reference: np.ndarray) -> Callable[..., float]:
    def metric(predict: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]) -> float:
        (out,) = predict({"x": x}).values()
        return -float(np.mean((out - reference) ** 2))  # 0 only for the float model itself
    return metric


def test_a_metric_callable_and_an_unreachable_target_end_with_the_best_finished_model(tmp_path: Path) -> None:
    """A pinned weight can never be promoted, so a drop of 0 is out of reach: the pass ends with
    the best configuration it measured, fully annotated, never a half-applied step."""
    from qcc.driver import load

    x = np.load(DIGITS / "test.npz")["x"][:64]
    reference = run_model(load(str(DIGITS / "digits_cnn.onnx")), {"x": x})["logits"]
    model, report = qcc_compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / "d.onnx", target="onnx-qdq",
                                quantize="fixed8", calib=str(DIGITS / "calib.npz"), max_accuracy_drop=0.0,
                                metric=_logit_error_metric(x, reference), overrides=("fc.weight_t=FIXED8_6",))
    section = report["accuracy_control"]
    assert section["metric"] == "metric callable" and not section["met"]
    assert section["quantized_after"] > section["quantized_before"]
    # the search went on past its best configuration (every layer at 16 bits, then in float)
    assert section["promoted"] and section["evaluations"] > 2 + len(section["promoted"])
    assert not verify_model(model)
    values = model.graph.value_map()
    assert values["fc.weight_t"].quant == FixedPoint(8, 6)  # the pin held
    outputs = {n.name: n.outputs[0].quant for n in model.graph.nodes}
    for promotion in section["promoted"]:  # the measured configuration, applied in full
        quant = outputs.get(promotion["layer"], values.get(promotion["layer"]) and values[promotion["layer"]].quant)
        want = Float32 if promotion["to"] == "float" else FixedPoint
        assert isinstance(quant, want), promotion
        assert promotion["to"] == "float" or quant.bits == 16  # type: ignore[union-attr]
    floats = [v for v in model.graph.values() if isinstance(v.quant, Float32)]
    assert all(v.meta.get("float_reason") for v in floats)  # each float tensor says why


def test_max_accuracy_drop_needs_labelled_data(tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    proc = qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--quantize", "int8", "--calib",
               str(DIGITS / "calib.npz"), "--max-accuracy-drop", "0.01")
    assert proc.returncode == 2 and "--max-accuracy-drop needs labelled evaluation data" in one_error_line(proc)
    assert not out.exists()
    calib_only = tmp_path / "nolabels.npz"
    np.savez(calib_only, x=np.load(DIGITS / "test.npz")["x"])
    proc = qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--quantize", "int8", "--calib",
               str(DIGITS / "calib.npz"), "--eval", str(calib_only), "--max-accuracy-drop", "0.01")
    assert proc.returncode == 2 and "'labels'" in one_error_line(proc)
    assert not out.exists()
