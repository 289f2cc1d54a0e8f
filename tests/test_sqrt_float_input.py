"""Issue 17 (silero-vad's STFT magnitude): Sqrt's input, and the sums of squares computing it, stay
float in QDQ; the int8 grid of re^2 + im^2 would turn the small bins' step into sqrt(step).
Integer-only C keeps every activation int8 (it cannot run float tensors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import qcc


def magnitude_model(path: Path) -> Path:
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("Pow", ["re", "two"], ["re2"]), helper.make_node("Pow", ["im", "two"], ["im2"]),
             helper.make_node("Add", ["re2", "im2"], ["power"]), helper.make_node("Sqrt", ["power"], ["mag"])]
    graph = helper.make_graph(nodes, "magnitude", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64])
                                                   for n in ("re", "im")],
                              [helper.make_tensor_value_info("mag", TensorProto.FLOAT, [1, 64])], [two])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    onnx.save(proto, path)
    return path


def spectrum(n: int, seed: int) -> dict[str, np.ndarray]:
    """Bins whose magnitudes span three decades, as a speech spectrum's do."""
    rng = np.random.default_rng(seed)
    mag = 10.0 ** rng.uniform(-2, 1, (n, 64))
    phase = rng.uniform(0, 2 * np.pi, (n, 64))
    return {"re": (mag * np.cos(phase)).astype(np.float32), "im": (mag * np.sin(phase)).astype(np.float32)}


def test_sqrt_input_stays_float_in_qdq(tmp_path: Path) -> None:
    path = magnitude_model(tmp_path / "m.onnx")
    compiled, report = qcc.compile(path, tmp_path / "q.onnx", quantize="int8", method="minmax", calib=spectrum(32, 0))
    kept = {f["tensor"]: f["reason"] for f in report["float_fallbacks"]}
    assert {"re2", "im2", "power"} <= set(kept) and "read by Sqrt" in kept["power"]
    written = onnx.load(str(tmp_path / "q.onnx"))
    dequantized = {n.output[0] for n in written.graph.node if n.op_type == "DequantizeLinear"}
    assert not {"re2", "im2", "power"} & dequantized
    # the error is the int8 steps of re, im and the output only: |d|mag|| <= |d re| + |d im|
    scale = {v.name: float(np.ravel(v.quant.scale)[0]) for v in compiled.graph.values()
             if v.name in ("re", "im", "mag") and v.quant is not None and hasattr(v.quant, "scale")}
    bound = (scale["re"] + scale["im"] + scale["mag"]) / 2 * (1 + 1e-4)
    test = spectrum(32, 0)  # the calibration samples: no value outside the calibrated ranges
    q = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for i in range(16):
        feed = {k: v[i:i + 1] for k, v in test.items()}
        assert np.abs(q.run(None, feed)[0] - f.run(None, feed)[0]).max() <= bound


def test_integer_c_keeps_every_activation_int8(tmp_path: Path) -> None:
    compiled, report = qcc.compile(magnitude_model(tmp_path / "m.onnx"), tmp_path / "c", target="c", quantize="int8",
                                   calib=spectrum(8, 0))
    assert not any(f["tensor"] in ("re2", "im2", "power") for f in report.get("float_fallbacks", []))
    from qcc.ir.types import Affine

    assert all(isinstance(v.quant, Affine) for v in compiled.graph.values() if not v.is_const)
