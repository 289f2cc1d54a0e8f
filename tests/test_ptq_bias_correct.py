"""bias-correct (issue 18, item 2): the systematic part of the quantization error moved into biases.

Oracles: the float model (qcc's interpreter), nnabla-c-runtime's arithmetic as qcc.sim.fixed
computes it (bit-exact with the C backend and the .nnb emulation: test_backend_c.py and
test_backend_nnb.py compile the default fixed8 pipeline, which now corrects biases), a Monte
Carlo estimate for the analytical correction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.passes.bias_correct import expected_input

from qcc.driver import load
from qcc.ir.core import Model
from qcc.ir.types import Affine, FixedPoint
from qcc.pm import PassContext, PassManager
from qcc.quant.biascorr import storable
from qcc.quant.equalize import clipped_normal_mean
from qcc.sim import run_model
from qcc.sim.compare import quantized_runner, sqnr_db
from qcc.testing import make_model
from tests.cli_util import DIGITS
from tests.ptq_models import NetFiles

FIXED8_NNB = "fold-bn,equalize,calibrate,assign-fixed-point{bits=8,weight_bits=8,method=auto,rules=nnabla-c-runtime}"
CALIB = dict(np.load(DIGITS / "calib.npz"))
TEST = np.load(DIGITS / "test.npz")


def quantize(path: str, spec: str, calib: dict[str, np.ndarray]) -> tuple[Model, PassContext]:
    model = load(path)
    ctx = PassContext(calib_data=calib)
    PassManager(spec).run(model, ctx)
    return model, ctx


def scores(model: Model, reference: Model, x: np.ndarray, labels: np.ndarray) -> tuple[float, float | None]:
    (name,) = [v.name for v in model.graph.outputs]
    got = run_model(model, {"x": x}, quantized=True)[name]
    ref = run_model(reference, {"x": x})[name]
    noise = float(np.sum((got.astype(np.float64) - ref) ** 2))
    return float(np.mean(got.argmax(1) == labels)), sqnr_db(float(np.sum(ref.astype(np.float64) ** 2)), noise)


@pytest.mark.parametrize("net", ["digits", "mobilenet_digits"])
def test_fixed8_on_nnb_gains_sqnr_and_keeps_accuracy(net: str, request: pytest.FixtureRequest) -> None:
    if net == "digits":
        path, calib, x, labels = str(DIGITS / "digits_cnn.onnx"), CALIB, TEST["x"], TEST["labels"]
    else:
        files: NetFiles = request.getfixturevalue("mobilenet_digits_files")
        path, calib, x, labels = str(files.model), dict(np.load(files.calib)), files.x, files.labels
    reference = load(path)
    plain, _ = quantize(path, FIXED8_NNB, calib)
    corrected, ctx = quantize(path, FIXED8_NNB + ",bias-correct", calib)
    acc0, sqnr0 = scores(plain, reference, x, labels)
    acc1, sqnr1 = scores(corrected, reference, x, labels)
    assert sqnr0 is not None and sqnr1 is not None
    assert sqnr1 >= sqnr0 + 3.0, (sqnr0, sqnr1)  # half of FIXED8's error or more was systematic
    assert acc1 >= acc0
    for layer in ctx.report["bias_correct"]:  # nnabla-c-runtime's rule: bias at the output's type
        node = next(n for n in corrected.graph.nodes if n.name == layer["layer"])
        assert node.inputs[2] is not None and node.inputs[2].quant == node.outputs[0].quant


def _mean_errors(model: Model, reference: Model, x: np.ndarray) -> dict[str, tuple[np.ndarray, float, int]]:
    """Per corrected layer: mean (quantized - float model) per output channel where a bias can move
    the output (the ReLU after it passes the value, the output's type does not saturate it), and
    the output's step, and the fewest values a channel's mean is taken over."""
    floats = run_model(reference, {"x": x}, keep_all=True)
    got: dict[str, np.ndarray] = {}
    layers = [n for n in model.graph.nodes if n.op in ("Conv", "Dense")]
    wanted = {id(n.outputs[0]): n.outputs[0].name for n in layers}

    def observe(value: Any, array: np.ndarray) -> None:
        if id(value) in wanted:
            got[value.name] = array

    quantized_runner(model, observe).run({"x": x})
    out = {}
    for node in layers:
        name = node.outputs[0].name
        y, f = got[name].astype(np.float64), floats[name].astype(np.float64)
        readers = node.outputs[0].consumers()
        relu = bool(readers) and all(n.op == "Relu" for n in readers)
        quant = node.outputs[0].quant
        if isinstance(quant, FixedPoint):
            step, lo, hi = 2.0 ** -quant.frac, -(2.0 ** (quant.bits - 1 - quant.frac)), \
                (2 ** (quant.bits - 1) - 1) * 2.0 ** -quant.frac
        else:
            assert isinstance(quant, Affine)
            step, zp = float(quant.scale[0]), int(quant.zero_point[0])
            lo, hi = (-128 - zp) * step, (127 - zp) * step
        mask = (f > max(lo, 0.0 if relu else lo)) & (f < hi)
        axes = tuple(a for a in range(y.ndim) if a != 1)
        counts = mask.sum(axis=axes)
        mean = ((y - f) * mask).sum(axis=axes) / np.maximum(counts, 1)
        out[name] = (mean, step, int(counts.min()))
    return out


@pytest.mark.parametrize("spec, tolerance", [
    (FIXED8_NNB, 0.5),  # the bias is stored on the output's grid: half a step is what it can resolve
    # int32 at s_x*s_w: any shift is stored, what is left is the output's rounding and the clipping of
    # noise at the ReLU's zero, which move with the shift
    ("fold-bn{standalone=conv},calibrate,quantize-affine{method=auto}", 0.25),
])
def test_every_layer_is_left_without_mean_error_on_its_data(spec: str, tolerance: float) -> None:
    path = str(DIGITS / "digits_cnn.onnx")
    model, _ = quantize(path, spec + ",bias-correct", CALIB)
    reference, _ = quantize(path, spec.split(",calibrate")[0], CALIB)  # the same float model and names
    before, _ = quantize(path, spec, CALIB)
    x = CALIB["x"][:16]  # the samples bias-correct measured on
    fixed, plain = _mean_errors(model, reference, x), _mean_errors(before, reference, x)
    for name, (mean, step, count) in fixed.items():
        # plus the mean of `count` rounding errors of one step (sd step/sqrt(12 count)), 4 sd
        allowed = (tolerance + 4.0 / np.sqrt(12.0 * max(count, 1))) * step
        assert np.abs(mean).max() <= allowed + 1e-6, (name, np.abs(mean).max() / step)
    assert sum(np.abs(m).sum() for m, _, _ in plain.values()) > 4 * sum(np.abs(m).sum() for m, _, _ in fixed.values())


def test_analytical_correction_uses_the_batchnorm_statistics() -> None:
    """Conv -> BatchNorm -> ReLU -> Conv: E[x] of the second Conv is the clipped normal the
    BatchNorm promises, and the shift is (W_q - W) E[x] (no data needed)."""
    rng = np.random.default_rng(0)
    gamma, beta = np.array([1.0, 0.5, 2.0], np.float32), np.array([0.3, -1.0, 1.5], np.float32)

    def build(g: Any, x: Any) -> Any:
        h = g.add("Conv", x, g.add_constant("w1", rng.standard_normal((3, 2, 1, 1)).astype(np.float32)), name="c1")
        h = g.add("BatchNorm", h, g.add_constant("g", gamma), g.add_constant("b", beta),
                  g.add_constant("m", np.zeros(3, np.float32)), g.add_constant("v", np.ones(3, np.float32)),
                  name="bn", epsilon=0.0)
        h = g.add("Relu", h, name="relu")
        w2 = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
        return g.add("Conv", h, g.add_constant("w2", w2), g.add_constant("b2", np.zeros(4, np.float32)), name="c2")

    model = make_model({"x": ("N", 2, 3, 3)}, build)
    ctx = PassContext(calib_data={"x": rng.standard_normal((8, 2, 3, 3)).astype(np.float32)})
    PassManager("fold-bn,calibrate,quantize-affine{per_channel=false}").run(model, ctx)
    values = model.graph.value_map()
    mean = expected_input(values["relu"])
    assert mean is not None
    z = rng.standard_normal((1_000_000, 3)) * gamma + beta
    empirical = np.maximum(z, 0).mean(axis=0)
    spread = np.maximum(z, 0).std(axis=0) / np.sqrt(len(z))
    assert np.all(np.abs(mean - empirical) <= 5 * spread)
    b2 = values["b2"].const.copy()  # type: ignore[union-attr]
    w2 = values["w2"]
    PassManager("bias-correct{mode=analytical}").run(model, ctx)
    from qcc.ir.fakequant import apply_annotation

    error = (apply_annotation(w2.const, w2.quant) - w2.const).astype(np.float64)  # type: ignore[arg-type]
    want = b2 - (error[:, :, 0, 0] @ clipped_normal_mean(beta, gamma, 0.0, None))
    np.testing.assert_allclose(values["b2"].const, want, rtol=1e-5, atol=1e-6)  # type: ignore[arg-type]
    assert isinstance(values["b2"].quant, Affine) and values["b2"].quant.dtype == "int32"
    assert ctx.report["bias_correct"][0]["mode"] == "analytical"


def test_a_correction_beyond_the_storage_is_clipped_to_it() -> None:
    bias = np.array([0.5, 3.0, -3.0])
    clipped, n = storable(bias, 2.0 ** -6, -128, 127)  # FIXED8 at position 6: [-2, 1.984375]
    assert n == 2 and clipped.tolist() == [0.5, 127 / 64, -2.0]
    clipped, n = storable(bias, np.array([1e-10, 1.0, 1.0]), -(2**31), 2**31 - 1)  # int32 at s_x*s_w
    assert n == 1 and clipped[0] == pytest.approx((2**31 - 1) * 1e-10)


def test_rerunning_is_idempotent_and_the_flag_turns_it_off(tmp_path: Any) -> None:
    path = str(DIGITS / "digits_cnn.onnx")
    once, _ = quantize(path, FIXED8_NNB + ",bias-correct", CALIB)
    twice, _ = quantize(path, FIXED8_NNB + ",bias-correct,bias-correct", CALIB)
    for a, b in zip(once.graph.constants, twice.graph.constants):
        assert np.array_equal(a.const, b.const), a.name  # type: ignore[arg-type]
    from qcc.driver import compile as qcc_compile

    _, report = qcc_compile(path, tmp_path / "d.nnb", quantize="fixed8", calib=str(DIGITS / "calib.npz"),
                            bias_correct=False)
    assert "bias-correct" not in report["pipeline"] and "bias_correct" not in report


ANNOTATIONS = ["quantize-affine{dtype=int8,per_channel=false}",
               "assign-fixed-point{bits=8,weight_bits=8,rules=nnabla-c-runtime}"]


def _float_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the float model's runs by the interpreter (the quantized fixed-point run is not one)."""
    from qcc.sim.interpreter import Interpreter

    runs: list[int] = []
    run = Interpreter.run

    def counted(self: Interpreter, *args: Any, **kwargs: Any) -> Any:
        if not self.quantized:
            runs.append(1)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Interpreter, "run", counted)
    return runs


def _same_constants(a: Model, b: Model) -> None:
    assert [v.name for v in a.graph.constants] == [v.name for v in b.graph.constants]
    for x, y in zip(a.graph.constants, b.graph.constants):
        assert x.const is not None and y.const is not None
        assert x.const.dtype == y.const.dtype and x.const.tobytes() == y.const.tobytes(), x.name


@pytest.mark.parametrize("annotate", ANNOTATIONS)
def test_calibrates_float_outputs_are_bias_corrects_reference(annotate: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """calibrate{reference=16} keeps the weighted layers' float outputs on the first 16 samples of
    its first batch (of 32); bias-correct reads them instead of running the float model, and
    writes the very biases its own float run gives. The Dense reads a 2-D input that calibrate
    multiplies one sample at a time: its input is kept and bias-correct computes it alone."""
    from qcc.passes.float_reference import FloatReference, KeptArrays

    path = str(DIGITS / "digits_cnn.onnx")
    own, _ = quantize(path, f"fold-bn,calibrate,{annotate},bias-correct", CALIB)
    model, ctx = quantize(path, f"fold-bn,calibrate{{reference=16}},{annotate}", CALIB)
    kept = ctx.analyses.peek(FloatReference, model)
    assert isinstance(kept, KeptArrays)
    assert "fc" not in kept.arrays and kept.arrays["flatten1"].shape == (16, 128)
    assert all(len(a) == 16 for a in kept.arrays.values()) and len(kept.feeds["x"]) == 16
    runs = _float_runs(monkeypatch)
    PassManager("bias-correct").run(model, ctx)
    assert not runs
    assert ctx.analyses.peek(FloatReference, model) is None  # read once, released
    _same_constants(model, own)


def test_a_reference_from_other_weights_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that rewrites a weight between calibrate and bias-correct (learned-rounding does)
    leaves calibrate's float outputs stale: bias-correct runs the float model itself."""
    path = str(DIGITS / "digits_cnn.onnx")
    annotate = ANNOTATIONS[1]
    models = []
    runs = _float_runs(monkeypatch)
    for spec in (f"fold-bn,calibrate{{reference=16}},{annotate}", f"fold-bn,calibrate,{annotate}"):
        model, ctx = quantize(path, spec, CALIB)
        weight = next(n for n in model.graph.nodes if n.name == "conv2").inputs[1]
        assert weight is not None and weight.const is not None
        weight.const = weight.const * np.float32(0.75)
        runs.clear()
        PassManager("bias-correct").run(model, ctx)
        assert len(runs) == 1
        models.append(model)
    _same_constants(*models)


def test_check_fixed_point_reads_bias_corrects_integer_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """bias-correct's integer run computes the corrected model (each layer hands on the output of
    its corrected bias): check-fixed-point reads its first samples instead of running the model
    again, with the report its own run gives; a model changed in between is run again."""
    from qcc.passes.quantized_samples import QuantizedSamples

    from qcc.sim.fixed import FixedRunner

    path = str(DIGITS / "digits_cnn.onnx")
    runs: list[int] = []
    run = FixedRunner.run

    def counted(self: FixedRunner, *args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(FixedRunner, "run", counted)
    reports = []
    for change in ("none", "dropped", "annotation"):
        model, ctx = quantize(path, FIXED8_NNB + ",bias-correct", CALIB)
        assert ctx.analyses.peek(QuantizedSamples, model) is not None
        if change == "dropped":
            ctx.analyses.store(QuantizedSamples, model, None)
        elif change == "annotation":  # as accuracy-control's promotions would
            relu = next(n for n in model.graph.nodes if n.name == "relu5").outputs[0]
            assert isinstance(relu.quant, FixedPoint)
            relu.quant = FixedPoint(relu.quant.bits, relu.quant.frac - 1, rounding=relu.quant.rounding)
        runs.clear()
        PassManager("check-fixed-point").run(model, ctx)
        assert len(runs) == (0 if change == "none" else 1), change
        assert ctx.analyses.peek(QuantizedSamples, model) is None
        reports.append(ctx.report["fixed_point_check"])
    assert reports[0] == reports[1] and reports[0]["samples"] == 4
    assert reports[2] != reports[0]


def test_check_fixed_point_reads_calibrates_float_values() -> None:
    """With calibrate{reference=N} (the default pipelines), bias-correct hands check-fixed-point
    calibrate's float layer outputs on its samples: the check's float reference computed around
    them is bit for bit the one it computes alone (every value, signs of zeros included), and the
    report is the same as without them."""
    from qcc.passes import check_fixed_point as check
    from qcc.passes.quantized_samples import KeptRun, QuantizedSamples

    from qcc.pm.parallel import process_split

    path = str(DIGITS / "digits_cnn.onnx")
    spec = FIXED8_NNB.replace("calibrate,", "calibrate{reference=16},") + ",bias-correct"
    reports = []
    for drop in (False, True):
        model, ctx = quantize(path, spec, CALIB)
        kept = ctx.analyses.peek(QuantizedSamples, model)
        assert isinstance(kept, KeptRun) and len(kept.floats) >= 3
        assert all(len(a) == 4 for a in kept.floats.values())
        if drop:
            kept.floats = {}
        else:
            split = process_split()
            try:
                alone = check._reference(model, split, {}).run(kept.feeds)
                around = check._reference(model, split, kept.floats).run(kept.feeds)
            finally:
                split.close()
            assert alone.keys() == around.keys()
            for name, array in alone.items():
                assert array.dtype == around[name].dtype and np.array_equal(array, around[name]), name
                assert np.array_equal(np.signbit(array), np.signbit(around[name])), name
        PassManager("check-fixed-point").run(model, ctx)
        reports.append(ctx.report["fixed_point_check"])
    assert reports[0] == reports[1] and reports[0]["samples"] == 4


def test_check_fixed_point_energies_are_the_old_formulas_bits() -> None:
    """`_energies` (one float64 temporary) against sum(r * r) and sum((r - got)**2) on float64
    copies: random shapes and scales, float32 and float64 `got`, zeros, huge and tiny values."""
    from qcc.passes.check_fixed_point import _energies

    rng = np.random.default_rng(18)
    for trial in range(60):
        shape = tuple(int(d) for d in rng.integers(1, 9, size=int(rng.integers(1, 5))))
        ref = (rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
        got = (ref + rng.standard_normal(shape).astype(np.float32) * np.float32(0.01)).astype(
            np.float32 if trial % 2 else np.float64)
        if trial % 5 == 0:
            ref.reshape(-1)[::3] = 0.0
            got.reshape(-1)[::2] = -0.0
        r = np.asarray(ref, dtype=np.float64)
        old = (float(np.sum(r * r)), float(np.sum((r - np.asarray(got, dtype=np.float64)) ** 2)))
        assert _energies(ref, got) == old
        assert _energies(ref, np.asfortranarray(got)) == old  # other layouts: the old formula itself


def test_large_samples_are_corrected_on_fewer_of_them() -> None:
    """The default budget of input values: 8x8 digits keep all 16 samples, 96x96 RGB images
    (27648 values each: 9 fit) 8, a multiple of 4, 224x224 ones the floor of 4; never more
    than asked."""
    from qcc.quant.biascorr import SAMPLES
    from qcc.quant.samples import sample_count

    assert sample_count(SAMPLES, 64) == 16
    assert sample_count(SAMPLES, 3 * 96 * 96) == 8
    assert sample_count(64, 3 * 64 * 64) == 20  # 21 fit
    assert sample_count(SAMPLES, 3 * 224 * 224) == 4
    assert sample_count(2, 3 * 224 * 224) == 2


@pytest.mark.parametrize("annotate", ANNOTATIONS)
def test_fewer_samples_read_the_first_rows_of_calibrates_reference(annotate: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """bias-correct{input_values=640} on 64-value digits measures 8 samples (10 fit, a multiple of
    4 read): it reads the first 8 rows of the 16 calibrate kept (no float run) and writes the
    biases bias-correct{samples=8} gives with its own float run. A model on the integer kernels
    (nnabla-c-runtime's rules) has its own budget, integer_input_values, and only it."""
    path = str(DIGITS / "digits_cnn.onnx")
    integer = "nnabla-c-runtime" in annotate
    own, _ = quantize(path, f"fold-bn,calibrate,{annotate},bias-correct{{samples=8}}", CALIB)
    sixteen, _ = quantize(path, f"fold-bn,calibrate,{annotate},bias-correct", CALIB)
    model, ctx = quantize(path, f"fold-bn,calibrate{{reference=16}},{annotate}", CALIB)
    runs = _float_runs(monkeypatch)
    PassManager(f"bias-correct{{{'integer_' if integer else ''}input_values=640}}").run(model, ctx)
    assert not runs
    _same_constants(model, own)
    assert any(a.const.tobytes() != b.const.tobytes()  # type: ignore[union-attr]
               for a, b in zip(model.graph.constants, sixteen.graph.constants))
    other, ctx = quantize(path, f"fold-bn,calibrate{{reference=16}},{annotate}", CALIB)
    PassManager(f"bias-correct{{{'' if integer else 'integer_'}input_values=640}}").run(other, ctx)
    _same_constants(other, sixteen)  # the other budget does not apply


@pytest.mark.parametrize("shape", [(9, 24, 12, 12), (16, 100), (3, 7, 5)])
def test_error_sums_without_the_cast_copy_keep_their_bits(shape: tuple[int, ...]) -> None:
    """add_difference subtracts in float64 without casting `got` first: sums and counts must
    equal add(got.astype(float64) - target, mask)'s bit for bit, NaN, infinities and signed
    zeros included."""
    from qcc.quant.biascorr import ChannelMean

    rng = np.random.default_rng(len(shape))
    got = rng.standard_normal(shape).astype(np.float32)
    target = rng.standard_normal(shape).astype(np.float32)
    got.flat[:6] = [np.nan, np.inf, -0.0, 0.0, -np.inf, -0.0]
    target.flat[:6] = [1.0, 2.0, 0.0, -0.0, 3.0, 0.0]
    for mask in (target > 0, rng.random(shape) > 0.05, np.zeros(shape, bool), None):
        expected, fast = ChannelMean(), ChannelMean()
        expected.add(got.astype(np.float64) - target, mask)
        fast.add_difference(got, target, mask)
        assert expected.sums is not None and fast.sums is not None
        assert expected.sums.tobytes() == fast.sums.tobytes()
        assert np.array_equal(expected.counts, fast.counts)


@pytest.mark.parametrize("shape", [(9, 24, 12, 12), (9, 1, 20, 20), (5, 7, 1, 1), (16, 100), (3, 7, 5), (1, 4, 6, 6)])
def test_error_sums_sample_by_sample_keep_their_bits(shape: tuple[int, ...]) -> None:
    """add_errors sums one sample at a time (and reads fixed-point integers times their step):
    sums and counts must equal add_difference's over the whole batch bit for bit, NaN,
    infinities and signed zeros included, with and without each bound of the mask."""
    from qcc.quant.biascorr import ChannelMean

    rng = np.random.default_rng(len(shape) + shape[1])
    got = rng.standard_normal(shape).astype(np.float32)
    target = rng.standard_normal(shape).astype(np.float32)
    got.flat[:6] = [np.nan, np.inf, -0.0, 0.0, -np.inf, -0.0]
    target.flat[:6] = [1.0, 2.0, 0.0, -0.0, -np.inf, 0.0]
    ints = rng.integers(-128, 128, shape)
    for inside in (None, (0.0, None), (None, 0.5), (-0.25, 0.75)):
        mask = None if inside is None else (target > (-np.inf if inside[0] is None else inside[0])) & (
            target < (np.inf if inside[1] is None else inside[1]))
        for array, step in ((got, None), (ints, 2.0 ** -5)):
            expected, fast = ChannelMean(), ChannelMean()
            # the float32 getter of fixed point (exact), then add_difference's float64 subtraction
            expected.add_difference(array if step is None else (array * np.float32(step)).astype(np.float32),
                                    target, mask)
            fast.add_errors(array, target, inside, step)
            assert expected.sums is not None and fast.sums is not None
            assert expected.sums.tobytes() == fast.sums.tobytes(), (inside, step)
            assert np.array_equal(expected.counts, fast.counts)


@pytest.mark.parametrize("shape", [(9, 24, 12, 12), (5, 7, 1, 1), (16, 100), (3, 7, 5)])
def test_error_sums_of_integers_with_a_bias_and_signed_zeros_keep_their_bits(shape: tuple[int, ...]) -> None:
    """add_errors multiplies the differences by the mask (terms outside it are +-0, not +0),
    reads integers with an integer add (MAGIC) and adds a per-channel `offset` (the bias) in
    it, clipped to `bounds` (its saturation): sums and counts must equal the select over
    clip(got + offset) * step bit for bit, with a
    channel wholly outside the mask with negative differences (all its terms -0), a channel of
    -0 differences wholly inside it, NaN and infinities outside it (0 times them is NaN)."""
    from qcc.quant.biascorr import ChannelMean

    rng = np.random.default_rng(shape[1])
    ints = rng.integers(-2 ** 15, 2 ** 15, shape)
    offset = rng.integers(-2 ** 10, 2 ** 10, shape[1])
    ints[:, -1], offset[-1], ints[:, 2], offset[2] = 2 ** 15 - 1, 5, -2 ** 15, -5  # saturate both ways
    got = rng.standard_normal(shape).astype(np.float32)
    target = rng.standard_normal(shape).astype(np.float32)
    target[:, 0] = 5.0  # above every mask: differences negative, all outside
    got[:, 1], target[:, 1] = -0.0, 0.0  # -0 differences, all inside (-0.25, 0.75)
    target.reshape(len(target), shape[1], -1)[0, 3, 0] = [np.nan, np.inf, -np.inf][len(shape) % 3]  # sample 0 only
    wide = ints + offset.reshape(1, -1, *([1] * (len(shape) - 2)))
    bounds = (-2 ** 15, 2 ** 15 - 1)
    assert (wide < bounds[0]).any() and (wide > bounds[1]).any()  # both saturations exercised
    for inside in (None, (0.0, None), (None, 0.5), (-0.25, 0.75), (0.0, 1.0)):
        mask = None if inside is None else (target > (-np.inf if inside[0] is None else inside[0])) & (
            target < (np.inf if inside[1] is None else inside[1]))
        for array, step, add, clip, reads in (
                (got, None, None, None, got), (ints, 2.0 ** -7, offset, None, wide * 2.0 ** -7),
                (ints, 2.0 ** -7, offset, bounds, np.clip(wide, *bounds) * 2.0 ** -7),
                (ints.astype(np.float64), 2.0 ** -7, offset, bounds, np.clip(wide, *bounds) * 2.0 ** -7),
                (ints, 2.0 ** -7, None, None, ints * 2.0 ** -7)):
            expected, fast = ChannelMean(), ChannelMean()
            expected.add_difference(reads, target, mask)
            fast.add_errors(array, target, inside, step, offset=add, bounds=clip)
            assert expected.sums is not None and fast.sums is not None
            assert expected.sums.tobytes() == fast.sums.tobytes(), (inside, step, add is None)
            assert np.array_equal(expected.counts, fast.counts)


def test_equalize_and_bias_correct_bits_do_not_depend_on_the_product_threads(
        mobilenet_digits_files: NetFiles, tmp_path: Path) -> None:
    """equalize's float run and bias-correct's quantized run split each batch's products by
    samples over threads (qcc.sim.split, BLAS at one thread): the compiled constants, per-tensor
    int8 (both passes) and FIXED8 (integer kernels), must be those of the one-thread run."""
    from qcc.driver import compile as qcc_compile
    from qcc.pm.parallel import worker_budget

    files = mobilenet_digits_files
    for scheme, target, out in (("int8", "onnx-qdq", "m.onnx"), ("fixed8", "nnb", "m.nnb")):
        constants = []
        for threads in (1, 2, 3):
            with worker_budget(threads):
                model, report = qcc_compile(str(files.model), tmp_path / out, target=target, quantize=scheme,
                                            per_tensor=True, calib=str(files.calib))
            assert {"equalize", "bias-correct"} <= set(report["pipeline"])
            constants.append([(v.name, v.const.tobytes()) for v in model.graph.constants if v.const is not None])
        assert constants[1] == constants[0] and constants[2] == constants[0], scheme
