"""Pools with end-only pads (TensorFlow's SAME, [0, 0, 1, 1]) in .nnb: nnabla's pooling with
ignore_border=False and pad 0, whose windows run past the end and are clipped there.

Oracles: onnxruntime for the float semantics (the decoded float file run by qcc's simulator),
qcc's fixed-point simulator for FIXED8 (the decoded file integer for integer), and nnablart
itself when a build is found (QCC_NNABLART).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from qcc.backends.nnb.format import DataType, read_nnb
from qcc.backends.nnb.lift import lift_nnb

import qcc
from qcc.errors import UnsupportedError
from qcc.sim.fixed import FixedRunner, fixed_of, quantize_round
from tests.nnb_util import nnablart, run_nnablart
from tests.op_check import onnx_model

SAME = [0, 0, 1, 1]  # TF SAME (kernel 3 stride 2 on 10, kernel 2 stride 2 on 5): only the last window is short


def same_pool_proto(avg_include_pad: int = 0, max_pads: list[int] = SAME, max_strides: int = 2) -> bytes:
    """Conv -> MaxPool(3, 2, SAME) -> Conv -> AvgPool(2, 2, SAME, exclusive) on an Nx3x10x10 input
    (SAME on 10 and on 5: pads [0, 0, 1, 1] both times)."""
    rng = np.random.default_rng(7)
    inits = {"w1": (rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32),
             "b1": (rng.standard_normal(4) * 0.1).astype(np.float32),
             "w2": (rng.standard_normal((4, 4, 1, 1)) * 0.4).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c1"], ["p1"], kernel_shape=[3, 3], strides=[max_strides] * 2, pads=max_pads,
                         name="maxpool_same"),
        helper.make_node("Conv", ["p1", "w2"], ["c2"]),
        helper.make_node("AveragePool", ["c2"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=SAME,
                         count_include_pad=avg_include_pad, name="avgpool_same"),
    ]
    return onnx_model(nodes, {"x": ("N", 3, 10, 10)}, {"y": None}, inits, opset=13)


def images(n: int) -> np.ndarray:
    return np.random.default_rng(11).standard_normal((n, 3, 10, 10)).astype(np.float32)


def emulate(path: Path, x: np.ndarray) -> np.ndarray:
    """The .nnb decoded to IR and run by qcc's simulator (stored values: integers if fixed)."""
    lifted = lift_nnb(read_nnb(path.read_bytes(), str(path)))
    return FixedRunner(lifted).run_stored({lifted.graph.inputs[0].name: x})[lifted.graph.outputs[0].name]


def pool_functions(path: Path) -> list[tuple[str, bool, tuple[int, ...]]]:
    """(function, ignore_border, pad) of each pooling in the file, as `qcc inspect` decodes them."""
    from qcc.backends.nnb.inspect import describe_nnb

    functions = describe_nnb(read_nnb(path.read_bytes(), str(path)))["functions"]
    return [(f["function"], bool(f["args"]["ignore_border"]), tuple(f["args"]["pad"]))
            for f in functions if f["function"].endswith("Pooling")]


def test_same_pads_are_ignore_border_false_and_match_onnxruntime(tmp_path: Path) -> None:
    import onnxruntime as ort

    source = tmp_path / "same.onnx"
    source.write_bytes(same_pool_proto())
    x = images(4)
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    out = tmp_path / "same.nnb"
    qcc.compile(source, out)
    assert pool_functions(out) == [("MaxPooling", False, (0, 0)), ("AveragePooling", False, (0, 0))]
    for i in range(len(x)):
        want = session.run(None, {"x": x[i:i + 1]})[0]
        assert want.shape == (1, 4, 3, 3)
        # float32 sums of 27 products then 4-element means: a few float32 ulps of the magnitudes
        np.testing.assert_allclose(emulate(out, x[i:i + 1]), want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_fixed8_file_is_the_simulator_bit_for_bit(tmp_path: Path) -> None:
    source = tmp_path / "same.onnx"
    source.write_bytes(same_pool_proto())
    x = images(6)
    np.savez(tmp_path / "calib.npz", x=x)
    out = tmp_path / "same8.nnb"
    model, _ = qcc.compile(source, out, quantize="fixed8", calib=str(tmp_path / "calib.npz"))
    assert pool_functions(out) == [("MaxPooling", False, (0, 0)), ("AveragePooling", False, (0, 0))]
    want = FixedRunner(model).run_stored({"x": x})[model.graph.outputs[0].name]
    np.testing.assert_array_equal(emulate(out, x), want)


@pytest.mark.skipif(nnablart() is None, reason="no nnablart build (set QCC_NNABLART)")
@pytest.mark.parametrize("scheme", ["none", "fixed8"])
def test_nnablart_runs_same_pads_as_the_simulator(tmp_path: Path, scheme: str) -> None:
    binary = nnablart()
    assert binary is not None
    source = tmp_path / "same.onnx"
    source.write_bytes(same_pool_proto())
    x = images(4)
    np.savez(tmp_path / "calib.npz", x=x)
    out = tmp_path / f"{scheme}.nnb"
    model, _ = qcc.compile(source, out, quantize=scheme, calib=str(tmp_path / "calib.npz") if scheme != "none" else None)
    nnb = read_nnb(out.read_bytes(), str(out))
    dtype = {DataType.FLOAT: np.float32, DataType.INT8: np.int8}[nnb.variables[nnb.outputs[0]].dtype]
    fixed = fixed_of(model.graph.inputs[0])
    for i in range(len(x)):
        raw = quantize_round(x[i:i + 1], fixed).astype(np.int8) if fixed is not None else x[i:i + 1]
        (got,) = run_nnablart(binary, out, [raw], tmp_path)
        want = FixedRunner(model).run_stored({"x": x[i:i + 1]})[model.graph.outputs[0].name].reshape(-1)
        if scheme == "none":  # float32 convolutions summed in another order: a few ulps
            np.testing.assert_allclose(np.frombuffer(got, dtype), want, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(np.frombuffer(got, dtype).astype(np.int64), want)


@pytest.mark.parametrize("proto,node,pads", [
    (lambda: same_pool_proto(avg_include_pad=1), "avgpool_same", "[0, 0, 1, 1]"),  # counts the end pad
    (lambda: same_pool_proto(max_strides=1), "maxpool_same", "[0, 0, 1, 1]"),  # one window fewer than nnabla's
])
def test_inexpressible_pads_are_one_line_naming_node_and_pads(tmp_path: Path, proto: Callable[[], bytes], node: str,
                                                       pads: str) -> None:
    source = tmp_path / "m.onnx"
    source.write_bytes(proto())
    out = tmp_path / "m.nnb"
    with pytest.raises(UnsupportedError) as exc:
        qcc.compile(source, out)
    message = str(exc.value)
    assert f"'{node}'" in message and pads in message and "nnb" in message and "\n" not in message
    assert not out.exists()


def test_nnp_writer_shares_the_rule_and_nnabla_agrees(tmp_path: Path) -> None:
    """The .nnp writer emits the same ignore_border=False pools (one rule); nnabla runs the file
    to onnxruntime's output."""
    import onnxruntime as ort

    from tests.nnabla_zoo import nnabla_run

    source = tmp_path / "same.onnx"
    source.write_bytes(same_pool_proto())
    x = images(3)
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    qcc.compile(source, tmp_path / "same.nnp")
    got, functions = nnabla_run(tmp_path / "same.nnp", x)
    assert "MaxPooling" in functions and "AveragePooling" in functions
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
