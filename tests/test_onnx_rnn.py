"""ONNX LSTM and GRU (issue 17) unrolled like torch.nn.LSTM: every direction, both layouts,
given or zero initial states, GRU's linear_before_reset 0 and 1, against onnxruntime (layout 1,
which onnxruntime does not run, against the layout-0 model on transposed data); then C in float
and affine int8 (bit-exact), since the cells are ordinary IR ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import qcc
from qcc.errors import UnsupportedError
from tests.onnx_zoo import ort_run
from tests.op_check import check_c, close

STEPS, BATCH, WIDTH, HIDDEN = 4, 3, 5, 6


def rnn_proto(op: str, direction: str, layout: int, with_state: bool, extra: dict | None = None,
              seed: int = 0, batch: int | str = BATCH) -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    dirs, gates = (2 if direction == "bidirectional" else 1), (4 if op == "LSTM" else 3)
    if layout == 0:
        x_shape, h_shape = (STEPS, batch, WIDTH), (dirs, batch, HIDDEN)
    else:
        x_shape, h_shape = (batch, STEPS, WIDTH), (batch, dirs, HIDDEN)
    inits = {"W": rng.standard_normal((dirs, gates * HIDDEN, WIDTH)) * 0.5,
             "R": rng.standard_normal((dirs, gates * HIDDEN, HIDDEN)) * 0.5,
             "B": rng.standard_normal((dirs, 2 * gates * HIDDEN)) * 0.5}
    states = ["h0", "c0"][:2 if op == "LSTM" else 1] if with_state else []
    inputs = ["x", "W", "R", "B", "", *states]
    outputs = ["y", "y_h", "y_c"][:3 if op == "LSTM" else 2]
    node = helper.make_node(op, inputs, outputs, hidden_size=HIDDEN, direction=direction, layout=layout,
                            **(extra or {}))
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                        for n, s in [("x", x_shape)] + [(s, h_shape) for s in states]],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    sizes = lambda shape: tuple(d if isinstance(d, int) else BATCH for d in shape)  # noqa: E731
    feeds = {"x": rng.standard_normal(sizes(x_shape)).astype(np.float32)}
    feeds.update({s: rng.standard_normal(sizes(h_shape)).astype(np.float32) for s in states})
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString(), feeds


def reference(op: str, direction: str, layout: int, with_state: bool, extra: dict | None,
              feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if layout == 0:
        return ort_run(rnn_proto(op, direction, 0, with_state, extra)[0], feeds)
    proto, _ = rnn_proto(op, direction, 0, with_state, extra)
    outs = ort_run(proto, {k: v.transpose(1, 0, 2) for k, v in feeds.items()})
    return [outs[0].transpose(2, 0, 1, 3), *(o.transpose(1, 0, 2) for o in outs[1:])]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction,layout,with_state", [("forward", 0, False), ("reverse", 0, True),
                                                          ("bidirectional", 0, True), ("bidirectional", 1, False)])
def test_rnn_matches_onnxruntime(tmp_path: Path, op: str, direction: str, layout: int, with_state: bool) -> None:
    proto, feeds = rnn_proto(op, direction, layout, with_state)
    (tmp_path / "m.onnx").write_bytes(proto)
    model = qcc.load(tmp_path / "m.onnx")
    assert {n.op for n in model.graph.nodes} <= {"Split", "Squeeze", "Dense", "Add", "Sub", "Mul", "Sigmoid", "Tanh",
                                                 "Unsqueeze", "Concat"}
    got = qcc.run(model, feeds)
    for want, value in zip(reference(op, direction, layout, with_state, None, feeds), model.graph.outputs):
        assert close(got[value.name], want, 2e-6), value.name


def test_gru_linear_before_reset_0(tmp_path: Path) -> None:
    extra = {"linear_before_reset": 0}
    proto, feeds = rnn_proto("GRU", "forward", 0, True, extra)
    (tmp_path / "m.onnx").write_bytes(proto)
    model = qcc.load(tmp_path / "m.onnx")
    for want, value in zip(ort_run(proto, feeds), model.graph.outputs):
        assert close(qcc.run(model, feeds)[value.name], want, 2e-6)


def test_unsupported_rnn_is_one_line(tmp_path: Path) -> None:
    proto, _ = rnn_proto("LSTM", "forward", 0, False, {"clip": 3.0})
    (tmp_path / "m.onnx").write_bytes(proto)
    with pytest.raises(UnsupportedError, match=r"\(LSTM\): clip and input_forget are not supported") as exc:
        qcc.load(tmp_path / "m.onnx")
    assert "\n" not in str(exc.value)


def test_rnn_in_c(tmp_path: Path) -> None:
    """A bidirectional LSTM with a symbolic batch (layout 1): C float and affine int8 (the GRU
    cell is made of the same ops)."""
    proto, _ = rnn_proto("LSTM", "bidirectional", 1, False, batch="N")
    (tmp_path / "m.onnx").write_bytes(proto)

    def build() -> qcc.Model:
        model = qcc.load(tmp_path / "m.onnx")
        model.graph.outputs = model.graph.outputs[:1]
        model.graph.cleanup()
        return model

    check_c(tmp_path, build, {"x": np.random.default_rng(3).standard_normal((6, STEPS, WIDTH)).astype(np.float32)},
            sanitize=False)
