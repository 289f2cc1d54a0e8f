"""The compile path outside calibration (issue 19: compile vs quantize_static): what a QDQ compile
imports, what fold-bn allocates, and the faster forms of the report's, the writer's and the entropy
search's arithmetic checked against the direct formulas they replace (same values, bit for bit)."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qcc.errors import InvalidInputError
from qcc.ir.fakequant import apply_annotation
from qcc.ir.types import Affine, FixedPoint, Float32, QuantType
from qcc.quant.histerr import kl_divergences
from qcc.quant.numerics import quantize_affine

onnx = pytest.importorskip("onnx")
ROOT = Path(__file__).resolve().parent.parent


def _bn_as_mul_add(path: Path, channels: int = 8, inputs: int = 3, seed: int = 0) -> Path:
    """Conv, then a BatchNorm exported as Mul/Add of Unsqueezed per-channel constants (opset 13,
    axes as a Constant input): light_densenet121's pattern."""
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(r.normal(size=(channels, inputs, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.uniform(0.5, 2, channels).astype(np.float32), "gamma"),
             numpy_helper.from_array(r.normal(size=channels).astype(np.float32), "beta")]
    axes = helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([1, 2], np.int64)))
    nodes = [axes,
             helper.make_node("Unsqueeze", ["gamma", "axes"], ["g3"], name="unsqueeze_gamma"),
             helper.make_node("Unsqueeze", ["beta", "axes"], ["b3"], name="unsqueeze_beta"),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "g3"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "b3"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "bn_mul_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inputs, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def test_a_qdq_compile_imports_no_other_target_and_no_reference_evaluator(tmp_path: Path) -> None:
    """An onnx-qdq compile of a model with constant Unsqueezes loads neither target c's nor nnb's
    modules (the output-extension check asked every target before) nor onnx.reference (each
    constant Unsqueeze was a reference-evaluator model: 0.25 s of imports, 242 models on DenseNet)."""
    model = _bn_as_mul_add(tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(1).normal(size=(4, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "m_qdq.onnx"
    code = ("import runpy, sys\n"
            f"sys.argv = ['qcc', 'compile', {str(model)!r}, '-o', {str(out)!r}, '--target', 'onnx-qdq', '--calib', "
            f"{str(tmp_path / 'calib.npz')!r}, '--quantize', 'uint8', '-q']\n"
            "try:\n    runpy.run_module('qcc', run_name='__main__')\nexcept SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            "print(sorted(m for m in sys.modules if m.startswith(('qcc.backends.c', 'qcc.backends.nnb', "
            "'onnx.reference'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.exists()
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("opset,axes", [(13, [1, 2]), (13, [-1, 0]), (13, [0, 3]), (11, [1, 2]), (11, [0])])
def test_a_constant_unsqueeze_folds_as_onnx_reference_does(opset: int, axes: list[int]) -> None:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from qcc.frontends.onnx import _unsqueezed

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = ["x", "a"] if opset >= 13 else ["x"]
    node = helper.make_node("Unsqueeze", inputs, ["y"], **({} if opset >= 13 else {"axes": axes}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, 0, None) for n in inputs],
                              [helper.make_tensor_value_info("y", 0, None)])
    feeds = {"x": data, **({"a": np.array(axes, np.int64)} if opset >= 13 else {})}
    expected = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])).run(
        None, feeds)[0]
    ins = [data, np.array(axes, np.int64)] if opset >= 13 else [data]
    got = _unsqueezed(opset, ins, {} if opset >= 13 else {"axes": axes})
    assert got is not None and got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_a_constant_unsqueeze_with_bad_axes_is_still_refused_by_name(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    from qcc.driver import load

    axes = helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0, 0], np.int64)))
    nodes = [axes, helper.make_node("Unsqueeze", ["c", "axes"], ["c3"], name="bad_unsqueeze"),
             helper.make_node("Add", ["x", "c3"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 3])],
                              [numpy_helper.from_array(np.ones(3, np.float32), "c")])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    with pytest.raises(InvalidInputError, match="bad_unsqueeze"):
        load(str(path))


def test_fold_bn_folds_a_large_weight_without_float64_copies(tmp_path: Path) -> None:
    """The folded weight is computed in float64 but written straight into float32: the pass's
    allocation peak stays near one copy of the weight (before: its float64 copy and the float64
    product, over 4x), and the values are those of the float64 product rounded once."""
    from qcc.driver import load
    from qcc.pm import PassContext, PassManager
    from qcc.pm.manager import build_passes

    channels = 256
    model = load(str(_bn_as_mul_add(tmp_path / "big.onnx", channels=channels, inputs=192)))
    big = next(n for n in model.graph.nodes if n.op == "Conv").inputs[1].const
    assert big is not None and big.dtype == np.float32 and big.nbytes > 1_000_000
    gamma = next(n for n in model.graph.nodes if n.op == "Mul").inputs[1].const
    assert gamma is not None
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        folded = PassManager(build_passes("fold-bn")).run(model, PassContext()).model
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    new_w = next(n for n in folded.graph.nodes if n.op == "Conv").inputs[1].const
    assert new_w is not None and new_w.dtype == np.float32
    expected = (big.astype(np.float64) * np.asarray(gamma, np.float64).reshape(-1, 1, 1, 1)).astype(np.float32)
    assert not np.array_equal(expected, big)
    np.testing.assert_array_equal(new_w, expected)
    assert peak < 2 * big.nbytes, f"fold-bn peaked at {peak} bytes for a {big.nbytes}-byte weight"


def _direct_kl(hist: np.ndarray, kept_bins: np.ndarray, quantized_bins: int) -> np.ndarray:
    """kl_divergences as it was written before (integer division, two gathers per edge)."""
    h = hist.astype(np.float64)
    total = h.sum()
    i = np.asarray(kept_bins, dtype=np.int64)
    if len(h) < i.max():
        h = np.concatenate([h, np.zeros(int(i.max()) - len(h))])
    hlogh = np.where(h > 0, h * np.log(np.where(h > 0, h, 1.0)), 0.0)
    csum = np.concatenate([[0.0], np.cumsum(h)])
    cnz = np.concatenate([[0], np.cumsum(h > 0)])
    chl = np.concatenate([[0.0], np.cumsum(hlogh)])
    g = np.arange(quantized_bins + 1)
    bounds = (g[None, :] * i[:, None]) // quantized_bins
    sums = csum[bounds[:, 1:]] - csum[bounds[:, :-1]]
    nonzero = cnz[bounds[:, 1:]] - cnz[bounds[:, :-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_group = np.where(sums > 0, sums * np.log(sums / np.maximum(nonzero, 1)), 0.0)
        kept = csum[i]
        outliers = total - kept
        last = h[i - 1]
        p_last = last + outliers
        a = chl[i - 1] + np.where(p_last > 0, p_last * np.log(np.where(p_last > 0, p_last, 1.0)), 0.0)
        q_last = sums[:, -1] / np.maximum(nonzero[:, -1], 1)
        b = per_group.sum(axis=1) + np.where(outliers > 0, outliers * np.log(np.where(q_last > 0, q_last, 1.0)), 0.0)
        kl = a / total - np.log(total) - b / total + np.log(kept)
    return np.where((last == 0) & (outliers > 0), np.inf, np.maximum(kl, 0.0))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), levels=st.sampled_from([2, 7, 100, 128, 256]),
       sparsity=st.floats(0.0, 0.95))
def test_kl_divergences_are_the_direct_formulas_bit_for_bit(seed: int, levels: int, sparsity: float) -> None:
    r = np.random.default_rng(seed)
    n = int(r.integers(levels + 1, levels * 4 + 2))
    hist = r.integers(0, 50, n).astype(np.int64)
    hist[r.random(n) < sparsity] = 0
    hist[0] += 1
    kept = np.arange(levels, n + 1)
    got, want = kl_divergences(hist, kept, levels), _direct_kl(hist, kept, levels)
    assert got.tobytes() == want.tobytes()


def _direct_entry(x: np.ndarray, quant: QuantType) -> tuple[float, float, float]:
    """(clip fraction, noise, signal) as parameter_entry computed them with fresh arrays."""
    from qcc.passes.quantreport import _steps

    err = apply_annotation(x, quant) - x
    half = 0.5 * _steps(quant, x.ndim) * (1.0 + 1e-6)
    clip = float(np.count_nonzero(np.abs(err) > half)) / x.size
    return (clip, float(np.sum(np.square(err, dtype=np.float64), dtype=np.float64)),
            float(np.sum(np.square(x), dtype=np.float64)))


@pytest.mark.parametrize("quant", [
    Affine((0.01,), (0,), "int8"),
    Affine((0.003,), (3,), "uint8"),  # clips: the range is narrower than the data
    Affine(tuple(np.linspace(0.001, 0.02, 16).tolist()), (0,) * 16, "int8", 0),
    FixedPoint(8, 6),
    Float32(),
])
def test_parameter_entry_reports_what_the_direct_formulas_give(quant: QuantType) -> None:
    from qcc.passes.quantreport import _db, parameter_entry

    x = np.random.default_rng(3).normal(scale=0.5, size=(16, 8, 3, 3)).astype(np.float32)
    before = x.copy()
    entry = parameter_entry(x, quant)
    clip, noise, signal = _direct_entry(x, quant)
    np.testing.assert_array_equal(x, before)  # the parameter itself is never written
    assert entry["clip_fraction"] == clip
    assert entry["sqnr_db"] == _db(signal, noise)
    if isinstance(quant, Affine) and quant.dtype == "uint8":
        assert clip > 0


@pytest.mark.parametrize("annotated,storage,axis", [
    ("int8", "uint8", 0), ("int8", "uint8", None), ("int8", "int8", 0), ("uint8", "uint8", None),
    ("int4", "int4", 0), ("int8", "int16", 0)])
def test_qdq_stored_integers_are_the_annotations_moved_to_the_storage_zero_point(
        annotated: str, storage: str, axis: int | None) -> None:
    from qcc.backends.onnx_qdq import QParams, integers, numpy_dtype

    from qcc.ir.core import Graph
    from qcc.quant.numerics import AFFINE_DTYPES

    r = np.random.default_rng(5)
    w = r.normal(scale=0.3, size=(6, 4, 3, 3)).astype(np.float32)
    w[0, 0, 0, 0] = 50.0  # saturates
    channels = 6 if axis is not None else 1
    scales = np.linspace(0.004, 0.03, channels).astype(np.float32)
    lo, hi = AFFINE_DTYPES[annotated]
    zps = np.full(channels, (lo + hi + 1) // 2 if annotated.startswith("u") else 0, np.int64)
    quant = Affine(tuple(float(s) for s in scales), tuple(int(z) for z in zps), annotated, axis)
    graph = Graph(name="g")
    value = graph.add_constant("w", w)
    value.quant = quant
    shift = AFFINE_DTYPES[storage][0] - lo
    params = QParams(storage, scales if axis is not None else scales.reshape(()),
                     (zps + shift).astype(numpy_dtype(storage)) if axis is not None
                     else np.asarray(zps[0] + shift).astype(numpy_dtype(storage)), axis)
    got = integers(value, params)
    q = quantize_affine(w, scales if axis is not None else scales[0], zps if axis is not None else zps[0],
                        annotated, axis).astype(np.int64)
    want = (q + shift).astype(numpy_dtype(storage))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scale,zero_point,problem", [
    ((float("nan"), 0.1), (0, 0), "finite"), ((float("inf"), 0.1), (0, 0), "finite"),
    ((0.1, 0.0), (0, 0), "finite"), ((0.1, -0.2), (0, 0), "finite"), ((0.1, 0.2), (0, 200), "zero point"),
    ((0.1, 0.2), (-129, 0), "zero point")])
def test_verify_still_names_bad_affine_parameters(scale: tuple[float, ...], zero_point: tuple[int, ...],
                                                  problem: str) -> None:
    from qcc.ir.core import Graph
    from qcc.ir.verify import verify_graph

    graph = Graph(name="g")
    value = graph.add_constant("w", np.ones((2, 3), np.float32))
    value.quant = Affine(scale, zero_point, "int8", 0)
    assert any(problem in p and "'w'" in p for p in verify_graph(graph))
    value.quant = Affine((0.1, 0.2), (0, 127), "int8", 0)
    assert not [p for p in verify_graph(graph) if "'w'" in p]


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 70), cols=st.integers(1, 300), dtype=st.sampled_from(["float32", "float64", "int8"]),
       view=st.sampled_from(["transposed", "plain", "strided"]))
def test_a_gemm_weight_is_copied_contiguous_as_numpy_copies_it(rows: int, cols: int, dtype: str, view: str) -> None:
    """The ONNX importer's blocked transposed copy (qcc.frontends.onnx.contiguous) is np.ascontiguousarray."""
    from qcc.frontends.onnx import contiguous

    w = (np.random.default_rng(rows * cols).standard_normal((rows, cols * 20)) * 100).astype(dtype)
    v = {"transposed": w.T, "plain": w, "strided": w[:, ::3].T}[view]
    want, got = np.ascontiguousarray(v), contiguous(v)
    assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()
    if view == "plain":
        assert got is v  # already contiguous: no copy, as numpy


def test_only_the_qcc_process_tunes_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() without arguments is the `qcc` process itself; a caller's main([...]) leaves its process alone."""
    import qcc.cli as cli

    calls: list[int] = []
    monkeypatch.setattr(cli, "_keep_freed_memory", lambda: calls.append(1))
    monkeypatch.setattr(sys, "argv", ["qcc", "--version"])
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert calls == []
    with pytest.raises(SystemExit):
        cli.main()
    assert calls == [1]


def test_malloc_tuning_runs_in_a_qcc_process() -> None:
    code = "import qcc.cli as c; c._keep_freed_memory(); c._keep_freed_memory(); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
