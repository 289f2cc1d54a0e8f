"""equalize (issue 18, item 1): an exact rewrite that makes per-tensor and fixed-point weights hold.

The MobileNetV2-style digits network (tests/ptq_models.py) is the case the issue names: BatchNorm
folding leaves its depthwise filters' ranges more than 100x apart. Oracles: the float model in
qcc's interpreter and in onnxruntime (the written files), the labelled test set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qcc.driver import compile as qcc_compile
from qcc.driver import load
from qcc.ir.core import Model
from qcc.pm import PassContext, PassManager
from qcc.sim import run_model
from qcc.testing import make_model
from tests import ort_quant
from tests.ptq_models import NetFiles


def spreads(model: Model, op_filter: str = "dw") -> list[float]:
    """Per depthwise Conv: largest over smallest nonzero per-output-channel weight range."""
    out = []
    for node in model.graph.nodes:
        if node.op == "Conv" and op_filter in node.name:
            w = node.input(1).const
            assert w is not None
            r = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
            out.append(float(r.max() / r[r > 0].min()))
    return out


def folded(files: NetFiles, spec: str = "fold-bn") -> tuple[Model, PassContext]:
    model = load(str(files.model))
    ctx = PassContext(calib_data=dict(np.load(files.calib)))
    PassManager(spec).run(model, ctx)
    return model, ctx


def test_equalize_is_exact_and_balances_the_folded_depthwise_filters(mobilenet_digits_files: NetFiles) -> None:
    files = mobilenet_digits_files
    before, _ = folded(files)
    assert min(spreads(before)) >= 100  # the precondition: ranges orders of magnitude apart
    after, ctx = folded(files, "fold-bn,equalize")
    assert max(spreads(after)) <= 10
    reference = run_model(load(str(files.model)), {"x": files.x})
    got = run_model(after, {"x": files.x})
    (name,) = reference
    # the same function: float32 rounding of differently scaled products (margin-2 clamp limits
    # keep ReLU6 exact on data beyond the calibration set)
    assert np.abs(got[name] - reference[name]).max() <= 1e-5 * np.abs(reference[name]).max()
    entries = [e for e in ctx.report["equalize"] if isinstance(e, dict)]
    assert len(entries) == 7  # expand->dw and dw->project in 3 blocks, head->fc
    assert sum(e["dead_channels"] for e in entries) == 2 * 3 * 2  # 2 dead channels per block, both sides


@pytest.fixture(scope="module")
def compiled(mobilenet_digits_files: NetFiles, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    files, tmp = mobilenet_digits_files, tmp_path_factory.mktemp("equalize")
    out: dict[str, Any] = {}
    for key, target, options in [
        ("int8", "onnx-qdq", {"quantize": "int8", "per_tensor": True}),
        ("int8-no-equalize", "onnx-qdq", {"quantize": "int8", "per_tensor": True, "equalize": False,
                                          "bias_correct": False}),
        ("fixed8", "nnb", {"quantize": "fixed8"}),
        ("fixed8-no-equalize", "nnb", {"quantize": "fixed8", "equalize": False, "bias_correct": False}),
    ]:
        path = tmp / f"{key}.{'nnb' if target == 'nnb' else 'onnx'}"
        out[key] = (path, *qcc_compile(str(files.model), path, target=target, calib=str(files.calib),
                                       eval=str(files.test), **options))
    return out


@pytest.mark.parametrize("scheme", ["int8", "fixed8"])
def test_default_per_tensor_and_fixed8_within_one_point_of_float(compiled: dict[str, Any], scheme: str) -> None:
    _, _, report = compiled[scheme]
    ev = report["eval"]
    assert ev["quantized_accuracy"] >= ev["float_accuracy"] - 0.01
    assert "equalize" in report["pipeline"]
    _, _, plain = compiled[f"{scheme}-no-equalize"]
    assert plain["eval"]["quantized_accuracy"] < ev["float_accuracy"] - 0.02  # the failure it fixes


def test_per_tensor_qdq_file_holds_in_onnxruntime(compiled: dict[str, Any], mobilenet_digits_files: NetFiles) -> None:
    files = mobilenet_digits_files
    float_top1 = ort_quant.top1(ort_quant.run(files.model, {"x": files.x}), files.labels)
    path, _, _ = compiled["int8"]
    assert ort_quant.top1(ort_quant.run(path, {"x": files.x}), files.labels) >= float_top1 - 0.01


def _clamped_pair(hi: float) -> Model:
    """x -> Conv(1x1, 3 channels) -> Clip(0, hi) -> Conv(1x1) with very unequal channel ranges."""
    w1 = np.array([[[[4.0]]], [[[0.05]]], [[[1.0]]]], np.float32)
    w2 = np.array([[[[0.5]], [[20.0]], [[1.0]]]], np.float32)

    def build(g: Any, x: Any) -> Any:
        h = g.add("Conv", x, g.add_constant("w1", w1), g.add_constant("b1", np.zeros(3, np.float32)), name="a")
        h = g.add("Clip", h, name="clip", min=0.0, max=hi)
        return g.add("Conv", h, g.add_constant("w2", w2), g.add_constant("b2", np.zeros(1, np.float32)), name="b")

    return make_model({"x": ("N", 1, 4, 4)}, build)


def test_a_clamp_limits_the_scales_to_what_stays_exact() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 2, (16, 1, 4, 4)).astype(np.float32)  # channel 0 reaches 8 > 6: the clamp acts
    model = _clamped_pair(6.0)
    reference = run_model(model, {"x": x})["b"]
    ctx = PassContext(calib_data={"x": x})
    PassManager("equalize").run(model, ctx)
    w1 = model.graph.value_map()["w1"].const
    assert w1 is not None and w1[0, 0, 0, 0] == 4.0  # the saturating channel keeps scale 1
    assert abs(float(w1[1, 0, 0, 0]) - 0.05) > 1e-3  # a channel far below the clamp moved
    assert np.allclose(run_model(model, {"x": x})["b"], reference, rtol=1e-6, atol=1e-6)
    # beyond the calibration data (inputs up to 1.5x larger), still the same function
    wider = rng.uniform(0, 3, (16, 1, 4, 4)).astype(np.float32)
    assert np.allclose(run_model(model, {"x": wider})["b"], run_model(_clamped_pair(6.0), {"x": wider})["b"],
                       rtol=1e-6, atol=1e-6)


def test_without_data_a_bounded_clamp_is_left_alone_and_said_so() -> None:
    model = _clamped_pair(6.0)
    ctx = PassContext()
    PassManager("equalize").run(model, ctx)
    assert any("no calibration data" in str(e) for e in ctx.report["equalize"])
    w1 = model.graph.value_map()["w1"].const
    assert w1 is not None and np.array_equal(w1.reshape(-1), np.array([4.0, 0.05, 1.0], np.float32))


def test_no_equalize_flag_and_report(tmp_path: Path, mobilenet_digits_files: NetFiles) -> None:
    from tests.cli_util import qcc

    files = mobilenet_digits_files
    report = tmp_path / "r.json"
    proc = qcc("compile", str(files.model), "-o", str(tmp_path / "m.nnb"), "--quantize", "fixed16", "--calib",
               str(files.calib), "--no-equalize", "--no-bias-correct", "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    import json

    assert json.loads(report.read_text())["pipeline"] == ["fold-bn", "calibrate", "assign-fixed-point",
                                                          "check-fixed-point", "legalize-nnb", "plan-memory"]


def test_a_plugin_clamp_is_equalized_like_clip_from_its_registry_facts() -> None:
    """equalize asks the registry (the `clamp` trait and its `bounds`), never an op name: an op a
    plugin registers as a clamp is limited like Clip(0, 6); `clamp` without bounds is refused."""
    import qcc.ir.registry as registry
    from qcc.ir.registry import AttrSpec, OpDef, register
    from qcc.ir.surgery import replace_node

    class HardClamp(OpDef):
        """clip(x, 0, top)"""

        name = "TestHardClamp"
        attrs = {"top": AttrSpec("float", 6.0)}
        traits = frozenset({"elementwise", "clamp"})

        @staticmethod
        def bounds(attrs: dict[str, Any]) -> tuple[float | None, float | None]:
            return 0.0, float(attrs["top"])

        @staticmethod
        def kernel(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
            return [np.clip(xs[0], 0, node.attrs["top"]).astype(xs[0].dtype)]

    class Unbounded(OpDef):
        name = "TestUnboundedClamp"
        traits = frozenset({"clamp"})

    with pytest.raises(ValueError, match="clamp"):
        register(Unbounded)
    register(HardClamp)
    try:
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 2, (16, 1, 4, 4)).astype(np.float32)
        results = {}
        for op, extra in (("Clip", {"min": 0.0, "max": 6.0}), ("TestHardClamp", {"top": 6.0})):
            model = _clamped_pair(6.0)
            clip = next(n for n in model.graph.nodes if n.op == "Clip")
            replace_node(model.graph, clip, op, [clip.input(0)], extra)
            reference = run_model(model, {"x": x})["b"]
            ctx = PassContext(calib_data={"x": x})
            PassManager("equalize").run(model, ctx)
            assert np.allclose(run_model(model, {"x": x})["b"], reference, rtol=1e-6, atol=1e-6)
            results[op] = (model.graph.value_map()["w1"].const, ctx.report["equalize"])
        assert np.array_equal(results["Clip"][0], results["TestHardClamp"][0])  # type: ignore[arg-type]
        clip_entry, plugin_entry = results["Clip"][1][0], results["TestHardClamp"][1][0]
        assert plugin_entry["pair"] == "a -> TestHardClamp -> b"
        assert plugin_entry["clamp_limited_channels"] == 1  # channel 0 reaches the bound: it keeps scale 1
        assert {**plugin_entry, "pair": ""} == {**clip_entry, "pair": ""}
    finally:
        registry._REGISTRY.pop(HardClamp.name, None)
        registry._REGISTRY.pop(Unbounded.name, None)
        registry._DERIVED.clear()


def test_sweeps_stop_once_no_scale_moves_more_than_the_tolerance(mobilenet_digits_files: NetFiles) -> None:
    """equalize{tolerance=inf} stops after its first sweep (the weights of iterations=1); the default
    1% runs more of them than one and fewer than a tolerance of 1e-12 (which runs all 20)."""
    files = mobilenet_digits_files

    def weights(spec: str) -> list[bytes]:
        model, _ = folded(files, f"fold-bn,{spec}")
        return [v.const.tobytes() for v in model.graph.constants if v.const is not None]

    one, default, all_sweeps = weights("equalize{iterations=1}"), weights("equalize"), weights("equalize{tolerance=1e-12}")
    assert weights("equalize{tolerance=inf}") == one
    assert default != one
    assert default != all_sweeps


def test_large_samples_are_observed_on_fewer_of_them(mobilenet_digits_files: NetFiles) -> None:
    """equalize{input_values=640} on 64-value digits observes the first 8 samples (10 fit, a
    multiple of 4 read): the weights equalize{samples=8} gives, not those of all the samples."""
    files = mobilenet_digits_files
    budget, _ = folded(files, "fold-bn,equalize{input_values=640}")
    eight, _ = folded(files, "fold-bn,equalize{samples=8}")
    every, _ = folded(files, "fold-bn,equalize")

    def weights(model: Model) -> list[bytes]:
        return [v.const.tobytes() for v in model.graph.constants if v.const is not None]

    assert weights(budget) == weights(eight)
    assert weights(budget) != weights(every)


def _reference_step(pair: Any, work: Any) -> float:
    """The equalization step as first written: both ranges read from the weights every time,
    new arrays from channel_fold's folds (what the in-place, range-tracking sweep must equal)."""
    from qcc.passes import equalize as eq
    from qcc.passes.channel_fold import (
        fold_input_affine,
        fold_output_affine,
        input_ranges,
        output_ranges,
    )

    wa, ba = work.get(pair.a)
    wb, bb = work.get(pair.b)
    s = eq.cle_scales(output_ranges(pair.a, wa), input_ranges(pair.b, wb, pair.channels))
    if pair.smin is not None and pair.smax is not None:
        s = eq.limit_scales(s, pair.total, pair.smin, pair.smax)
    moved = float(np.max(np.abs(np.log(s)))) if s.size else 0.0
    if moved < 1e-9:
        return moved
    zeros = np.zeros(pair.channels)
    work.set(pair.a, *fold_output_affine(pair.a, wa, ba, 1.0 / s, zeros))
    work.set(pair.b, *fold_input_affine(pair.b, wb, bb, s, zeros))
    pair.total = pair.total * s
    if id(pair.a) in work.stats:
        mean, std = work.stats[id(pair.a)]
        work.stats[id(pair.a)] = (mean / s, std / s)
    return moved


def _chain() -> Model:
    """x -> Conv -> Relu -> Conv -> Relu -> depthwise Conv -> Relu -> Conv: the middle layers are
    scaled on both axes, with channel ranges far apart (folded-BatchNorm-like)."""
    rng = np.random.default_rng(3)

    def weight(*shape: int) -> np.ndarray:
        spread = np.exp2(rng.integers(-6, 7, (shape[0],) + (1,) * (len(shape) - 1)))
        return (rng.standard_normal(shape) * spread).astype(np.float32)

    def build(g: Any, x: Any) -> Any:
        h = x
        for i, (shape, group) in enumerate([((8, 3, 3, 3), 1), ((8, 8, 1, 1), 1), ((8, 1, 3, 3), 8), ((5, 8, 1, 1), 1)]):
            h = g.add("Conv", h, g.add_constant(f"w{i}", weight(*shape)),
                      g.add_constant(f"b{i}", rng.standard_normal(shape[0]).astype(np.float32)), name=f"conv{i}",
                      group=group, pads=[1, 1, 1, 1] if shape[2] == 3 else [0, 0, 0, 0])
            if i < 3:
                h = g.add("Relu", h, name=f"relu{i}")
        return h

    return make_model({"x": ("N", 3, 6, 6)}, build)


@pytest.mark.parametrize("net", ["mobilenet_digits", "chain"])
def test_tracked_ranges_give_the_bits_of_recomputed_ones(net: str, mobilenet_digits_files: NetFiles,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweeps keep per-channel ranges from the maxima instead of re-reading the weights
    (depthwise layers, a Dense head, layers scaled on both axes): every parameter must keep the
    bits the full recomputation gives."""
    from qcc.passes import equalize as eq

    def run(spec: str) -> Model:
        if net == "mobilenet_digits":
            return folded(mobilenet_digits_files, spec)[0]
        model = _chain()
        x = np.random.default_rng(4).standard_normal((8, 3, 6, 6)).astype(np.float32)
        PassManager(spec).run(model, PassContext(calib_data={"x": x}))
        return model

    before = {v.name: v.const for v in run("fold-bn").graph.values() if v.const is not None}
    tracked = run("fold-bn,equalize")
    with monkeypatch.context() as patch:
        patch.setattr(eq, "_equalize", _reference_step)
        recomputed = run("fold-bn,equalize")
    a = {v.name: v.const for v in tracked.graph.values() if v.const is not None}
    b = {v.name: v.const for v in recomputed.graph.values() if v.const is not None}
    assert a.keys() == b.keys()
    for name, array in a.items():
        assert array.dtype == b[name].dtype and array.tobytes() == b[name].tobytes(), name
    changed = sum(name in before and not np.array_equal(array, before[name]) for name, array in a.items())
    assert changed > 0  # the sweep moved weights: not a vacuous comparison


def test_range_of_scaled_weights_is_the_scaled_range() -> None:
    """The identity the tracking rests on: for f > 0, max |fl(w * f)| == fl(max |w| * f) per
    channel, through a sequence of scalings, for weights spread over many magnitudes."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 300)) * np.exp2(rng.integers(-60, 60, (64, 300)))
    r = np.abs(w).max(axis=1)
    for _ in range(30):
        f = np.exp(rng.uniform(-3, 3, 64))
        w = w * f[:, None]
        r = r * f
        assert np.abs(w).max(axis=1).tobytes() == r.tobytes()


@pytest.mark.parametrize("shape,group,axis", [((40, 24, 3, 3), 1, 0), ((40, 24, 3, 3), 1, 1), ((24, 1, 3, 3), 24, 0),
                                              ((3000, 70, 1, 1), 1, 0), ((70, 3000, 1, 1), 1, 1)])
def test_pending_multiplications_give_the_bits_of_sequential_ones(shape: tuple[int, ...], group: int,
                                                                   axis: int) -> None:
    """`_Weights` applies pending per-channel factors block by block, to only the channels some
    factor moves (a clamp-active channel's factor is exactly 1.0 in every sweep), and reads a
    range while a block is in cache: the weight and both ranges must be those of multiplying
    the whole weight by each factor in turn and reducing it afterwards (large shapes span
    several blocks)."""
    from qcc.passes import equalize as eq
    from qcc.passes.channel_fold import input_ranges, output_ranges

    rng = np.random.default_rng(5)
    ir = make_model({"x": ("N", shape[1] * group, 8, 8)}, lambda g, x: g.add(
        "Conv", x, g.add_constant("w", rng.standard_normal(shape).astype(np.float32)), name="conv", group=group))
    layer = next(n for n in ir.graph.nodes if n.op == "Conv")
    w0 = layer.input(1).const.astype(np.float64) * np.exp2(rng.integers(-20, 20, shape))
    channels = shape[axis] if group == 1 else shape[0]
    pinned = rng.random(channels) < 0.5
    factors = [np.where(pinned, 1.0, np.exp(rng.uniform(-1, 1, channels))) for _ in range(12)]
    expected = w0.copy()
    for f in factors:
        expected = expected * f.reshape([-1 if a == axis else 1 for a in range(w0.ndim)])
    for want in ("out", "in", None):
        work = eq._Weights([])
        work.arrays[id(layer)] = (layer, w0.copy(), np.zeros(shape[0]))
        for f in factors:
            (work.scale_out if axis == 0 else work.scale_in)(layer, f)
        if want == "out":
            assert work.out_range(layer).tobytes() == output_ranges(layer, expected).tobytes()
        elif want == "in":
            assert work.in_range(layer, shape[1] * group).tobytes() == \
                input_ranges(layer, expected, shape[1] * group).tobytes()
        assert work.get(layer)[0].tobytes() == expected.tobytes()


@pytest.mark.parametrize("op,shape,group", [("Dense", (1280, 1000), 1), ("Dense", (3000, 70), 1), ("Dense", (70, 3000), 1),
                                            ("ConvTranspose", (24, 40, 3, 3), 1), ("ConvTranspose", (24, 5, 3, 3), 4)])
def test_ranges_of_layers_whose_output_axis_is_1_are_read_block_by_block(op: str, shape: tuple[int, ...],
                                                                        group: int) -> None:
    """Dense and ConvTranspose (output channels on weight axis 1): their input ranges (weight
    rows) and one-group output ranges (the rows' elementwise maximum) are reduced block by block
    like a Conv's; with and without pending factors, the bits of output_ranges / input_ranges."""
    from qcc.passes import equalize as eq
    from qcc.passes.channel_fold import input_ranges, output_ranges

    rng = np.random.default_rng(6)
    w = rng.standard_normal(shape).astype(np.float32)
    cin = shape[0]
    if op == "Dense":
        ir = make_model({"x": ("N", cin)}, lambda g, x: g.add("Dense", x, g.add_constant("w", w), name="layer"))
    else:
        ir = make_model({"x": ("N", cin, 6, 6)}, lambda g, x: g.add("ConvTranspose", x, g.add_constant("w", w),
                                                                     name="layer", group=group))
    layer = next(n for n in ir.graph.nodes if n.op == op)
    w0 = w.astype(np.float64) * np.exp2(rng.integers(-20, 20, shape))
    w0[:, 0] = -0.0  # zero columns and rows: their maxima are zeros
    w0[1] = 0.0
    cout = shape[1] * group
    assert eq._blocked(layer, w0, "in", cin) == "rows"
    assert eq._blocked(layer, w0, "out", cout) == ("cols" if group == 1 else None)
    for factors in ([], [np.exp(rng.uniform(-1, 1, cin)) for _ in range(5)]):
        expected = w0.copy()
        for f in factors:
            expected = expected * f.reshape(-1, *([1] * (w0.ndim - 1)))
        for want in ("out", "in"):
            work = eq._Weights([])
            work.arrays[id(layer)] = (layer, w0.copy(), np.zeros(cout))
            for f in factors:
                work.scale_in(layer, f)
            if want == "out":
                assert work.out_range(layer).tobytes() == output_ranges(layer, expected).tobytes()
            else:
                assert work.in_range(layer, cin).tobytes() == input_ranges(layer, expected, cin).tobytes()
            assert work.get(layer)[0].tobytes() == expected.tobytes()


@pytest.mark.parametrize("shape", [(9, 32, 48, 48), (9, 384, 6, 6), (9, 960, 3, 3), (1, 64, 3, 3), (5, 7, 11),
                                   (4, 16), (3, 8, 2, 2, 2)])
def test_channel_min_max_gives_the_bits_of_the_whole_array_reduction(shape: tuple[int, ...]) -> None:
    """equalize's per-channel minimum and maximum (samples first on small maps) against numpy's
    reduction over every axis but 1: the same values and dtype, the sign of a zero and NaN
    included (a channel whose extreme is a zero or NaN falls back to the whole-array reduction)."""
    from qcc.quant.stats import channel_min_max

    rng = np.random.default_rng(7)
    for case in range(7):
        a = rng.standard_normal(shape).astype(np.float32)
        c = shape[1]
        if case == 1:  # channels that never go below or above zero, with signed zeros
            a[:, : c // 2] = np.abs(a[:, : c // 2])
            a[:, c // 2:] = -np.abs(a[:, c // 2:])
            a.reshape(-1)[rng.integers(0, a.size, a.size // 3)] = -0.0
            a.reshape(-1)[rng.integers(0, a.size, a.size // 3)] = 0.0
        elif case == 2:  # an all-zero channel of mixed signs
            a[:, 0] = np.where(rng.random(a[:, 0].shape) < 0.5, 0.0, -0.0)
        elif case == 3:
            a.reshape(-1)[rng.integers(0, a.size, 3)] = np.nan
        elif case == 4:
            a.reshape(-1)[rng.integers(0, a.size, 3)] = np.inf
            a.reshape(-1)[rng.integers(0, a.size, 3)] = -np.inf
        elif case == 5:
            a = a.astype(np.float64)
        elif case == 6:
            a = (a * 10).astype(np.int32)  # no NaN test on integers: the whole-array reduction
        axes = tuple(i for i in range(a.ndim) if i != 1)
        lo, hi = channel_min_max(a)
        for got, want in ((lo, a.min(axis=axes)), (hi, a.max(axis=axes))):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_the_data_run_stops_after_the_last_clamp_input(mobilenet_digits_files: NetFiles,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """equalize's data run leaves out the nodes no clamp input depends on (the head after the
    last clamp) and observes the per-channel ranges a full run gives."""
    from qcc.passes import equalize as eq
    from qcc.passes.quantutil import calibration_batches

    from qcc.ir.registry import get_schema
    from qcc.sim.interpreter import Interpreter

    model, ctx = folded(mobilenet_digits_files, "fold-bn")
    pairs = eq.find_pairs(model.graph)
    values = [p.clamp.input(0) for p in pairs if p.clamp is not None]
    ran: list[str] = []

    def recording(graph: Any, kernels: dict[str, Any], wanted: list[Any]) -> dict[str, Any]:
        chosen = real(graph, kernels, wanted)

        def record(kernel: Any) -> Any:
            def run(node: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
                out = kernel(node, arrays)
                if out[0] is not eq._NOT_RUN:
                    ran.append(node.name)
                return out  # type: ignore[no-any-return]
            return run

        return {op: record(chosen.get(op) or get_schema(op).kernel) for op in {n.op for n in graph.nodes}}

    real = eq._skipping
    monkeypatch.setattr(eq, "_skipping", recording)
    eq.Equalize()._observe(model, pairs, ctx)
    last = max(model.graph.nodes.index(v.producer()) for v in values)
    assert last < len(model.graph.nodes) - 1  # there is a head to leave out
    assert set(ran) == {n.name for n in model.graph.nodes[:last + 1]}  # a chain: everything before it runs
    full: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for batch in calibration_batches(model, ctx, 32, 64, eq.OBSERVED_INPUT_VALUES):
        arrays = Interpreter(model).run(batch, outputs=[v.name for v in values])
        for v in values:
            a = arrays[v.name]
            axes = tuple(i for i in range(a.ndim) if i != 1)
            lo, hi = a.min(axis=axes).astype(np.float64), a.max(axis=axes).astype(np.float64)
            old = full.get(id(v))
            full[id(v)] = (lo, hi) if old is None else (np.minimum(old[0], lo), np.maximum(old[1], hi))
    for p in pairs:
        if p.clamp is not None:
            lo, hi = full[id(p.clamp.input(0))]
            assert p.data_lo is not None and p.data_hi is not None
            assert p.data_lo.tobytes() == lo.tobytes() and p.data_hi.tobytes() == hi.tobytes()


@pytest.mark.parametrize("shape", [(1, 8, 7, 5), (3, 16, 12, 12), (9, 32, 9, 11), (2, 960, 3, 3), (5, 24, 48, 48)])
def test_channels_last_depthwise_gives_the_bits_of_conv2d(shape: tuple[int, int, int, int],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """nn.conv2d computes float32 depthwise convolutions channels last: the same products and
    tap-ordered sums as its per-channel NCHW loop, so the bytes of every output (strides, dilations,
    asymmetric padding, 1-D kernels, -0.0, NaN, inf, bias with -0.0, into a given array), and that
    loop itself for what it does not cover (a channel multiplier, a 1x1 kernel, float64)."""
    from qcc.ir.ops import nn

    def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any],
              out: np.ndarray | None = None) -> np.ndarray:
        return nn.conv2d(x, w, b, attrs, out=out)

    def nchw(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
        with monkeypatch.context() as patch:
            patch.setattr(nn, "_depthwise_channels_last", lambda *args: None)
            return nn.conv2d(x, w, b, attrs)

    rng = np.random.default_rng(8)
    _, c, h, wd = shape
    cases = 0
    for case, (k, s, d, pads) in enumerate((k, s, d, p) for k in [(3, 3), (5, 5), (1, 3), (3, 1)] for s in [1, 2]
                                          for d in [1, 2] for p in [[1, 1, 1, 1], [0, 0, 0, 0], [2, 1, 0, 1]]):
        if (h + pads[0] + pads[2] - d * (k[0] - 1) - 1) < 0 or (wd + pads[1] + pads[3] - d * (k[1] - 1) - 1) < 0:
            continue
        x = rng.standard_normal(shape).astype(np.float32)
        x.reshape(-1)[rng.integers(0, x.size, x.size // 5)] = -0.0
        if case % 7 == 0:
            x.reshape(-1)[rng.integers(0, x.size, 2)] = np.nan
        if case % 11 == 0:
            x.reshape(-1)[rng.integers(0, x.size, 2)] = np.inf
        w = rng.standard_normal((c, 1, *k)).astype(np.float32)
        w.reshape(-1)[rng.integers(0, w.size, max(1, w.size // 6))] = -0.0
        b = None if case % 3 == 0 else rng.standard_normal(c).astype(np.float32)
        if b is not None and case % 5 == 0:
            b[::2] = -0.0
        attrs = {"strides": [s, s], "pads": pads, "dilations": [d, d], "group": c}
        with np.errstate(all="ignore"):
            want = nchw(x, w, b, attrs)
            got = _conv(x, w, b, attrs)
            into = np.empty_like(want)
            _conv(x, w, b, attrs, into)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes() and into.tobytes() == want.tobytes()
        cases += 1
    assert cases > 20
    x = rng.standard_normal(shape).astype(np.float32)
    for w, attrs in [(rng.standard_normal((2 * c, 1, 3, 3)).astype(np.float32), {"group": c}),
                     (rng.standard_normal((c, 1, 1, 1)).astype(np.float32), {"group": c}),
                     (rng.standard_normal((c, c, 3, 3)).astype(np.float32), {"group": 1})]:
        full = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], **attrs}
        assert _conv(x, w, None, full).tobytes() == nchw(x, w, None, full).tobytes()
    x64 = x.astype(np.float64)
    w64 = rng.standard_normal((c, 1, 3, 3))
    full = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": c}
    assert _conv(x64, w64, None, full).tobytes() == nchw(x64, w64, None, full).tobytes()
