"""ConvTranspose in target c (issue 17's corpus: PP-OCR's text detector upsamples with two 2x2,
stride-2 ConvTranspose): float against onnxruntime over strides, pads, dilations, output_padding
and groups; affine int8 bit for bit against qcc.sim.affine_int; a grouped per-channel weight,
which the integer kernels cannot scale per output channel, refused naming the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import qcc
from qcc.errors import UnsupportedError
from qcc.ir.core import Graph, Model
from qcc.ir.ops.nn import ConvTranspose
from qcc.ir.types import TensorType
from tests.onnx_zoo import ort_run
from tests.op_check import EPS, c_outputs, check_c, needs_gcc, onnx_model

GEOMETRIES = {  # name: (input C, H, W), weight (C, O/group, KH, KW), attributes
    "ppocr_2x2_s2": ((6, 5, 7), (6, 3, 2, 2), {"strides": [2, 2]}),
    "k3_s2_pads_outpad": ((4, 6, 5), (4, 5, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}),
    "dilated_s1": ((3, 4, 6), (3, 2, 3, 2), {"dilations": [2, 3], "pads": [1, 1, 0, 0]}),
    "grouped_s3": ((4, 3, 4), (4, 3, 3, 3), {"strides": [3, 2], "group": 2, "pads": [0, 1, 2, 0]}),
}


def _weights(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(0, 0.5, shape).astype(np.float32), rng.normal(0, 0.2, shape[1]).astype(np.float32)


@needs_gcc
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_c_float_matches_onnxruntime(tmp_path: Path, geometry: str) -> None:
    """Both sum each output's K products in float32, in different orders: each is within
    K * eps * sum|x * w| of the exact sum, so they differ by at most twice that."""
    from onnx import helper

    (c, h, w), wshape, attrs = GEOMETRIES[geometry]
    weight, bias = _weights(wshape, 0)
    bias = np.tile(bias, attrs.get("group", 1))
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=list(wshape[2:]), **attrs)
    proto = onnx_model([node], {"x": ["N", c, h, w]}, {"y": None}, {"w": weight, "b": bias})
    (tmp_path / "ct.onnx").write_bytes(proto)
    xs = np.random.default_rng(1).normal(0, 1, (3, 1, c, h, w)).astype(np.float32)
    want = np.concatenate([ort_run(proto, {"x": x})[0].reshape(1, -1) for x in xs])
    model = qcc.load(tmp_path / "ct.onnx", input_shapes={"x": (1, c, h, w)})
    model.graph.inputs[0].type = TensorType("float32", ("N", c, h, w))
    got = c_outputs(model, {"x": xs.reshape(3, c, h, w)}, tmp_path / "build")
    node_ir = model.graph.nodes[0]
    magnitude = np.concatenate([ConvTranspose.kernel(node_ir, [np.abs(x).astype(np.float64),
                                                               np.abs(weight).astype(np.float64)])[0].reshape(1, -1)
                                for x in xs])
    depth = c // attrs.get("group", 1) * wshape[2] * wshape[3] + 1
    assert np.all(np.abs(got - want) <= 2 * depth * EPS * (magnitude + np.abs(bias).max())), \
        float(np.max(np.abs(got - want)))


def _ir_model(geometry: str) -> Any:
    def build() -> Model:
        (c, h, w), wshape, attrs = GEOMETRIES[geometry]
        weight, bias = _weights(wshape, 2)
        bias = np.tile(bias, attrs.get("group", 1))
        g = Graph("convt")
        x = g.add_input("x", TensorType("float32", ("N", c, h, w)))
        y = g.add("ConvTranspose", x, g.add_constant("w", weight), g.add_constant("b", bias), name="up", **attrs)
        g.outputs = [g.add("Relu", y, name="relu")]
        return Model(g)
    return build


@needs_gcc
@pytest.mark.parametrize("geometry", ["ppocr_2x2_s2", "k3_s2_pads_outpad"])
def test_c_affine_is_bit_exact_with_the_integer_simulator(tmp_path: Path, geometry: str) -> None:
    (c, h, w), _, _ = GEOMETRIES[geometry]
    feeds = {"x": np.random.default_rng(3).normal(0, 1, (6, c, h, w)).astype(np.float32)}
    compiled = check_c(tmp_path, _ir_model(geometry), feeds)
    assert compiled.graph.nodes[0].op == "ConvTranspose"


def test_grouped_per_channel_weights_are_refused_by_name(tmp_path: Path) -> None:
    (c, h, w), _, _ = GEOMETRIES["grouped_s3"]
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(4).normal(0, 1, (4, c, h, w)).astype(np.float32))
    with pytest.raises(UnsupportedError, match=r"node 'up' \(ConvTranspose, group 2\) has per-channel weights"):
        qcc.compile(_ir_model("grouped_s3")(), tmp_path / "c", target="c", quantize="int8",
                    calib=str(tmp_path / "calib.npz"))
    assert not (tmp_path / "c").exists()
