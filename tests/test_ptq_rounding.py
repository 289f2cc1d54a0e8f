"""Learned rounding and W4A8 (issue 18, item 3).

Oracles: the float model, onnxruntime running the int4 QDQ file, the reconstruction error
computed from the Gram matrices against the one computed from the data itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qcc.driver import compile as qcc_compile
from qcc.driver import load
from qcc.ir.fakequant import apply_annotation
from qcc.ir.types import Affine
from qcc.pm import PassContext, PassManager
from qcc.quant.adaround import Gram, learn_rounding, patches, reconstruction_error
from tests import ort_quant
from tests.cli_util import DIGITS, one_error_line, qcc

TEST = np.load(DIGITS / "test.npz")
FEEDS = {"x": TEST["x"]}


def compile_both_roundings(tmp: Path, suffix: str, default: str | None = None, **options: Any) -> dict[str, Any]:
    """digits_cnn compiled with learned and with nearest rounding (`default`'s without --rounding):
    rounding -> (path, model, report)."""
    out = {}
    for rounding in ("learned", "nearest"):
        path = tmp / f"digits_{rounding}{suffix}"
        model, report = qcc_compile(str(DIGITS / "digits_cnn.onnx"), path, calib=str(DIGITS / "calib.npz"),
                                    eval=str(DIGITS / "test.npz"), rounding=None if rounding == default else rounding,
                                    **options)
        out[rounding] = (path, model, report)
    return out


@pytest.fixture(scope="module")
def w4a8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return compile_both_roundings(tmp_path_factory.mktemp("w4a8"), ".onnx", target="onnx-qdq", quantize="int4")


def test_w4a8_with_learned_rounding_is_within_two_points_of_float(w4a8: dict[str, Any]) -> None:
    _, _, learned = w4a8["learned"]
    _, _, nearest = w4a8["nearest"]
    assert learned["pipeline"][:5] == ["fold-bn", "calibrate", "quantize-affine", "learned-rounding", "bias-correct"]
    ev = learned["eval"]
    assert ev["quantized_accuracy"] >= ev["float_accuracy"] - 0.02
    gain = ev["output_sqnr_db"] - nearest["eval"]["output_sqnr_db"]
    assert gain >= 1.0, gain  # both bias-corrected; about 6 dB without bias correction (docs/benchmarks.md)
    for layer in learned["learned_rounding"]:
        assert layer["learned_sqnr_db"] >= layer["nearest_sqnr_db"]
    assert any(0 < layer["flipped"] < 0.5 for layer in learned["learned_rounding"])


def test_int4_weights_are_opset21_int4_in_the_qdq_file_and_run_in_onnxruntime(w4a8: dict[str, Any]) -> None:
    import onnx

    path, model, _ = w4a8["learned"]
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version >= 21
    int4 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT4]
    assert len(int4) == 2 * 7  # each Conv/Dense weight and its zero point
    from qcc.sim.interpreter import Interpreter

    fake = Interpreter(model, quantized=True).run(FEEDS)["logits"]
    plain = ort_quant.run(path, FEEDS, optimize=False)  # QDQ evaluated in float: what the annotations mean
    step = float(model.graph.outputs[0].quant.scale[0])  # type: ignore[union-attr]
    assert np.abs(plain - fake).max() <= step * 1.001
    fused = ort_quant.run(path, FEEDS)
    assert np.mean(fused.argmax(1) == fake.argmax(1)) >= 0.99


def test_learned_weights_are_grid_points_and_survive_reannotation() -> None:
    model = load(str(DIGITS / "digits_cnn.onnx"))
    ctx = PassContext(calib_data=dict(np.load(DIGITS / "calib.npz")))
    PassManager("fold-bn{standalone=conv},calibrate,quantize-affine{weight_dtype=int4},learned-rounding"
                "{iterations=200}").run(model, ctx)
    weights = {n.name: n.input(1) for n in model.graph.nodes if n.op in ("Conv", "Dense")}
    before = {k: (w.quant, w.const.copy()) for k, w in weights.items()}  # type: ignore[union-attr]
    for w in weights.values():
        assert isinstance(w.quant, Affine) and w.quant.dtype == "int4"
        assert np.array_equal(apply_annotation(w.const, w.quant), w.const)  # type: ignore[arg-type]
    PassManager("quantize-affine{weight_dtype=int4}").run(model, ctx)  # what sensitivity/accuracy-control do
    for name, w in weights.items():
        quant, const = before[name]
        assert np.array_equal(apply_annotation(const, w.quant), const), name
        assert np.allclose(np.asarray(w.quant.scale), np.asarray(quant.scale), rtol=1e-6)  # type: ignore[union-attr]


def test_gram_reconstruction_matches_the_data_and_learning_beats_nearest() -> None:
    rng = np.random.default_rng(0)
    mix = rng.standard_normal((6, 6))
    x = (rng.standard_normal((64, 6, 5, 5)).transpose(0, 2, 3, 1) @ mix).transpose(0, 3, 1, 2)  # correlated
    attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
    w = rng.standard_normal((1, 4, 6 * 9))
    xq = np.round(x * 8) / 8  # the quantized model's input
    gram = Gram()
    gram.add(patches(xq, (3, 3), attrs, 1), patches(x, (3, 3), attrs, 1))
    step = np.abs(w).max(axis=2, keepdims=True) / 7
    w_hat = np.clip(np.rint(w / step), -7, 7) * step
    px, pq = patches(x, (3, 3), attrs, 1)[0], patches(xq, (3, 3), attrs, 1)[0]
    direct = float(np.sum((w_hat[0] @ pq - w[0] @ px) ** 2) / px.shape[1])
    assert reconstruction_error(w_hat, w, gram) == pytest.approx(direct, rel=1e-9)
    result = learn_rounding(w, step, np.zeros_like(step), -8, 7, Gram(gram.qq, gram.qq, gram.qq, gram.count),
                            iterations=500)
    assert result.learned_error < 0.8 * result.nearest_error
    assert np.all(np.abs(result.q - np.rint(w / step)) <= 1)  # each weight rounded down or up, no further


def test_fixed8_with_learned_rounding_stays_on_its_positions() -> None:
    model = load(str(DIGITS / "digits_cnn.onnx"))
    ctx = PassContext(calib_data=dict(np.load(DIGITS / "calib.npz")))
    # nnabla-c-runtime's rules: the layers' inputs come from its truncating integer kernels
    PassManager("fold-bn,calibrate,assign-fixed-point{bits=8,rules=nnabla-c-runtime},"
                "learned-rounding{samples=64,iterations=200}").run(model, ctx)
    for node in model.graph.nodes:
        if node.op in ("Conv", "Dense"):
            w = node.input(1)
            assert np.array_equal(apply_annotation(w.const, w.quant), w.const)  # type: ignore[arg-type]
    assert all(e["learned_sqnr_db"] >= e["nearest_sqnr_db"] for e in ctx.report["learned_rounding"])


def test_rounding_needs_quantized_weights(tmp_path: Path) -> None:
    proc = qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(tmp_path / "b.onnx"), "--quantize",
               "binary-weight", "--rounding", "learned")
    assert proc.returncode == 2 and "--rounding learned" in one_error_line(proc)
    assert not (tmp_path / "b.onnx").exists()
