"""Target onnx-qdq: valid ONNX that ONNX Runtime runs in integer kernels, matching qcc's simulation.

Oracles: onnx.checker / shape inference, ONNX Runtime (its optimized graph tells which ops it
fused into integer kernels), onnxruntime.quantization.quantize_static on the same calibration
data, and qcc's own simulation of the annotated model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import qcc
from qcc.driver import compile as qcc_compile
from qcc.ir.core import Model
from qcc.ir.types import Affine, FixedPoint, TensorType
from qcc.sim.interpreter import Interpreter, run_batched
from qcc.testing import make_model
from tests import ort_quant
from tests.cli_util import DIGITS

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

TEST = np.load(DIGITS / "test.npz")
FEEDS = {"x": TEST["x"]}


def compile_digits(out: Path, scheme: str, **options: Any) -> tuple[Model, dict[str, Any]]:
    return qcc_compile(DIGITS / "digits_cnn.onnx", out, target="onnx-qdq", quantize=scheme,
                       calib=str(DIGITS / "calib.npz"), **options)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Model, dict[str, Any], Path]]:
    tmp = tmp_path_factory.mktemp("qdq")
    out = {}
    for scheme in ("uint8", "int8", "fixed8"):
        path = tmp / f"digits_{scheme}.onnx"
        model, report = compile_digits(path, scheme)
        out[scheme] = (model, report, path)
    return out


def initializer(proto: Any, name: str) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == name)


def test_valid_onnx_keeping_names_shapes_and_metadata(compiled: dict[str, Any]) -> None:
    _, report, path = compiled["uint8"]
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    source = onnx.load(str(DIGITS / "digits_cnn.onnx"))

    def interface(p: Any) -> list[tuple[str, list[Any]]]:
        return [(v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
                for v in list(p.graph.input) + list(p.graph.output)]

    assert interface(proto) == interface(source)
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["qcc.version"] == qcc.__version__
    assert props["qcc.pipeline"] == ",".join(report["pipeline"]) == "fold-bn,calibrate,quantize-affine,bias-correct"
    assert proto.opset_import[0].version >= 13
    assert report["target"] == "onnx-qdq" and report["float_fallbacks"] == []


@pytest.mark.parametrize("scheme", ["uint8", "int8", "fixed8"])
def test_ort_runs_every_op_in_integer_kernels(compiled: dict[str, Any], scheme: str) -> None:
    assert not ort_quant.float_ops(compiled[scheme][2])
    ops = ort_quant.fused_ops(compiled[scheme][2])
    assert ops["QLinearConv"] == 6 and ops["QGemm"] == 1 and ops["QLinearAdd"] == 1 and ops["QLinearConcat"] == 1
    assert ops["Relu"] == 0  # folded into the quantization of the producing Conv/Add (fixed8: a requantization)


@pytest.mark.parametrize("scheme", ["uint8", "int8", "fixed8"])
def test_ort_outputs_match_qcc_simulation(compiled: dict[str, Any], scheme: str) -> None:
    model, _, path = compiled[scheme]
    fused = ort_quant.run(path, FEEDS)
    sim = run_batched(model, FEEDS, quantized=True)["logits"]
    assert np.mean(fused.argmax(1) == sim.argmax(1)) >= 0.995
    # value-by-value fake quantization is what QDQ means; ORT without fusion evaluates exactly
    # that in float, and it is what run_model simulates for a QDQ model, fixed point included
    # (its values round to nearest: nnabla-c-runtime's truncating kernels are not QDQ's)
    fake = Interpreter(model, quantized=True).run(FEEDS)["logits"]
    assert np.array_equal(fake, sim)
    plain = ort_quant.run(path, FEEDS, optimize=False)
    quant = model.graph.outputs[0].quant
    step = quant.step if isinstance(quant, FixedPoint) else quant.scale[0]
    assert np.abs(plain - fake).max() <= step * 1.001
    assert np.mean(np.abs(plain - fake) > 1e-6) < 0.01
    assert np.mean(np.abs(fused - fake) > 1e-6) < 0.05  # integer kernels: requantization rounding only


def test_accuracy_not_below_quantize_static(compiled: dict[str, Any], tmp_path: Path) -> None:
    calib = dict(np.load(DIGITS / "calib.npz"))
    best = 0.0
    for method in ort_quant.ORT_METHODS:
        for per_channel in (True, False):
            out = tmp_path / f"ort_{method}_{per_channel}.onnx"
            ort_quant.quantize_static(DIGITS / "digits_cnn.onnx", out, calib, method, per_channel)
            best = max(best, ort_quant.top1(ort_quant.run(out, FEEDS), TEST["labels"]))
    ours = ort_quant.top1(ort_quant.run(compiled["uint8"][2], FEEDS), TEST["labels"])
    assert best > 0.9 and ours >= best


@pytest.mark.parametrize("storage, act, weight", [("ort", np.uint8, np.uint8), ("ort-vnni", np.uint8, np.int8),
                                                   ("annotated", np.int8, np.int8)])
def test_int8_storage_keeps_values(compiled: dict[str, Any], storage: str, act: type, weight: type) -> None:
    from qcc.backends.onnx_qdq import to_qdq

    model, _, path = compiled["int8"]
    assert model.graph.outputs[0].quant.dtype == "int8"
    proto, _ = to_qdq(model, storage=storage)
    assert {initializer(proto, n.input[2]).dtype for n in proto.graph.node if n.op_type == "QuantizeLinear"} == {
        np.dtype(act)}
    assert initializer(proto, "conv2.weight_quantized").dtype == np.dtype(weight)
    data = proto.SerializeToString()
    assert np.array_equal(ort_quant.run(data, FEEDS, optimize=False), ort_quant.run(path, FEEDS, optimize=False))
    if storage != "annotated":  # ORT on x86 fuses only uint8 activations
        assert not ort_quant.float_ops(data)


def test_fixed_point_gives_power_of_two_scales(compiled: dict[str, Any]) -> None:
    from qcc.backends.onnx_qdq import to_qdq

    proto, _ = to_qdq(compiled["fixed8"][0], storage="annotated")
    dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    assert dq
    for node in dq:
        scale = initializer(proto, node.input[1]).astype(np.float64)
        assert np.all(np.log2(scale) == np.round(np.log2(scale))), node.name
        zp = initializer(proto, node.input[2])
        assert not zp.any() and zp.dtype in (np.int8, np.int32), node.name


def test_int16_activations_need_opset_21(tmp_path: Path) -> None:
    out = tmp_path / "digits16.onnx"
    model, _ = compile_digits(out, "uint8", overrides=("bn5=INT16", "relu5=INT16"))
    quant = model.graph.value_map()["relu5"].quant
    assert isinstance(quant, Affine) and quant.dtype == "int16"
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == 21
    sim = run_batched(model, FEEDS, quantized=True)["logits"]
    assert np.mean(ort_quant.run(out, FEEDS).argmax(1) == sim.argmax(1)) >= 0.995


def test_unannotated_tensors_are_reported(compiled: dict[str, Any], tmp_path: Path) -> None:
    from qcc.backends.onnx_qdq import BACKEND

    model = compiled["uint8"][0]
    values = model.graph.value_map()
    saved = {n: values[n].quant for n in ("avgpool1", "flatten1")}
    try:
        for name in saved:
            values[name].quant = None
        fallbacks = BACKEND.write(model, tmp_path / "partial.onnx").float_fallbacks
    finally:
        for name, quant in saved.items():
            values[name].quant = quant
    assert {(f["tensor"], f["kind"]) for f in fallbacks} == {("avgpool1", "activation"), ("flatten1", "activation")}
    assert "fc" in next(f["reason"] for f in fallbacks if f["tensor"] == "flatten1")
    # exactly what the report lines announce runs in float: the pooling, the flatten and the Dense
    assert ort_quant.float_ops(tmp_path / "partial.onnx") == {"AveragePool": 1, "Flatten": 1, "Gemm": 1}


def _conv_relu(relu_zp: int, conv_quantized: bool) -> Model:
    rng = np.random.default_rng(0)

    def build(g: Any, x: Any) -> Any:
        w = g.add_constant("w", rng.standard_normal((4, 2, 3, 3)).astype(np.float32))
        b = g.add_constant("b", rng.standard_normal(4).astype(np.float32))
        y = g.add("Conv", x, w, b, name="conv", pads=[1, 1, 1, 1])
        return g.add("Relu", y, name="relu")

    model = make_model({"x": TensorType("float32", ("N", 2, 5, 5))}, build)
    values = model.graph.value_map()
    values["x"].quant = Affine((0.05,), (0,), "int8")
    values["w"].quant = Affine((0.02,) * 4, (0,) * 4, "int8", 0)
    values["relu"].quant = Affine((0.1,), (relu_zp,), "int8")
    if conv_quantized:
        values["conv"].quant = Affine((0.2,), (0,), "int8")
    return model


@pytest.mark.parametrize("relu_zp, conv_quantized", [(-128, False), (-128, True), (0, False)])
def test_relu_dropped_only_when_quantization_clamps_at_zero(relu_zp: int, conv_quantized: bool) -> None:
    from qcc.backends.onnx_qdq import to_qdq

    model = _conv_relu(relu_zp, conv_quantized)
    proto, fallbacks = to_qdq(model, storage="annotated")
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ("Relu" in ops) == (relu_zp != -128)
    assert ops.count("QuantizeLinear") == 2 + conv_quantized  # x, [conv], relu
    assert [f["tensor"] for f in fallbacks] == ([] if relu_zp == -128 or conv_quantized else ["conv"])
    bias = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "b")
    assert initializer(proto, bias.input[0]).dtype == np.int32
    assert np.allclose(initializer(proto, bias.input[1]), np.float32(0.05) * np.float32(0.02))
    x = np.random.default_rng(1).standard_normal((8, 2, 5, 5)).astype(np.float32)
    sim = run_batched(model, {"x": x}, quantized=True)["relu"]
    got = ort_quant.run(proto.SerializeToString(), {"x": x}, optimize=False)
    step = 0.2 if conv_quantized else 0.1  # a float-summation-order flip moves one step of the coarser scale
    assert np.abs(got - sim).max() <= step * 1.001 and np.mean(got != sim) < 0.02


@pytest.mark.parametrize("storage", ["ort", "annotated"])
def test_fixed_point_relu_becomes_an_exact_unsigned_requantization(storage: str) -> None:
    """Relu between equal signed zero-point-0 pairs (fixed point): Q(uint8) of the input's DQ, exact.

    'annotated' keeps every type as annotated, so there the Relu stays (in float).

    The weights are kept within 7 bits: 'annotated' stores them int8, which onnxruntime runs in
    its u8s8 kernels; on x86 without VNNI (AVX2) those add pairs of u8 x s8 products in int16
    (VPMADDUBSW) and saturate once 2 * 255 * |w_q| > 32767, i.e. for |w_q| >= 65 (docs/backends.md,
    storage). 7-bit weights make the integer result exact on every x86-64 CPU; the float QDQ run
    (graph optimizations off) then differs from it at most by one output step where float
    summation lands on the other side of a rounding boundary.
    """
    from qcc.backends.onnx_qdq import to_qdq

    model = _conv_relu(0, True)
    values = model.graph.value_map()
    values["conv"].quant = values["relu"].quant = FixedPoint(8, 4)
    w = values["w"]
    assert w.const is not None
    w.const = np.clip(w.const, -63 * 0.02, 63 * 0.02).astype(np.float32)  # |w_q| <= 63 at scale 0.02
    proto, _ = to_qdq(model, storage=storage)
    onnx.checker.check_model(proto, full_check=True)
    relu_q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.output[0].startswith("relu"))
    conv_zp = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.output[0].startswith("conv"))
    ops = [n.op_type for n in proto.graph.node]
    assert ("Relu" in ops) == (storage == "annotated")
    if storage == "ort":
        assert initializer(proto, relu_q.input[2]).dtype == np.uint8 and initializer(proto, relu_q.input[2]) == 0
        assert initializer(proto, conv_zp.input[2]).dtype == np.int8  # stays signed: see _fold_signed_relu
    x = np.random.default_rng(1).standard_normal((8, 2, 5, 5)).astype(np.float32) * 4
    sim = run_batched(model, {"x": x}, quantized=True)["relu"]
    data = proto.SerializeToString()
    integer, as_written = ort_quant.run(data, {"x": x}), ort_quant.run(data, {"x": x}, optimize=False)
    step = 2.0 ** -4
    assert np.abs(integer - as_written).max() <= step * 1.001 and np.mean(integer != as_written) < 0.01
    assert np.abs(integer - sim).max() <= step * 1.001
    if storage == "ort":
        assert not ort_quant.float_ops(data)


@pytest.fixture(scope="module")
def densenet_block(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    from tests.densenet_like import densenet_block_bytes, densenet_block_data

    tmp = tmp_path_factory.mktemp("densenet")
    src = tmp / "block.onnx"
    src.write_bytes(densenet_block_bytes())
    np.savez(tmp / "calib.npz", **densenet_block_data(8, seed=0))
    return src, tmp / "calib.npz", densenet_block_data(16, seed=1)


def test_densenet_block_not_below_quantize_static(densenet_block: Any, tmp_path: Path) -> None:
    """Caffe2-style BN -> Mul -> Add folded or made one integer Conv; Concat inputs keep their ranges."""
    src, calib, feeds = densenet_block
    out = tmp_path / "qcc.onnx"
    model, report = qcc_compile(src, out, target="onnx-qdq", quantize="uint8", calib=str(calib))
    ref = ort_quant.run(src, feeds)
    ours = ort_quant.sqnr_db(ort_quant.run(out, feeds), ref)
    ort_out = tmp_path / "ort.onnx"
    ort_quant.quantize_static(src, ort_out, dict(np.load(calib)), "MinMax", per_channel=True)
    theirs = ort_quant.sqnr_db(ort_quant.run(ort_out, feeds), ref)
    assert ours >= theirs > 20, (ours, theirs)
    assert not ort_quant.float_ops(out) and report["float_fallbacks"] == []
    assert ort_quant.float_ops(ort_out) == {"BatchNormalization": 7}  # what quantize_static leaves in float
    # mechanism: r7 (MaxPool output, read by a BatchNorm and a Concat) keeps its own range; r21
    # (a Conv output only the Concat reads) shares the Concat output's
    quant = {v.name: v.quant for v in model.graph.values()}
    assert quant["r7"] != quant["r22"] and quant["r21"] == quant["r22"]
    fake = Interpreter(model, quantized=True).run(feeds)["logits"]
    out_quant = model.graph.outputs[0].quant
    assert isinstance(out_quant, Affine)
    assert np.abs(ort_quant.run(out, feeds, optimize=False) - fake).max() <= out_quant.scale[0] * 1.001


def test_light_resnet50_runs_in_ort(tmp_path: Path) -> None:
    from tests.onnx_zoo import randomized_bytes

    src = tmp_path / "resnet50.onnx"
    src.write_bytes(randomized_bytes("resnet50"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((2, 3, 224, 224)).astype(np.float32))
    out = tmp_path / "resnet50_qdq.onnx"
    qcc_compile(src, out, target="onnx-qdq", quantize="uint8", calib=str(tmp_path / "calib.npz"))
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    (y,) = ort_quant.session(out).run(None, {proto.graph.input[0].name: x})
    assert y.shape == (1, 1000) and np.isfinite(y).all()
    assert ort_quant.fused_ops(out)["QLinearConv"] == 53
    assert not ort_quant.float_ops(out)


@pytest.mark.parametrize("scheme", ["uint8", "int8", "fixed8"])
@pytest.mark.parametrize("storage", ["ort", "annotated"])
def test_integers_quantized_ahead_on_threads_are_the_bytes_of_one_thread(
        compiled: dict[str, Any], monkeypatch: pytest.MonkeyPatch, scheme: str, storage: str) -> None:
    """QdqWriter.quantizing_ahead computes the weights' integers on the cores' threads while the graph
    is written: the serialized model is the one a single thread writes, and the islands of the report
    are those a fresh plan gives after the export (as serialize computed them before)."""
    import os
    import threading

    import qcc.backends.onnx_qdq as qdq

    model = compiled[scheme][0]
    ran_on: set[str] = set()
    integers = qdq.integers

    def spy(*args: Any) -> np.ndarray:
        ran_on.add(threading.current_thread().name)
        return integers(*args)

    monkeypatch.setattr(qdq, "integers", spy)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    one = qdq.to_qdq(model, storage)[0].SerializeToString()
    assert ran_on == {threading.current_thread().name}
    ran_on.clear()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    low = qdq.plan(model, storage)
    before = qdq.float_islands(model, low)
    proto, _ = qdq.to_qdq(model, storage, low)
    assert ran_on and all(name.startswith("qcc-qdq") for name in ran_on)
    assert proto.SerializeToString() == one
    assert before == qdq.float_islands(model, qdq.plan(model, storage))
    assert not [t for t in threading.enumerate() if t.name.startswith("qcc-qdq")]


def test_an_error_quantizing_ahead_surfaces_where_the_constant_is_written(
        compiled: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import qcc.backends.onnx_qdq as qdq

    def failing(*args: Any) -> np.ndarray:
        raise ValueError("no integers")

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(qdq, "integers", failing)
    with pytest.raises(ValueError, match="no integers"):
        qdq.to_qdq(compiled["int8"][0])
