"""Issue 17 item 2: already-quantized ONNX models in (QDQ and QOperator) as IR annotations.

qcc's own onnx-qdq output comes back with the same annotations and the same simulator outputs,
bit for bit; onnxruntime's quantize_static (run here on the bundled digits CNN) re-targets to the
C affine int8 mode, bit-exact with qcc's integer simulator and within the steps the arithmetic
allows of onnxruntime running the QDQ file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import qcc
from qcc.errors import UnsupportedError
from qcc.frontends.onnx_quant import same_values
from qcc.ir.types import Affine
from qcc.sim.affine_int import run_affine_int
from qcc.sim.interpreter import run_model
from tests import ort_quant
from tests.cli_util import DIGITS, one_error_line
from tests.cli_util import qcc as run_qcc


def _calib() -> dict[str, np.ndarray]:
    return {"x": np.load(DIGITS / "calib.npz")["x"][:32]}


def _test_x(n: int = 120) -> np.ndarray:
    return np.load(DIGITS / "test.npz")["x"][:n]


@pytest.fixture(scope="module")
def ort_qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ortq") / "digits_qdq.onnx"
    ort_quant.quantize_static(DIGITS / "digits_cnn.onnx", out, _calib())
    return out


@pytest.mark.parametrize("storage", ["annotated", "ort"])
def test_qcc_qdq_output_reimports_with_its_annotations_bit_for_bit(tmp_path: Path, storage: str) -> None:
    out = tmp_path / "digits_int8.onnx"
    original, _ = qcc.compile(DIGITS / "digits_cnn.onnx", out, target=f"onnx-qdq{{storage={storage}}}",
                              quantize="int8", calib=str(DIGITS / "calib.npz"))
    back = qcc.load(out)
    # the same graph (the Relus the writer folded into their quantization come back) and names
    assert [n.op for n in back.graph.nodes] == [n.op for n in original.graph.nodes]
    before = {v.name: v.quant for v in original.graph.values()}
    after = {v.name: v.quant for v in back.graph.values()}
    assert set(after) == set(before)
    for name, quant in after.items():
        assert isinstance(quant, Affine), name
        if storage == "annotated":
            assert quant == before[name], name
        else:  # int8 stored as uint8 with zero point + 128: other integers, the same values
            assert same_values(quant, before[name]), name  # type: ignore[arg-type]
    x = _test_x()
    want = run_model(original, {"x": x}, quantized=True)["logits"]
    got = run_model(back, {"x": x}, quantized=True)["logits"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(run_affine_int(back, {"x": x})["logits"], run_affine_int(original, {"x": x})["logits"])
    proc = run_qcc("inspect", str(out))
    assert proc.returncode == 0 and "conv1" in proc.stdout and "Relu" in proc.stdout, proc.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_quantize_static_qdq_retargets_to_c_int8(ort_qdq: Path, tmp_path: Path) -> None:
    from tests.test_backend_c import build, run_c

    model, report = qcc.compile(ort_qdq, tmp_path / "ortq_c", eval=str(DIGITS / "test.npz"))
    assert report["eval"]["arithmetic"].startswith("integer affine")
    assert not report["float_fallbacks"]
    assert all(isinstance(v.quant, Affine) for v in model.graph.values())
    exe = build(model, tmp_path / "ortq_build", sanitize=False)
    x = _test_x()
    got = run_c(exe, x, 10)
    assert np.array_equal(got.view(np.uint32), run_affine_int(model, {"x": x})["logits"].view(np.uint32))
    # onnxruntime running the QDQ file as its ops define it (DequantizeLinear -> float op -> Q):
    # qcc's fake-quant reading of the imported model differs only where float summation order
    # moves a value across a rounding boundary, which the next layers carry on as a few
    # one-step changes of the output; the integer code requantizes with 31-bit multipliers and
    # may add one more step
    ort = ort_quant.run(ort_qdq, {"x": x}, optimize=False)
    step = model.graph.outputs[0].quant.scale[0]  # type: ignore[union-attr]
    fake = run_model(model, {"x": x}, quantized=True)["logits"]
    assert np.abs(fake - ort).max() <= step * 1.001 and np.mean(fake != ort) < 0.1
    assert np.abs(got - ort).max() <= 2 * step * 1.001
    assert np.mean(got.argmax(1) == ort.argmax(1)) >= 0.99


def test_quantize_static_qoperator_imports_like_its_qdq(ort_qdq: Path, tmp_path: Path) -> None:
    qop = tmp_path / "digits_qop.onnx"
    ort_quant.quantize_static(DIGITS / "digits_cnn.onnx", qop, _calib(), quant_format="QOperator")
    model = qcc.load(qop)
    from_qdq = qcc.load(ort_qdq)
    assert {n.op for n in model.graph.nodes} == {n.op for n in from_qdq.graph.nodes}
    def weights(m: qcc.Model) -> list[object]:
        return [n.input(1).quant for n in m.graph.nodes if n.op in ("Conv", "Dense")]

    assert weights(model) == weights(from_qdq)
    x = _test_x()
    ort = ort_quant.run(qop, {"x": x}, optimize=False)
    fake = run_model(model, {"x": x}, quantized=True)[model.graph.outputs[0].name]
    step = model.graph.outputs[0].quant.scale[0]  # type: ignore[union-attr]
    assert np.abs(fake - ort).max() <= step * 1.001 and np.mean(fake != ort) < 0.1


def _onnx_model(nodes: list, inits: dict[str, np.ndarray], path: Path) -> Path:  # type: ignore[type-arg]
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    graph = h.make_graph(nodes, "q", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def test_integer_computation_qcc_cannot_read_is_refused_by_name(tmp_path: Path) -> None:
    from onnx import helper as h

    params = {"s": np.array(0.1, np.float32), "z": np.array(0, np.uint8), "s2": np.array(0.2, np.float32)}
    dynamic = [h.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"], name="dyn"),
               h.make_node("DequantizeLinear", ["q", "qs", "qz"], ["y"], name="dq")]
    line = one_error_line(run_qcc("inspect", str(_onnx_model(dynamic, {}, tmp_path / "dyn.onnx"))))
    assert "DynamicQuantizeLinear (nodes 'dyn')" in line, line
    mismatch = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
                h.make_node("DequantizeLinear", ["q", "s2", "z"], ["y"], name="dq2")]
    with pytest.raises(UnsupportedError, match=r"node 'dq2' \(DequantizeLinear\): dequantizes 'q' with other "):
        qcc.load(_onnx_model(mismatch, params, tmp_path / "mismatch.onnx"))
    arithmetic = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
                  h.make_node("Neg", ["q"], ["y"], name="neg_int")]
    with pytest.raises(UnsupportedError, match=r"'neg_int' \(Neg\): computes on the integers of 'q'"):
        qcc.load(_onnx_model(arithmetic, params, tmp_path / "arith.onnx"))


def test_qdq_model_to_nnb_needs_fixed_point_and_gets_it_by_requantizing(ort_qdq: Path, tmp_path: Path) -> None:
    line = one_error_line(run_qcc("compile", str(ort_qdq), "-o", str(tmp_path / "a.nnb")))
    assert ".nnb stores fixed point" in line and "--quantize fixed8" in line, line
    assert not (tmp_path / "a.nnb").exists()
    model, _ = qcc.compile(ort_qdq, tmp_path / "b.nnb", quantize="fixed8", calib=str(DIGITS / "calib.npz"))
    from qcc.ir.types import FixedPoint

    assert (tmp_path / "b.nnb").stat().st_size > 0
    assert all(isinstance(v.quant, FixedPoint) for v in model.graph.inputs)
