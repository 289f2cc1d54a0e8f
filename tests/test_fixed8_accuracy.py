"""FIXED8 against float on what the real-model corpus showed (docs/benchmarks.md, "Real-model corpus").

1. A Conv whose bias cancels most of its sum (folded BatchNorm, PP-OCR's squeeze-excite convs):
   nnabla-c-runtime accumulates the sum in the output's type, saturating after every input
   channel, and adds the bias last, so the output position must hold the sum before the bias.
   Oracles: onnxruntime (float) within the error the fixed-point arithmetic allows, and the .nnb
   file decoded and run integer for integer against qcc's simulator.
2. check-fixed-point: a fixed-point model whose outputs are far from float says so in one
   warning line naming the tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper

import qcc
from qcc.sim.fixed import FixedRunner, fixed_of, param_values
from tests.op_check import onnx_model
from tests.test_nnb_pool_pads import emulate

CI = 6


def biased_conv_proto() -> bytes:
    """x (N, 6, 5, 5) in [0, 1) -> 1x1 Conv, positive weights, a bias of minus half the largest
    sum: the output and the bias fit in [-2, 2), the sum before the bias reaches past 2."""
    rng = np.random.default_rng(3)
    w = rng.uniform(0.4, 0.9, (4, CI, 1, 1))
    w = (w * 3.6 / w.sum(axis=(1, 2, 3), keepdims=True)).astype(np.float32)  # sums in [0, 3.6)
    b = np.full(4, -1.8, np.float32)  # the bias and the output fit in [-2, 2)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="se_conv")]
    return onnx_model(nodes, {"x": ("N", CI, 5, 5)}, {"y": None}, {"w": w, "b": b}, opset=13)


def inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 1.0, (n, CI, 5, 5)).astype(np.float32)


def fixed8_error_bound(model: qcc.Model, x: np.ndarray) -> np.ndarray:
    """What FIXED8 arithmetic may lose per output without saturating: the input rounded (half a
    step times sum |w|), the weights rounded (half a step times sum |x|), one truncation per input
    channel and the bias and bias-correct's shift (a few output steps)."""
    conv = model.graph.nodes[0]
    fx, fw, fy = (fixed_of(v) for v in (conv.inputs[0], conv.inputs[1], conv.outputs[0]))
    assert fx is not None and fw is not None and fy is not None
    w = np.abs(param_values(conv.inputs[1]).reshape(4, CI))
    sum_w = w.sum(axis=1).reshape(1, 4, 1, 1)
    sum_x = np.abs(x).sum(axis=1, keepdims=True)
    return sum_w * 2.0 ** -(fx.frac + 1) + sum_x * 2.0 ** -(fw.frac + 1) + (CI + 4) * 2.0 ** -fy.frac


def test_conv_position_holds_the_sum_before_the_bias(tmp_path: Path) -> None:
    import onnxruntime as ort

    source = tmp_path / "se.onnx"
    source.write_bytes(biased_conv_proto())
    np.savez(tmp_path / "calib.npz", x=inputs(16, 0))
    out = tmp_path / "se8.nnb"
    model, _ = qcc.compile(source, out, quantize="fixed8", calib=str(tmp_path / "calib.npz"))
    x = inputs(8, 1)
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    runner = FixedRunner(model)
    got = runner.run({"x": x})["y"]
    bound = fixed8_error_bound(model, x)
    assert np.abs(want).max() < 2.0 < np.abs(want - model.graph.nodes[0].inputs[2].const.reshape(1, 4, 1, 1)).max()
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))
    stored = runner.run_stored({"x": x})["y"]
    np.testing.assert_array_equal(emulate(out, x), stored)


def fixed_pipeline(bits: int) -> str:
    return (f"fold-bn,calibrate,assign-fixed-point{{bits={bits},weight_bits={bits}}},"
            "check-fixed-point{min_sqnr_db=45}")


def test_low_fixed_point_sqnr_is_a_warning_naming_the_tensors(tmp_path: Path) -> None:
    source = tmp_path / "se.onnx"
    source.write_bytes(biased_conv_proto())
    np.savez(tmp_path / "calib.npz", x=inputs(16, 0))
    # FIXED8: about 30 dB on this layer (8 bits, truncations), below the 45 dB asked for
    _, report = qcc.compile(source, tmp_path / "a.nnb", passes=fixed_pipeline(8), calib=str(tmp_path / "calib.npz"))
    (line,) = [w for w in report.get("warnings", []) if w.startswith("check-fixed-point")]
    assert "\n" not in line and "'y'" in line and "Conv node 'se_conv'" in line and "fixed16" in line
    section = report["fixed_point_check"]
    assert section["samples"] == 4 and section["output_sqnr_db"]["y"] < 45
    assert section["lowest"][0]["tensor"] == "y" and section["lowest"][0]["node"] == "se_conv"
    # FIXED16 holds the signal: no warning, the section says how well
    _, report = qcc.compile(source, tmp_path / "b.nnb", passes=fixed_pipeline(16), calib=str(tmp_path / "calib.npz"))
    assert not [w for w in report.get("warnings", []) if w.startswith("check-fixed-point")]
    assert report["fixed_point_check"]["output_sqnr_db"]["y"] > 45


def test_fixed8_pipeline_ends_with_the_check(tmp_path: Path) -> None:
    source = tmp_path / "se.onnx"
    source.write_bytes(biased_conv_proto())
    np.savez(tmp_path / "calib.npz", x=inputs(16, 0))
    _, report = qcc.compile(source, tmp_path / "c.nnb", quantize="fixed8", calib=str(tmp_path / "calib.npz"))
    assert report["fixed_point_check"]["output_sqnr_db"]["y"] is not None
