"""A bias that does not fit int32 on the scale s_x * s_w (a channel whose weights are all near zero
but whose bias is not, as in PP-OCR's detector and recognizer): quantize-affine raises that
channel's weight scale, as onnxruntime's quantize_static does, so target c compiles the layer
bit-exact with qcc.sim.affine_int and onnxruntime reads the channel's bias, not a clipped one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import qcc
from qcc.sim.affine_int import run_affine_int
from tests.onnx_zoo import ort_run
from tests.op_check import c_outputs, needs_gcc, onnx_model


def _dead_channel_conv(path: Path) -> Path:
    """Conv 3 -> 4 channels, 3x3; channel 1's weights are 1e-9 and its bias 0.75."""
    from onnx import helper

    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    w[1] = 1e-9
    b = np.array([0.1, 0.75, -0.2, 0.0], np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    path.write_bytes(onnx_model([node], {"x": ["N", 3, 6, 6]}, {"y": None}, {"w": w, "b": b}))
    return path


@needs_gcc
def test_a_bias_too_large_for_its_scale_raises_the_weight_scale(tmp_path: Path) -> None:
    path = _dead_channel_conv(tmp_path / "dead.onnx")
    xs = np.random.default_rng(1).normal(0, 1, (8, 3, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=xs)
    compiled, _ = qcc.compile(path, tmp_path / "c", target="c", quantize="int8", calib=str(tmp_path / "calib.npz"),
                              input_shapes={"x": (1, 3, 6, 6)})
    conv = compiled.graph.nodes[0]
    sx = conv.input(0).quant.scale[0]  # type: ignore[union-attr]
    sw = np.asarray(conv.input(1).quant.scale)  # type: ignore[union-attr]
    assert 0.75 / (sx * sw[1]) <= 2.0**30 and sw[1] > 1000 * 1e-9 / 127  # channel 1's scale grew
    w = np.abs(qcc.load(path, input_shapes={"x": (1, 3, 6, 6)}).graph.nodes[0].input(1).const)  # type: ignore[arg-type]
    assert np.allclose(sw[[0, 2, 3]], w[[0, 2, 3]].max(axis=(1, 2, 3)) / 127, rtol=1e-6)  # the others did not
    compiled.graph.inputs[0].type = type(compiled.graph.inputs[0].type)("float32", ("N", 3, 6, 6))
    got = c_outputs(compiled, {"x": xs}, tmp_path / "build")
    want = run_affine_int(compiled, {"x": xs})["y"].reshape(8, -1)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    step = compiled.graph.outputs[0].quant.scale[0]  # type: ignore[union-attr]
    dead = got.reshape(8, 4, 6, 6)[:, 1]
    assert np.all(np.abs(dead - 0.75) <= step), float(np.max(np.abs(dead - 0.75)))  # the bias, in one step

    qcc.compile(path, tmp_path / "q.onnx", quantize="int8", calib=str(tmp_path / "calib.npz"),
                input_shapes={"x": (1, 3, 6, 6)})
    (qdq,) = ort_run(str(tmp_path / "q.onnx"), {"x": xs[:1]}, optimize=True)
    assert np.all(np.abs(qdq[0, 1] - 0.75) <= step), float(np.max(np.abs(qdq[0, 1] - 0.75)))
