"""Silero VAD's front end (issue 17's corpus): a reflect Pad, then 1-D convolutions (an STFT as a
Conv of stride 128, an encoder of kernel-3 Convs). ONNX 1-D Conv imports as the 2-D one on a
height-1 view; Pad runs in target c in float (against onnxruntime: it only moves values, so
exactly) and in affine int8 (bit for bit against qcc.sim.affine_int), in every mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import qcc
from qcc.ir.core import Graph, Model
from qcc.ir.types import TensorType
from tests.onnx_zoo import ort_run
from tests.op_check import EPS, c_outputs, check_c, needs_gcc, onnx_model


def _front_end(path: Path) -> Path:
    """x (N, 1, 40) -> reflect Pad 4 -> Conv1d 1->6 (k 8, stride 4) -> Relu -> Conv1d 6->4 (k 3, pads
    2, dilation 2) -> ConvTranspose1d 4->2 (k 2, stride 2)."""
    from onnx import helper

    rng = np.random.default_rng(0)
    inits = {"pads": np.array([0, 0, 4, 0, 0, 4], np.int64), "w1": rng.normal(0, 0.4, (6, 1, 8)).astype(np.float32),
             "b1": rng.normal(0, 0.1, 6).astype(np.float32), "w2": rng.normal(0, 0.4, (4, 6, 3)).astype(np.float32),
             "w3": rng.normal(0, 0.4, (4, 2, 2)).astype(np.float32)}
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
             helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], strides=[4], name="stft"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[2, 2], dilations=[2], name="enc"),
             helper.make_node("ConvTranspose", ["c2", "w3"], ["y"], strides=[2], name="up")]
    path.write_bytes(onnx_model(nodes, {"x": ["N", 1, 40]}, {"y": None}, inits))
    return path


@needs_gcc
def test_1d_convolutions_after_a_reflect_pad_match_onnxruntime_in_c(tmp_path: Path) -> None:
    path = _front_end(tmp_path / "front.onnx")
    xs = np.random.default_rng(1).normal(0, 1, (4, 1, 1, 40)).astype(np.float32)
    want = np.concatenate([ort_run(str(path), {"x": x})[0].reshape(1, -1) for x in xs])
    model = qcc.load(path, input_shapes={"x": (1, 1, 40)})
    assert [n.op for n in model.graph.nodes if n.op in ("Conv", "ConvTranspose")] == ["Conv", "Conv", "ConvTranspose"]
    assert model.graph.outputs[0].type.shape == (1, 2, 22)  # 48 padded -> 11 -> 11 -> 22
    got_sim = qcc.run(model, {"x": xs[0]})[model.graph.outputs[0].name].reshape(1, -1)
    model.graph.inputs[0].type = TensorType("float32", ("N", 1, 40))
    got = c_outputs(model, {"x": xs.reshape(4, 1, 40)}, tmp_path / "build")
    scale = float(np.abs(want).max())
    assert np.abs(got_sim - want[:1]).max() <= 64 * EPS * scale  # float32 sums of at most 24 products
    assert np.abs(got - want).max() <= 64 * EPS * scale


def _pad_model(mode: str) -> Model:
    g = Graph("pad")
    x = g.add_input("x", TensorType("float32", ("N", 3, 5, 6)))
    y = g.add("Pad", x, name="pad", pads=[0, 1, 2, 0, 0, 2, 1, 3], mode=mode, value=0.625)
    g.outputs = [g.add("Relu", y, name="relu")]
    return Model(g)


@needs_gcc
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_in_c_float_and_affine(tmp_path: Path, mode: str) -> None:
    """Float: what onnxruntime computes, exactly (a move); affine: bit for bit the simulator."""
    from onnx import helper

    xs = np.random.default_rng(2).normal(0, 1, (5, 3, 5, 6)).astype(np.float32)
    compiled = check_c(tmp_path, lambda: _pad_model(mode), {"x": xs}, rtol=0.0)
    assert compiled.graph.nodes[0].op == "Pad"
    node = helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode=mode)
    proto = onnx_model([node], {"x": [1, 3, 5, 6]}, {"y": None},
                       {"pads": np.array([0, 1, 2, 0, 0, 2, 1, 3], np.int64), "v": np.array(0.625, np.float32)})
    (tmp_path / "pad.onnx").write_bytes(proto)
    model = qcc.load(tmp_path / "pad.onnx")
    model.graph.inputs[0].type = TensorType("float32", ("N", 3, 5, 6))
    want = np.concatenate([ort_run(proto, {"x": x[None]})[0].reshape(1, -1) for x in xs])
    assert np.array_equal(c_outputs(model, {"x": xs}, tmp_path / "ort_build"), want)
