"""The quantization passes on the digits CNN: accuracy, target rules, pins, sensitivity.

Accuracy is measured as a user would: `qcc.sim.run_model(model, feeds, quantized=True)` on
examples/digits/test.npz after calibrating on calib.npz (for an all fixed-point model that runs
the bit-exact integer kernels of qcc.sim.fixed, i.e. nnabla-c-runtime's arithmetic).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from qcc.driver import load
from qcc.errors import UsageError
from qcc.ir.core import Model, Value
from qcc.ir.types import Affine, FixedPoint, Float32
from qcc.pm import PassContext, PassManager
from qcc.sim import run_model
from qcc.sim.fixed import is_fixed_model
from qcc.target import NNABLA_C_RUNTIME, Constraints
from tests.cli_util import DIGITS


@functools.lru_cache(maxsize=1)
def _data() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    calib = dict(np.load(DIGITS / "calib.npz"))
    test = np.load(DIGITS / "test.npz")
    return calib, test["x"], test["labels"]


def digits() -> Model:
    return load(str(DIGITS / "digits_cnn.onnx"))


NNB = Constraints("nnb", fixed_point=NNABLA_C_RUNTIME)
"""What the driver puts in the context for the nnb (and C) targets."""


def compile_digits(spec: str, overrides: tuple[str, ...] = ()) -> tuple[Model, PassContext]:
    calib, _, _ = _data()
    model = digits()
    ctx = PassContext(calib_data=calib, overrides=tuple(overrides), target=NNB)
    PassManager(spec).run(model, ctx)
    return model, ctx


def accuracy(model: Model, quantized: bool) -> float:
    _, x, labels = _data()
    logits = run_model(model, {"x": x}, quantized=quantized)["logits"]
    return float(np.mean(logits.argmax(axis=1) == labels))


@functools.lru_cache(maxsize=1)
def float_accuracy() -> float:
    return accuracy(digits(), False)


def by_name(model: Model) -> dict[str, Value]:
    return model.graph.value_map()


# ---------------------------------------------------------------- accuracy on digits


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_affine_accuracy_within_one_point(dtype: str) -> None:
    model, _ = compile_digits(f"fold-bn,calibrate,quantize-affine{{dtype={dtype}}}")
    assert float_accuracy() >= 0.95
    assert accuracy(model, True) >= float_accuracy() - 0.01
    acts = [v for v in model.graph.values() if not v.is_const]
    assert all(isinstance(v.quant, Affine) and v.quant.dtype == dtype for v in acts)


def test_fixed16_accuracy_within_0_3_points() -> None:
    model, _ = compile_digits("fold-bn,calibrate,assign-fixed-point{bits=16,method=minmax}")
    assert is_fixed_model(model)  # run_model runs the integer kernels
    assert accuracy(model, True) >= float_accuracy() - 0.003


def test_fixed8_accuracy_within_two_points() -> None:
    model, _ = compile_digits("fold-bn,calibrate,assign-fixed-point{bits=8,method=mse}")
    assert is_fixed_model(model)
    assert accuracy(model, True) >= float_accuracy() - 0.02


def test_fixed8_16_keeps_nnb_convolutions_in_one_type() -> None:
    model, ctx = compile_digits("fold-bn,calibrate,assign-fixed-point{bits=16,weight_bits=8}")
    values = by_name(model)
    assert values["conv2.weight"].quant.bits == 16  # type: ignore[union-attr]
    assert values["fc.weight_t"].quant.bits == 8  # type: ignore[union-attr]  # Dense may mix
    assert any("conv2.weight" in line for line in ctx.report["fixed_point"])
    generic, _ = compile_digits("fold-bn,calibrate,assign-fixed-point{bits=16,weight_bits=8,rules=any}")
    assert by_name(generic)["conv2.weight"].quant.bits == 8  # type: ignore[union-attr]
    assert accuracy(model, True) >= float_accuracy() - 0.01


# ---------------------------------------------------------------- nnb rules


def test_fixed8_positions_follow_the_nnb_rules() -> None:
    model, _ = compile_digits("fold-bn,calibrate,assign-fixed-point{bits=8}")
    graph = model.graph

    def fixed(v: Value | None) -> FixedPoint:
        assert v is not None and isinstance(v.quant, FixedPoint), v
        return v.quant

    for value in graph.values():
        assert 0 <= fixed(value).frac <= 15
    for node in graph.nodes:
        ins = [fixed(v) for v in node.inputs if v is not None]
        out = fixed(node.outputs[0])
        if node.op in ("Conv", "Dense"):
            x, w = ins[0], ins[1]
            assert out.frac <= x.frac + w.frac, node.name
            if len(ins) > 2:
                assert ins[2] == out, node.name  # bias: type and position of the output
            if node.op == "Conv":
                assert x.bits == w.bits == out.bits
        if node.op == "Add":
            assert ins[0].frac == ins[1].frac, node.name
        if node.op in ("Relu", "MaxPool", "Flatten", "Concat"):
            assert all(i == out for i in ins), node.name


def test_pins_win_and_conflicts_name_the_tensor() -> None:
    model, _ = compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}",
                              ("relu3=FIXED8_3", "logits=FIXED16"))
    values = by_name(model)
    assert values["relu3"].quant == FixedPoint(8, 3) and values["add1"].quant == FixedPoint(8, 3)
    assert values["logits"].quant.bits == 16  # type: ignore[union-attr]
    assert values["relu3"].meta["pinned"]
    # fy <= fx + fw: conv2 reads relu1 (position 5) with weights at 8, so 15 is impossible
    with pytest.raises(UsageError, match=r"'bn2'.*at most input \+ weight"):
        compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}", ("bn2=FIXED8_15",))
    with pytest.raises(UsageError, match=r"bn1.*relu1|relu1.*bn1"):
        compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}",
                       ("bn1=FIXED8_4", "relu1=FIXED8_5"))
    with pytest.raises(UsageError, match=r"bn2=FIXED16.*relu1=FIXED8|relu1=FIXED8.*bn2=FIXED16"):
        compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}",
                       ("bn2=FIXED16", "relu1=FIXED8"))
    with pytest.raises(UsageError, match=r"outside the target's 0\.\.15"):
        compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}", ("relu1=FIXED16_20",))
    with pytest.raises(UsageError, match="affine type"):
        compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}", ("relu1=INT8",))


def test_overrides_float_and_width() -> None:
    model, _ = compile_digits("fold-bn,apply-overrides,calibrate,assign-fixed-point{bits=8}",
                              ("fc*=FLOAT32", "logits=FLOAT32", "relu5=FIXED16"))
    values = by_name(model)
    assert isinstance(values["logits"].quant, Float32) and isinstance(values["fc.weight_t"].quant, Float32)
    assert values["relu5"].quant.bits == 16 and values["bn5"].quant.bits == 8  # type: ignore[union-attr]
    assert "override FLOAT32" in values["logits"].meta["float_reason"]
    assert accuracy(model, True) >= float_accuracy() - 0.02
    with pytest.raises(UsageError, match="matches no tensor"):
        compile_digits("fold-bn,apply-overrides", ("nosuch*=FIXED8",))
    with pytest.raises(UsageError, match="unknown type 'FIXED12'"):
        compile_digits("fold-bn,apply-overrides", ("relu1=FIXED12",))


# ---------------------------------------------------------------- affine details


def test_affine_weights_per_channel_and_int32_bias() -> None:
    model, _ = compile_digits("fold-bn,calibrate,quantize-affine")
    v = by_name(model)
    w, b, x = v["conv2.weight"].quant, v["conv2.bias"].quant, v["relu1"].quant
    assert isinstance(w, Affine) and w.axis == 0 and len(w.scale) == 16 and set(w.zero_point) == {0}
    assert isinstance(x, Affine) and isinstance(b, Affine) and b.dtype == "int32" and b.axis == 0
    expected = (np.float32(x.scale[0]) * np.asarray(w.scale, dtype=np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(b.scale, dtype=np.float32), expected)
    assert v["fc.weight_t"].quant.axis == 1  # type: ignore[union-attr]  # Dense weights are (in, out)
    # a tensor only Relu reads shares the Relu output's annotation (range [0, max])
    assert v["bn1"].quant == v["relu1"].quant and v["relu1"].quant.zero_point == (-128,)  # type: ignore[union-attr]
    per_tensor, _ = compile_digits("fold-bn,calibrate,quantize-affine{per_channel=false,weight_bits=7}")
    wq = by_name(per_tensor)["conv2.weight"]
    assert isinstance(wq.quant, Affine) and wq.quant.axis is None
    q = np.rint(wq.const / wq.quant.scale[0])  # type: ignore[operator]
    assert np.abs(q).max() <= 64  # reduce_range: 7-bit weights


def test_quantized_run_is_the_annotations_applied() -> None:
    """Dense: y = fq(fq(x) @ fq(W) + fq(b)), with the annotations the pass chose."""
    from qcc.quant.numerics import fake_quant_affine
    from qcc.testing import constant, make_model

    rng = np.random.default_rng(0)
    w, bias = rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    model = make_model({"x": ("N", 6)}, lambda g, x: g.add("Dense", x, constant(g, w, "w"), constant(g, bias, "b")))
    data = rng.normal(size=(64, 6)).astype(np.float32)
    PassManager("calibrate,quantize-affine").run(model, PassContext(calib_data={"x": data}))
    v = by_name(model)
    qx, qw, qb, qy = (v[n].quant for n in ("x", "w", "b", "dense"))
    assert all(isinstance(q, Affine) for q in (qx, qw, qb, qy))

    def fq(a: np.ndarray, q: Any) -> np.ndarray:
        scale, zp = np.asarray(q.scale), np.asarray(q.zero_point)
        return fake_quant_affine(a, scale if q.axis is not None else scale[0],
                                 zp if q.axis is not None else zp[0], q.dtype, q.axis)

    want = fq(fq(data, qx) @ fq(w, qw) + fq(bias, qb), qy)
    got = run_model(model, {"x": data}, quantized=True)["dense"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, data @ w + bias, atol=1e-4)  # quantization did something


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse"])
def test_range_methods_keep_accuracy(method: str) -> None:
    model, _ = compile_digits(f"fold-bn,calibrate,quantize-affine{{method={method}}}")
    assert accuracy(model, True) >= float_accuracy() - 0.01
    relu1 = by_name(model)["relu1"].meta["report"]
    assert relu1["method"] == method and 0.0 <= relu1["clip_fraction"] < 0.01


def test_report_fields_of_annotated_tensors() -> None:
    model, _ = compile_digits("fold-bn,calibrate,assign-fixed-point{bits=8}")
    entry = by_name(model)["relu2"].meta["report"]
    assert {"position", "range", "observed", "clip_fraction", "sqnr_db"} <= set(entry)
    assert entry["range"][1] == pytest.approx(127 * 2.0 ** -entry["position"])
    assert 20 < entry["sqnr_db"] < 50
    weight = by_name(model)["conv2.weight"].meta["report"]
    assert weight["clip_fraction"] == 0.0 and weight["sqnr_db"] > 25


# ---------------------------------------------------------------- sensitivity


def test_sensitivity_ranks_layers_and_meets_a_target() -> None:
    # rules=any: positions for a runtime that rounds to nearest, simulated value by value
    spec = "fold-bn,calibrate,assign-fixed-point{bits=8,method=minmax,rules=any},sensitivity{target_sqnr=31}"
    model, ctx = compile_digits(spec)
    section = ctx.report["sensitivity"]
    names = [e["layer"] for e in section["layers"]]
    assert {"conv1", "conv5", "fc", "add1"} <= set(names)
    assert section["baseline_output_sqnr_db"] < 31 <= section["output_sqnr_db"] and section["target_met"]
    promoted = section["promoted"]
    assert promoted and all(by_name(model)[
        next(n.outputs[0].name for n in model.graph.nodes if n.name == layer)].quant.bits == 16  # type: ignore[union-attr]
        for layer in promoted if layer != "x")
    # the model left behind is the one measured: re-measure its output SQNR on the same samples
    from qcc.sim.compare import compare, quantized_runner

    calib, _, _ = _data()
    again = compare(model, model, {"x": calib["x"][:256]}, tensors=False, make_interpreter=quantized_runner)
    assert again.output_sqnr() == pytest.approx(section["output_sqnr_db"], abs=1e-3)


def test_sensitivity_keeps_the_best_model_and_needs_an_annotation_pass() -> None:
    model, ctx = compile_digits("fold-bn,calibrate,quantize-affine,sensitivity{max_layers=2,promote_to=float}")
    section = ctx.report["sensitivity"]
    assert len(section["promoted"]) <= 2
    assert section["output_sqnr_db"] >= section["baseline_output_sqnr_db"]
    floats = {v.name for v in model.graph.values() if isinstance(v.quant, Float32)}
    for layer in section["promoted"]:
        node = next(n for n in model.graph.nodes if n.name == layer)
        assert node.outputs[0].name in floats
    with pytest.raises(UsageError, match="annotation pass"):
        compile_digits("fold-bn,calibrate,sensitivity")


def test_settings_yaml_pins_are_honoured(tmp_path: Any) -> None:
    from qcc.formats.settings_yaml import apply_settings_file
    from qcc.quant.fixedpoint import param_fixed_point_position

    settings = tmp_path / "settings.yaml"
    settings.write_text("variables:\n  relu1: FIXED8_4\n  conv2.weight: FIXED8\n")
    calib, _, _ = _data()
    model = digits()
    apply_settings_file(model, settings)  # what the driver does with --settings, before the pipeline
    PassManager("fold-bn,calibrate,assign-fixed-point{bits=8}").run(model, PassContext(calib_data=calib))
    values = by_name(model)
    assert values["relu1"].quant == FixedPoint(8, 4) and values["bn1"].quant == FixedPoint(8, 4)
    w = values["conv2.weight"]  # nnabla's automatic position, of the weights as folded
    assert w.quant == FixedPoint(8, param_fixed_point_position(w.const, 8, "nnabla"))  # type: ignore[arg-type]


def test_quantize_nodes_on_weights_get_per_channel_annotations() -> None:
    model, _ = compile_digits("fold-bn,insert-quantize{after=Relu,weights=true},calibrate,quantize-affine")
    conv2 = next(n for n in model.graph.nodes if n.name == "conv2")
    w = conv2.input(1)
    assert w.producer().op == "Quantize"  # type: ignore[union-attr]
    assert isinstance(w.quant, Affine) and w.quant.axis == 0 and len(w.quant.scale) == 16
    assert w.producer().input(0).quant == w.quant  # type: ignore[union-attr]  # the constant too
    assert accuracy(model, True) >= float_accuracy() - 0.01


def test_pre_bias_statistics_only_for_the_fixed_point_pipelines() -> None:
    """nnabla-c-runtime's Conv sums before its bias matter to assign-fixed-point alone: an int8
    compile for C (the same target rules) calibrates without them, fixed8 keeps them."""
    from types import SimpleNamespace

    from qcc.passes.statistics import CalibrationStats

    from qcc.pipelines import default_pipeline

    opts = SimpleNamespace(calib="c.npz", method=None, per_tensor=False, overrides=())
    kept = {}
    for scheme in ("int8", "fixed8"):
        calib, _, _ = _data()
        model, ctx = digits(), PassContext(calib_data=calib, target=NNB)
        calibrate_only = default_pipeline(scheme, opts).split(",quantize-affine")[0].split(",assign-fixed-point")[0]
        PassManager(calibrate_only).run(model, ctx)
        stats = ctx.analyses.peek(CalibrationStats, model)
        kept[scheme] = sorted(name for name in stats.stats if name.endswith("#pre-bias"))
    assert kept["int8"] == []
    assert kept["fixed8"] and all(name.split("#")[0] in by_name(model) for name in kept["fixed8"])


def test_default_pipelines() -> None:
    """The scheme's pipeline is the same for every target; targets add their legalization and plan."""
    from types import SimpleNamespace

    from qcc.pipelines import default_pipeline, with_target_passes
    from qcc.plugins import registry
    from qcc.pm.manager import build_passes
    from qcc.target import as_backend

    opts = SimpleNamespace(calib="c.npz", method=None, per_tensor=False, overrides=())
    assert default_pipeline("none", opts) == ""
    assert default_pipeline("uint8", opts) == \
        "fold-bn{standalone=conv},calibrate{pre_bias=false,reference=16},quantize-affine{dtype=uint8," \
        "per_channel=true,method=auto},bias-correct"
    assert default_pipeline("fixed8", opts) == \
        "fold-bn,equalize,calibrate{reference=16},assign-fixed-point{bits=8,weight_bits=8,method=auto}," \
        "bias-correct,check-fixed-point"
    assert default_pipeline("int4", opts) == \
        "fold-bn{standalone=conv},calibrate{pre_bias=false},quantize-affine{dtype=int8,weight_dtype=int4," \
        "per_channel=true,method=auto},learned-rounding,bias-correct"
    assert default_pipeline("binary-connect", opts) == "binarize-weights{mode=binary-connect}"
    with_overrides = SimpleNamespace(**{**vars(opts), "overrides": ("a=FLOAT32",), "per_tensor": True,
                                        "method": "entropy", "bias_correct": False})
    assert default_pipeline("int8", with_overrides) == \
        "fold-bn,apply-overrides,equalize,calibrate{pre_bias=false},quantize-affine{dtype=int8,per_channel=false," \
        "method=entropy}"
    for scheme in ("int8", "uint8", "int4", "uint4", "fixed8", "fixed16", "fixed8-16"):
        with pytest.raises(UsageError, match="--calib"):
            default_pipeline(scheme, SimpleNamespace(**{**vars(opts), "calib": None}))

    def full(scheme: str, target: str, explicit: str | None = None) -> list[str]:
        backend = as_backend(registry().backend(target))
        passes = build_passes(explicit if explicit is not None else default_pipeline(scheme, opts))
        return [p.name for p in with_target_passes(passes, backend, backend.make_options(), explicit is None)]

    assert full("fixed8", "nnb")[-2:] == ["legalize-nnb", "plan-memory"]
    assert full("none", "c") == ["fuse-layernorm", "plan-memory"]  # a no-op without affine chains
    assert full("int8", "onnx-qdq")[-1] == "bias-correct"
    assert full("fixed8", "nnb")[-5:] == ["assign-fixed-point", "bias-correct", "check-fixed-point", "legalize-nnb",
                                         "plan-memory"]
    # an explicit pipeline gets the legalization too, before its own late passes
    assert full("fixed8", "nnb", "fold-bn,calibrate,assign-fixed-point,plan-memory{kind=shared}") == \
        ["fold-bn", "calibrate", "assign-fixed-point", "legalize-nnb", "plan-memory"]

