"""fold-bn, insert-quantize, binarize-weights, calibrate and the passes' option errors."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from qcc.passes.statistics import CalibrationStats

from qcc.errors import InvalidInputError, UsageError
from qcc.ir.core import Graph, Model, Value
from qcc.ir.types import Affine, Float32, Sign, TensorType
from qcc.pm import AnalysisManager, PassContext, PassManager, build_passes
from qcc.sim import run_model
from qcc.testing import clone_model, constant, make_model, op_counts, random_feeds
from tests.test_quant_passes import DIGITS, by_name, digits


def rng_array(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def bn(g: Graph, x: Value, channels: int, seed: int) -> Value:
    r = np.random.default_rng(seed)
    params = [r.uniform(0.5, 2.0, channels), r.normal(size=channels), r.normal(size=channels),
              r.uniform(0.01, 3.0, channels)]
    return g.add("BatchNorm", x, *(constant(g, p.astype(np.float32), "bn") for p in params), epsilon=1e-3)


def assert_same_outputs(a: Model, b: Model, feeds: dict[str, np.ndarray], rel: float = 1e-5) -> None:
    for (_, want), (_, got) in zip(run_model(a, feeds).items(), run_model(b, feeds).items()):
        assert np.abs(got - want).max() <= rel * np.abs(want).max(), np.abs(got - want).max()


# ---------------------------------------------------------------- fold-bn


def test_fold_bn_on_digits_is_exact_to_float_rounding() -> None:
    model = digits()
    before = clone_model(model)
    ctx = PassContext()
    PassManager("fold-bn").run(model, ctx)
    assert "BatchNorm" not in op_counts(model) and op_counts(before)["BatchNorm"] == 6
    x = np.load(DIGITS / "test.npz")["x"]
    assert_same_outputs(before, model, {"x": x})
    values = by_name(model)
    assert values["bn1"].producer().op == "Conv"  # type: ignore[union-attr]  # the folded output keeps bn1's name
    assert values["conv2.bias"].const is not None  # a conv without bias got one
    assert [v.name for v in model.graph.outputs] == ["logits"] and "fold_bn" not in ctx.report


@pytest.mark.parametrize("layer", ["conv", "depthwise", "convtranspose", "dense"])
def test_fold_bn_layer_kinds(layer: str) -> None:
    def build(g: Graph, x: Value) -> Value:
        if layer == "dense":
            h = g.add("Dense", g.add("Flatten", x), constant(g, rng_array(48, 5), "w"), constant(g, rng_array(5), "b"))
            return bn(g, h, 5, 1)
        if layer == "conv":
            h = g.add("Conv", x, constant(g, rng_array(4, 3, 3, 3), "w"), pads=[1, 1, 1, 1])
        elif layer == "depthwise":
            h = g.add("Conv", x, constant(g, rng_array(6, 1, 3, 3), "w"), constant(g, rng_array(6), "b"), group=3)
        else:
            h = g.add("ConvTranspose", x, constant(g, rng_array(3, 2, 3, 3), "w"), strides=[2, 2], group=1)
        return bn(g, h, h.type.shape[1], 2)  # type: ignore[arg-type]

    model = make_model({"x": ("N", 3, 4, 4)}, build)
    before = clone_model(model)
    PassManager("fold-bn").run(model, PassContext())
    assert "BatchNorm" not in op_counts(model)
    assert_same_outputs(before, model, random_feeds(model, batch=3))


def test_fold_bn_refuses_shared_input_and_multi_consumer_weights() -> None:
    def build(g: Graph, x: Value, w_in: Value) -> list[Value]:
        shared = constant(g, rng_array(4, 2, 1, 1), "shared")
        a = bn(g, g.add("Conv", x, shared), 4, 1)
        b = bn(g, g.add("Conv", x, shared), 4, 2)
        c = bn(g, g.add("Conv", x, w_in), 4, 3)
        conv = g.add("Conv", x, constant(g, rng_array(4, 2, 1, 1), "w"))
        d = bn(g, conv, 4, 4)
        return [a, b, c, d, g.add("Relu", conv)]

    model = make_model({"x": ("N", 2, 3, 3), "w_in": (4, 2, 1, 1)}, build)
    before = clone_model(model)
    ctx = PassContext()
    PassManager("fold-bn").run(model, ctx)
    reasons = {e["node"]: e["reason"] for e in ctx.report["fold_bn"]}
    assert len(reasons) == 4 and op_counts(model)["BatchNorm"] == 4
    assert sum("shared with other nodes" in r for r in reasons.values()) == 2
    assert any("is a graph input" in r for r in reasons.values())
    assert any("has other consumers" in r for r in reasons.values())
    feeds = random_feeds(model, batch=2)
    assert_same_outputs(before, model, feeds, rel=0)


# ---------------------------------------------------------------- insert-quantize


def test_insert_quantize_after_seed_ops_then_marked_quantization() -> None:
    model = digits()
    calib = dict(np.load(DIGITS / "calib.npz"))
    ctx = PassContext(calib_data=calib)
    PassManager("fold-bn,insert-quantize{after=ReLU|AveragePooling|Affine}").run(model, ctx)
    assert op_counts(model)["Quantize"] == 6 + 1 + 1  # six Relu, one AvgPool, one Dense
    assert [v.name for v in model.graph.outputs] == ["logits"]
    assert model.graph.outputs[0].producer().op == "Quantize"  # type: ignore[union-attr]
    PassManager("calibrate,quantize-affine{activations=marked}").run(model, ctx)
    for value in model.graph.values():
        producer = value.producer()
        if value.is_const or producer is None:
            continue
        if producer.op == "Quantize":
            assert isinstance(value.quant, Affine), value.name
        else:
            assert isinstance(value.quant, Float32) and "not marked" in value.meta["float_reason"]
    x, labels = (np.load(DIGITS / "test.npz")[k] for k in ("x", "labels"))
    acc = float(np.mean(run_model(model, {"x": x}, quantized=True)["logits"].argmax(1) == labels))
    assert acc >= 0.98


def test_insert_quantize_filters_and_weights() -> None:
    model = digits()
    PassManager("insert-quantize{all_activations=true,exclude=relu*|fc,weights=true,include=conv*|relu*|fc}").run(
        model, PassContext())
    quantized = {n.input(0).name for n in model.graph.nodes if n.op == "Quantize"}
    assert {"conv1", "conv4a", "conv1.weight", "conv5.weight"} <= quantized
    assert not any(name.startswith("relu") for name in quantized) and "logits" not in quantized
    again = op_counts(model)["Quantize"]
    PassManager("insert-quantize{all_activations=true,weights=true}").run(model, PassContext())
    assert op_counts(model)["Quantize"] > again  # the rest; nothing twice
    assert len({n.input(0).name for n in model.graph.nodes if n.op == "Quantize"}) == op_counts(model)["Quantize"]


# ---------------------------------------------------------------- binarize-weights


def _conv_bn_dense() -> Model:
    def build(g: Graph, x: Value) -> Value:
        h = g.add("Conv", x, constant(g, rng_array(4, 2, 3, 3, seed=1), "cw"), constant(g, rng_array(4), "cb"))
        h = bn(g, g.add("Relu", h), 4, 5)
        return g.add("Dense", g.add("Flatten", h), constant(g, rng_array(36, 3, seed=2), "dw"))

    return make_model({"x": ("N", 2, 5, 5)}, build)


def test_binary_weight_is_sign_times_channel_mean() -> None:
    model = _conv_bn_dense()
    manual = clone_model(model)
    for name, axis in (("cw", 0), ("dw", 1)):
        w = by_name(manual)[name]
        assert w.const is not None
        others = tuple(a for a in range(w.const.ndim) if a != axis)
        alpha = np.abs(w.const).mean(axis=others, keepdims=True)
        w.const = (np.where(w.const >= 0, 1.0, -1.0) * alpha).astype(np.float32)
    PassManager("binarize-weights{mode=binary-weight}").run(model, PassContext())
    for name in ("cw", "dw"):
        value = by_name(model)[name]
        assert isinstance(value.quant, Sign) and set(np.unique(value.const)) <= {-1.0, 1.0}  # type: ignore[arg-type]
    assert op_counts(model)["Mul"] == 2
    feeds = random_feeds(model, batch=3)
    assert_same_outputs(manual, model, feeds)
    quantized = run_model(model, feeds, quantized=True)  # Sign stores +-1: the same values
    np.testing.assert_allclose(next(iter(quantized.values())), next(iter(run_model(manual, feeds).values())),
                               rtol=1e-5, atol=1e-5)
    folded = _conv_bn_dense()
    PassManager("binarize-weights{fold_alpha=true,ops=Dense}").run(folded, PassContext())
    assert op_counts(folded)["Mul"] == 1  # Dense has no BatchNorm after it: Mul stays


def test_binary_connect_is_sign_only() -> None:
    model = _conv_bn_dense()
    before = clone_model(model)
    ctx = PassContext()
    PassManager("binarize-weights{mode=binary-connect,exclude=dense*}").run(model, ctx)
    cw, dw, original = by_name(model)["cw"].const, by_name(model)["dw"], by_name(before)["cw"].const
    assert cw is not None and original is not None
    np.testing.assert_array_equal(cw, np.where(original >= 0, 1.0, -1.0))
    assert dw.quant is None and "Mul" not in op_counts(model)


# ---------------------------------------------------------------- calibrate


def _small() -> Model:
    return make_model({"x": ("N", 8)}, lambda g, x: g.add("Relu", g.add(
        "Dense", x, constant(g, rng_array(8, 4), "w"), constant(g, rng_array(4), "b"))))


def test_calibration_streams_and_merges_exactly() -> None:
    data = rng_array(1000, 8, seed=3, low=-3, high=3)
    whole, whole_ctx = _small(), PassContext(calib_data={"x": data})
    PassManager("calibrate{batch_size=7}").run(whole, whole_ctx)
    parts, analyses = _small(), AnalysisManager()  # one analysis cache across the two runs
    PassManager("calibrate").run(parts, PassContext(analyses, calib_data={"x": data[:400]}))
    PassManager("calibrate{merge=true}").run(parts, PassContext(analyses, calib_data={"x": data[400:]}))
    a, b = whole_ctx.analyses.peek(CalibrationStats, whole), analyses.peek(CalibrationStats, parts)
    assert a.samples == b.samples == 1000
    for name in ("x", "dense", "relu"):
        np.testing.assert_array_equal(a.stats[name].hist, b.stats[name].hist)
        assert a.stats[name].count == b.stats[name].count
    # memory: statistics are fixed-size, the working set is one batch
    peaks = []
    for n in (100, 1000):
        model, feeds = _small(), {"x": np.repeat(data, 2, axis=0)[:n]}
        tracemalloc.start()
        PassManager("calibrate{batch_size=50}").run(model, PassContext(calib_data=feeds))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.3 * peaks[0] + 64 * 1024, peaks


def test_static_batch_of_one_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model({"x": TensorType("float32", (1, 8))}, lambda g, x: g.add("Relu", x))
    calls = []
    data = rng_array(5, 8)
    ctx = PassContext(calib_data={"x": data}, progress=True)
    from qcc.passes import calibrate as calibrate_module

    original = calibrate_module.collect

    def spy(m: Model, feeds: dict[str, np.ndarray], batch: int, *args: object) -> object:
        calls.append(batch)
        return original(m, feeds, batch, *args)  # type: ignore[arg-type]

    calibrate_module.collect = spy  # type: ignore[assignment]
    try:
        PassManager("calibrate{batch_size=64}").run(model, ctx)
    finally:
        calibrate_module.collect = original
    assert calls == [1] and ctx.analyses.peek(CalibrationStats, model).samples == 5
    err = capsys.readouterr().err
    assert "qcc calibrate" in err and "/5 [" in err  # a tqdm bar over the 5 samples (issue 16)


def test_bad_calibration_data_is_a_clear_error() -> None:
    cases = [
        ({"y": rng_array(4, 8), "z": rng_array(4, 8)}, "no array for model input"),
        ({"x": rng_array(4, 9)}, "has shape \\(4, 9\\)"),
        ({"x": np.full((4, 8), np.nan, dtype=np.float32)}, "NaN or Inf"),
    ]
    for data, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            PassManager("calibrate").run(_small(), PassContext(calib_data=data))
    with pytest.raises(UsageError, match="--calib"):
        PassManager("calibrate").run(_small(), PassContext())
    broken = _small()
    w = by_name(broken)["w"]
    assert w.const is not None
    w.const[0, 0] = np.inf
    with pytest.raises(InvalidInputError, match="parameter 'w' contains 1 NaN/Inf"):
        PassManager("calibrate").run(broken, PassContext(calib_data={"x": rng_array(4, 8)}))
    overflow = make_model({"x": ("N", 3)}, lambda g, x: g.add("Exp", g.add("Mul", x, constant(g, [300.0], "k"))))
    with pytest.raises(InvalidInputError, match="Inf value\\(s\\) in tensor 'exp'"), \
            np.errstate(over="ignore"):
        PassManager("calibrate").run(overflow, PassContext(calib_data={"x": np.ones((2, 3), np.float32)}))


@pytest.mark.parametrize("scheme", ["quantize-affine", "assign-fixed-point{bits=8}"])
def test_constant_and_zero_tensors_get_the_documented_safe_choice(scheme: str) -> None:
    def build(g: Graph, x: Value) -> list[Value]:
        zero = g.add("Mul", x, constant(g, [0.0], "zero"))
        three = g.add("Add", zero, constant(g, [3.0], "three"))
        return [zero, g.add("Add", three, x)]

    model = make_model({"x": ("N", 4)}, build)
    data = rng_array(16, 4, seed=4)
    ctx = PassContext(calib_data={"x": data})
    PassManager(f"calibrate,{scheme}").run(model, ctx)
    assert {e["tensor"] for e in ctx.report["calibration"] if isinstance(e, dict)} == {"mul", "add"}
    out = run_model(model, {"x": data}, quantized=True)
    assert all(np.isfinite(a).all() for a in out.values())
    np.testing.assert_array_equal(out["mul"], 0.0)  # zero stays exactly zero
    last = model.graph.outputs[1].name
    np.testing.assert_allclose(out[last], data + 3.0, atol=0.1)


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("spec, message", [
    ("fold-bn{eps=1}", "has no option 'eps'"),
    ("insert-quantize{after=Foo}", "unknown op type 'Foo'"),
    ("calibrate{batch_size=0}", "batch_size must be >= 1"),
    ("calibrate{num_bins=1000}", "power of two"),
    ("quantize-affine{dtype=int4}", "not one of int8|uint8"),
    ("quantize-affine{percentile=0}", "percentile must be in"),
    ("quantize-affine{weight_bits=6}", "not one of 8|7"),
    ("assign-fixed-point{bits=12}", "not one of 8|16"),
    ("assign-fixed-point{rules=tflite}", "not one of target|nnabla-c-runtime|any"),
    ("binarize-weights{mode=ternary}", "not one of binary-weight|binary-connect"),
    ("binarize-weights{ops=Relu}", "works on Conv and Dense"),
    ("apply-overrides{rules=conv*}", "expected PATTERN=TYPE"),
    ("apply-overrides{rules=\"conv*=FIXED4\"}", "unknown type"),
    ("sensitivity{samples=0}", "samples must be >= 1"),
    ("sensitivity{promote_to=8}", "not one of 16|float"),
    ("sensitivity{max_layers=-1}", "max_layers must be >= 0"),
])
def test_option_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_passes(spec)


def test_order_errors_name_both_passes() -> None:
    with pytest.raises(UsageError, match="'quantize-affine' requires 'calibrate'"):
        PassManager("quantize-affine").run(_small(), PassContext())


def test_onnxruntime_engine_collects_the_same_statistics() -> None:
    calib = dict(np.load(DIGITS / "calib.npz"))
    runs = []
    for engine in ("qcc", "onnxruntime"):
        model, ctx = digits(), PassContext(calib_data=calib)
        PassManager(f"fold-bn,calibrate{{engine={engine}}},quantize-affine").run(model, ctx)
        runs.append((ctx.analyses.peek(CalibrationStats, model), by_name(model)))
    (a, qa), (b, qb) = runs
    assert set(a.stats) == set(b.stats) and a.samples == b.samples == 359
    for name, st in a.stats.items():
        assert st.count == b.stats[name].count
        np.testing.assert_allclose([st.min, st.max], [b.stats[name].min, b.stats[name].max], rtol=1e-5, atol=1e-6)
    for name, value in qa.items():
        if isinstance(value.quant, Affine):
            np.testing.assert_allclose(value.quant.scale, qb[name].quant.scale, rtol=1e-5)  # type: ignore[union-attr]


def test_calibration_statistics_do_not_outlive_a_graph_change() -> None:
    """Statistics are an analysis of one graph: fold-bn after calibrate drops them, so an
    annotation pass cannot choose ranges from tensors that no longer exist."""
    calib = dict(np.load(DIGITS / "calib.npz"))
    with pytest.raises(UsageError, match=r"'quantize-affine' needs calibration statistics.*no graph-changing pass"):
        PassManager("calibrate,fold-bn,quantize-affine").run(digits(), PassContext(calib_data=calib))
    model = digits()
    PassManager("fold-bn,calibrate,quantize-affine").run(model, PassContext(calib_data=calib))
    assert all(v.quant is not None for v in model.graph.values() if v.type.dtype == "float32")
