"""Target c, affine int8/uint8 mode: equal to qcc.sim.affine_int bit for bit, close to the QDQ reading.

The generated code is built strictly and run under ASan/UBSan (tests/test_backend_c.py's
harness). The integer simulator is itself checked against the fake-quant simulator (what ONNX
Runtime computes for the same annotations) and against onnxruntime on the QDQ model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from qcc.backends.c import BACKEND, generate

import qcc
import qcc.driver
from qcc.errors import UnsupportedError
from qcc.ir.core import Graph, Model
from qcc.ir.types import Affine, TensorType
from qcc.pm import PassContext, PassManager, build_passes
from qcc.sim.affine_int import common_params, requant_params, rshift, run_affine_int
from qcc.sim.interpreter import run_model
from tests.test_backend_c import (
    assert_no_heap_vla_or_recursion,
    build,
    coverage_model,
    quantized_squeezenet,
    run_c,
)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"


def test_requantization_arithmetic() -> None:
    rng = np.random.default_rng(0)
    for multiplier in np.exp(rng.uniform(-20, 5, 500)):
        m, s = requant_params(float(multiplier))
        assert 2**30 <= m < 2**31
        assert abs(m * 2.0**-s - multiplier) <= multiplier * 2.0**-30
    m, s = requant_params(1e-14)  # below 2**-32 the shift stops at 62: fewer significant bits
    assert s == 62 and abs(m * 2.0**-62 - 1e-14) <= 2.0**-63
    (ma, mb), s = common_params([0.5, 0.001])
    assert ma == 2**30 and s == 31 and mb == round(0.001 * 2**31)
    v = np.array([5, -5, 6, -6, 7, -7, 0])
    assert rshift(v, 1).tolist() == [3, -3, 3, -3, 4, -4, 0]  # half away from zero
    assert rshift(v, 0).tolist() == v.tolist()


ASYMMETRIC = "fold-bn,calibrate,quantize-affine{weight_symmetric=false,weight_dtype=uint8,symmetric=true}"


@pytest.mark.parametrize(("scheme", "passes"), [
    ("int8", None), ("uint8", None), ("int8", "fold-bn,calibrate,quantize-affine{per_channel=false}"),
    ("int8", ASYMMETRIC),  # uint8 weights with zero points: centered weights need int16 (conv2: dot products;
    # conv1 has 9 taps per output and runs on the tiled kernel, int32 weights in every scheme)
])
def test_digits_affine_is_bit_exact_and_keeps_accuracy(tmp_path: Path, scheme: str, passes: str | None) -> None:
    out = tmp_path / f"digits_{scheme}"
    # --passes replaces the scheme's pipeline: giving both is a usage error (issue 16)
    model, report = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out, target="c",
                                       quantize=scheme if passes is None else "none",
                                       passes=passes, calib=str(DIGITS / "calib.npz"),
                                       eval=str(DIGITS / "test.npz"))
    assert "affine" in (out / f"{out.name}.h").read_text().split("Numeric mode:")[1].splitlines()[0]
    assert ("static const int16_t qcc_w_conv2" in (out / f"{out.name}.c").read_text()) == (passes == ASYMMETRIC)
    test = np.load(DIGITS / "test.npz")
    x, labels = test["x"], test["labels"]
    exe = build(model, tmp_path / "harness_build")
    got = run_c(exe, x, 10)
    want = run_affine_int(model, {"x": x})["logits"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    fake = run_model(model, {"x": x}, quantized=True)["logits"]
    floats = run_model(qcc.driver.load(str(DIGITS / "digits_cnn.onnx")), {"x": x})["logits"]
    assert np.mean(got.argmax(1) == fake.argmax(1)) >= 0.995
    assert np.mean(got.argmax(1) == labels) >= np.mean(floats.argmax(1) == labels) - 0.005
    # --eval simulates what the target computes: its accuracy is the C program's
    assert report["eval"]["arithmetic"].startswith("integer affine")
    assert report["eval"]["quantized_accuracy"] == np.mean(got.argmax(1) == labels)
    scale = model.graph.outputs[0].quant.scale[0]  # type: ignore[union-attr]
    assert np.max(np.abs(got - fake)) <= scale * 1.01  # at most one output step from the QDQ reading


def _annotate_affine(model: Model, calib: dict[str, np.ndarray], dtype: str, seed: int) -> Model:
    """quantize-affine on the coverage model, then every activation's scale and zero point moved,
    so each op requantizes between different annotations."""
    ctx = PassContext()
    ctx.calib_data = calib
    passes = build_passes(f"calibrate,quantize-affine{{dtype={dtype}}}")
    model = PassManager(passes).run(model, ctx).model
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    for node in model.graph.nodes:
        for value in node.outputs:
            quant = value.quant
            assert isinstance(quant, Affine), value.name
            zp = int(np.clip(quant.zero_point[0] + rng.integers(-6, 7), lo, hi))
            value.quant = Affine((quant.scale[0] * float(rng.uniform(0.7, 1.4)),), (zp,), dtype)
    return model


def affine_coverage_model() -> Model:
    """The float coverage model's ops that have an affine kernel, plus the lookup-table ops."""
    model = coverage_model(fixed_only=True)
    g = model.graph
    cat = g.node_map()["concat"].outputs[0]
    hs = g.add("HardSigmoid", cat, name="hardsigmoid")
    hw = g.add("HardSwish", cat, name="hardswish")
    mx = g.add("Max", hw, g.add("Exp", hs, name="exp"), name="max")
    mn = g.add("Min", mx, g.add("Neg", cat, name="neg"), name="min")
    g.outputs = [*g.outputs, g.add("Silu", g.add("Abs", mn, name="abs"), name="silu")]
    return model


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_affine_coverage_is_bit_exact(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(3)
    calib = {"x": rng.standard_normal((16, 4, 9, 9)).astype(np.float32)}
    model = _annotate_affine(affine_coverage_model(), calib, dtype, seed=len(dtype))
    ops = {n.op for n in model.graph.nodes}
    assert {"Conv", "BatchNorm", "Dense", "Softmax", "AvgPool", "GlobalMaxPool", "Transpose", "Mul", "Max"} <= ops
    exe = build(model, tmp_path / f"cov_{dtype}")
    assert_no_heap_vla_or_recursion(tmp_path / f"cov_{dtype}" / f"cov_{dtype}.c")
    x = rng.standard_normal((30, 4, 9, 9)).astype(np.float32) * 1.5  # some saturation
    size = sum(int(np.prod([d if isinstance(d, int) else 1 for d in v.type.shape])) for v in model.graph.outputs)
    got = run_c(exe, x, size)
    results = run_affine_int(model, {"x": x})
    want = np.concatenate([results[v.name].reshape(len(x), -1) for v in model.graph.outputs], axis=1)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the integer arithmetic reads like the float (fake-quant) simulation, op for op
    fake = run_model(model, {"x": x}, quantized=True)
    for value in model.graph.outputs:
        step = value.quant.scale[0]  # type: ignore[union-attr]
        close = np.abs(results[value.name] - fake[value.name]) <= step * 1.01
        assert close.mean() >= 0.97, (value.name, close.mean())


def test_overflowing_accumulator_and_mixed_models_are_refused(tmp_path: Path) -> None:
    g = Graph("wide")
    x = g.add_input("x", TensorType("float32", (1, 140000)))
    w = g.add_constant("w", np.ones((140000, 2), np.float32))
    g.outputs = [g.add("Dense", x, w, name="huge_dot")]
    model = Model(g)
    for value in (x, g.outputs[0]):
        value.quant = Affine((1.0,), (0,), "int8")
    w.quant = Affine((1 / 127,), (0,), "int8")
    out = tmp_path / "wide"
    with pytest.raises(UnsupportedError, match=r"huge_dot.*int32 accumulator"):
        BACKEND.write(model, out)
    assert not out.exists()
    digits = qcc.driver.load(str(DIGITS / "digits_cnn.onnx"))
    digits.graph.inputs[0].quant = Affine((0.1,), (0,), "int8")
    with pytest.raises(UnsupportedError, match=r"'conv1' \(output of node 'conv1', Conv\) is float while other "
                                               "activations are affine"):
        generate(digits, "m")


def test_squeezenet_int8_is_bit_exact_and_agrees_with_onnxruntime_qdq(tmp_path: Path) -> None:
    from tests.onnx_zoo import ort_run

    src, name, model, rng = quantized_squeezenet(tmp_path, tmp_path / "qdq.onnx", "int8")
    exe = build(model, tmp_path / "squeeze_i8", sanitize=False)
    x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
    got = run_c(exe, x, 2000)
    want = np.concatenate([np.concatenate([r[v.name].reshape(1, -1) for v in model.graph.outputs], axis=1)
                           for r in (run_affine_int(model, {name: x[i:i + 1]}) for i in range(len(x)))])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    logits = got[:, 1000:]
    assert len(np.unique(logits)) > 50
    qcc.write(model, tmp_path / "qdq_logits.onnx", target="onnx-qdq")  # ORT gives the logits too
    qdq = (tmp_path / "qdq_logits.onnx").read_bytes()
    ort_logits = np.concatenate([ort_run(qdq, {name: x[i:i + 1]})[1].reshape(1, -1) for i in range(len(x))])
    float_model = qcc.driver.load(str(src))
    float_logits = next(n for n in float_model.graph.nodes if n.op == "Softmax").input(0)
    float_model.graph.outputs = [float_logits]
    ref = np.concatenate([run_model(float_model, {name: x[i:i + 1]})[float_logits.name].reshape(1, -1)
                          for i in range(len(x))])

    def sqnr(a: np.ndarray) -> float:
        return float(10 * np.log10(np.sum(ref**2) / np.sum((a - ref) ** 2)))

    # the integer C code is as close to the float model as ONNX Runtime running the QDQ model
    assert np.array_equal(logits.argmax(1), ref.argmax(1))
    assert sqnr(logits) >= sqnr(ort_logits) - 0.5, (sqnr(logits), sqnr(ort_logits))


@pytest.mark.parametrize("scheme", ["int4", "uint4"])
def test_four_bit_weights_run_in_c_bit_exact(tmp_path: Path, scheme: str) -> None:
    """W4A8 (issue 18): 4-bit weights run on the 8-bit kernels, their integers within 4 bits."""
    from qcc.sim.affine_int import weight_ints

    out = tmp_path / f"digits_{scheme}"
    model, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out, target="c", quantize=scheme,
                                  rounding="nearest", calib=str(DIGITS / "calib.npz"))
    convs = [n for n in model.graph.nodes if n.op in ("Conv", "Dense")]
    assert convs and all(n.input(1).quant.dtype == scheme for n in convs)  # type: ignore[union-attr]
    for node in convs:  # centered: int4 in [-8, 7]; uint4 minus its zero point within 15 of zero
        ints = weight_ints(node)
        assert ints.min() >= (-8 if scheme == "int4" else -15) and ints.max() <= (7 if scheme == "int4" else 15)
    x = np.load(DIGITS / "test.npz")["x"]
    got = run_c(build(model, tmp_path / "harness_build"), x, 10)
    want = run_affine_int(model, {"x": x})["logits"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
