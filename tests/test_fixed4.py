"""fixed4: 4-bit fixed-point weights, 8-bit fixed-point activations (issue 18, item 3).

Oracles: the float model (accuracy, SQNR), qcc's integer simulator (`run_fixed`, `FixedRunner`)
for the C code gcc builds and the decoded .nnb, nnabla-c-runtime where `nnablart` is available,
onnxruntime for the QDQ file.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.backends.c import BACKEND as C_BACKEND
from qcc.backends.c import generate

from qcc.driver import compile as qcc_compile
from qcc.errors import UsageError
from qcc.ir.core import Model
from qcc.ir.types import FixedPoint
from qcc.settings_template import write_settings
from qcc.sim.fixed import FixedRunner, dedicated_problem, fixed_of, quantize_round
from tests import ort_quant
from tests.cli_util import DIGITS, one_error_line, qcc
from tests.nnb_util import nnablart, run_nnablart

TEST = np.load(DIGITS / "test.npz")
X = TEST["x"][:120]


@pytest.fixture(scope="module")
def nnb4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """digits_cnn compiled to .nnb with fixed4: learned rounding (the default) and nearest."""
    from tests.test_ptq_rounding import compile_both_roundings

    return compile_both_roundings(tmp_path_factory.mktemp("fixed4"), ".nnb", default="learned", quantize="fixed4")


def _layers(model: Model) -> list[Any]:
    return [n for n in model.graph.nodes if n.op in ("Conv", "Dense")]


def test_learned_rounding_is_the_default_and_keeps_fixed4_within_two_points(nnb4: dict[str, Any]) -> None:
    _, model, learned = nnb4["learned"]
    _, _, nearest = nnb4["nearest"]
    assert learned["pipeline"][:6] == ["fold-bn", "equalize", "calibrate", "assign-fixed-point", "learned-rounding",
                                       "bias-correct"]
    ev = learned["eval"]
    assert ev["quantized_accuracy"] >= ev["float_accuracy"] - 0.02
    # bias-correct measured against learned-rounding's own weights and shifted bias once (9.7 dB)
    gain = ev["output_sqnr_db"] - nearest["eval"]["output_sqnr_db"]
    assert gain >= 0.5, gain
    for layer in learned["learned_rounding"]:
        assert layer["learned_sqnr_db"] > layer["nearest_sqnr_db"]
    for node in _layers(model):
        w, x, y = node.input(1).quant, node.input(0).quant, node.outputs[0].quant
        assert isinstance(w, FixedPoint) and w.bits == 4, (node.name, w)
        assert isinstance(x, FixedPoint) and x.bits == 8 and isinstance(y, FixedPoint) and y.bits == 8
        assert dedicated_problem(node) is None, node.name  # the runtime's integer kernel, not the float one
        assert y.frac <= x.frac + w.frac  # nnabla-c-runtime's product rule
        q = quantize_round(node.input(1).const, w)
        assert q.min() >= -8 and q.max() <= 7
        assert np.array_equal(np.ldexp(q.astype(np.float32), -w.frac), node.input(1).const)  # learned grid points


def test_nnb_stores_4bit_weights_as_fixed8_exactly(nnb4: dict[str, Any], tmp_path: Path) -> None:
    from qcc.backends.nnb.format import DataType, read_nnb
    from qcc.backends.nnb.lift import lift_nnb

    path, model, report = nnb4["learned"]
    nnb = read_nnb(path.read_bytes(), str(path))
    weights = {n.input(1).name: n.input(1) for n in _layers(model)}
    assert any("4-bit fixed point (fixed4), stored as FIXED8" in note and str(sum(w.const.size for w in
               weights.values())) in note for note in report["nnb"]["notes"])
    lifted = lift_nnb(nnb)
    pairs = list(zip(_layers(model), _layers(lifted), strict=True))
    for ours, theirs in pairs:
        w, quant = ours.input(1), theirs.input(1).quant
        assert isinstance(quant, FixedPoint) and quant.bits == 8 and quant.frac == w.quant.frac  # type: ignore[union-attr]
        assert int(np.abs(theirs.input(1).const * 2.0**quant.frac).max()) <= 8
    assert {v.dtype for v in nnb.variables if v.buffer is not None} == {DataType.INT8}
    want = FixedRunner(model).run_stored({"x": X})["logits"]
    got = FixedRunner(lifted).run_stored({lifted.graph.inputs[0].name: X})[lifted.graph.outputs[0].name]
    assert np.array_equal(got, want)


@pytest.mark.skipif(nnablart() is None, reason="no nnablart build (set QCC_NNABLART)")
def test_nnabla_c_runtime_runs_fixed4_bit_exact(nnb4: dict[str, Any], tmp_path: Path) -> None:
    binary = nnablart()
    assert binary is not None
    path, model, _ = nnb4["learned"]
    fixed = fixed_of(model.graph.inputs[0])
    assert fixed is not None
    for i in range(8):
        x = X[i:i + 1]
        (out,) = run_nnablart(binary, path, [quantize_round(x, fixed).astype(np.int8)], tmp_path)
        want = FixedRunner(model).run_stored({"x": x})["logits"].reshape(-1)
        assert np.array_equal(np.frombuffer(out, np.int8).astype(np.int64), want)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_packs_4bit_weights_two_a_byte_bit_exact(nnb4: dict[str, Any], tmp_path: Path) -> None:
    from tests.test_backend_c import build, outputs_of, run_c

    _, model, _ = nnb4["learned"]  # .nnb and C share nnabla-c-runtime's rules: the same model
    count = sum(n.input(1).const.size for n in _layers(model))
    packed, wide = generate(model, "m"), generate(model, "m", weights4="int8")
    assert "qcc_unpack4(" in packed.files["m.c"] and "qcc_unpack4" not in wide.files["m.c"]
    assert packed.notes and f"{count} 4-bit weights of 7 layers stored two a byte" in packed.notes[0]
    stored = {g: int(note.split("(")[1].split(" bytes")[0]) for g, note in (("packed", packed.notes[0]),
                                                                        ("int8", wide.notes[0]))}
    assert stored["packed"] * 2 <= stored["int8"] + 7  # odd-sized layers pad one nibble each
    largest = max(n.input(1).const.size for n in _layers(model))
    assert largest > 2048  # conv5 runs in slices of output channels: at most unpack_bytes (2048) more arena
    assert wide.arena_bytes < packed.arena_bytes <= wide.arena_bytes + 2048
    exe = build(model, tmp_path / "digits4", sanitize=False)  # default options: packed (ASan: the test below)
    got = run_c(exe, X, 10)
    want = outputs_of(model, {"x": X}, fixed=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert "qcc_unpack4" in (tmp_path / "digits4" / "digits4.c").read_text()
    wide_dir = tmp_path / "wide"
    C_BACKEND.write(model, wide_dir, C_BACKEND.make_options(weights4="int8"))
    assert "qcc_unpack4" not in (wide_dir / "wide.c").read_text()


def test_qdq_writes_fixed4_weights_as_int4_power_of_two(tmp_path: Path) -> None:
    import onnx

    path = tmp_path / "q4.onnx"
    model, _ = qcc_compile(str(DIGITS / "digits_cnn.onnx"), path, target="onnx-qdq", quantize="fixed4",
                           calib=str(DIGITS / "calib.npz"), rounding="nearest")
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version >= 21
    names = {n.input(1).name for n in _layers(model)}
    int4 = {t.name for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT4}
    assert {f"{n}_quantized" for n in names} <= int4
    scales = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.name.endswith("_scale")}
    for node in _layers(model):
        frac = node.input(1).quant.frac  # type: ignore[union-attr]
        assert scales[f"{node.input(1).name}_scale"] == np.float32(2.0**-frac)
    from qcc.sim.interpreter import Interpreter

    fake = Interpreter(model, quantized=True).run({"x": X})["logits"]
    plain = ort_quant.run(path, {"x": X}, optimize=False)
    step = float(model.graph.outputs[0].quant.step)  # type: ignore[union-attr]
    assert np.abs(plain - fake).max() <= step * 1.001


def test_cli_fixed4_and_settings_refusal(tmp_path: Path) -> None:
    out = tmp_path / "d.nnb"
    proc = qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--quantize", "fixed4", "--calib",
               str(DIGITS / "calib.npz"), "--rounding", "nearest")
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
    with pytest.raises(UsageError, match="no 4-bit type"):
        write_settings(str(tmp_path / "m.nnp"), str(tmp_path / "s.yaml"), calib=str(DIGITS / "calib.npz"),
                       quantize="fixed4")
    proc = qcc("settings", str(tmp_path / "m.nnp"), "-o", str(tmp_path / "s.yaml"), "--calib",
               str(DIGITS / "calib.npz"), "--quantize", "fixed4")
    assert proc.returncode == 2 and "no 4-bit type" in one_error_line(proc)
    assert not (tmp_path / "s.yaml").exists()


def _build(model: Model, directory: Path, **options: Any) -> Path:
    """test_c_kernels.build under ASan/UBSan, with target options."""
    from tests.test_backend_c import SANITIZE
    from tests.test_c_kernels import build

    return build(model, directory, SANITIZE, **options)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_unpacks_odd_counts_and_slices_of_channels_and_groups(tmp_path: Path) -> None:
    from qcc.ir.core import Graph
    from qcc.ir.types import TensorType
    from tests.fixed_models import annotate_fixed
    from tests.test_backend_c import outputs_of, run_c

    rng = np.random.default_rng(4)
    g = Graph("odd")
    x = g.add_input("x", TensorType("float32", ("N", 3, 7, 7)))

    def const(name: str, *shape: int) -> Any:
        return g.add_constant(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))

    c = g.add("Conv", x, const("w1", 5, 3, 3, 3), const("b1", 5), name="conv", pads=[1, 1, 1, 1])  # 135 weights
    r = g.add("Relu", c, name="relu")
    dw = g.add("Conv", r, const("w2", 5, 1, 3, 3), name="depthwise", group=5, pads=[1, 1, 1, 1])  # 45
    gc = g.add("Conv", dw, const("w3", 4, 5, 1, 1), name="conv2")  # 20
    grouped = g.add("Conv", gc, const("w4", 6, 2, 3, 3), name="grouped", group=2, pads=[0, 1, 0, 1])  # 108
    fl = g.add("Flatten", g.add("GlobalAvgPool", grouped, name="gap"), name="flatten")
    g.outputs = [g.add("Dense", fl, const("wfc", 6, 7), const("bfc", 7), name="fc")]
    model = annotate_fixed(Model(g), {"x": rng.standard_normal((8, 3, 7, 7)).astype(np.float32)}, 8, 4, seed=1)
    assert all(n.input(1).quant.bits == 4 for n in _layers(model))  # type: ignore[union-attr]
    exe = _build(model, tmp_path / "odd4", unpack_bytes=16)
    feeds = rng.standard_normal((16, 3, 7, 7)).astype(np.float32)
    got = run_c(exe, feeds, 7)
    assert np.array_equal(got.view(np.uint32), outputs_of(model, {"x": feeds}, fixed=True).view(np.uint32))
    calls = (tmp_path / "odd4" / "odd4.c").read_text().count("qcc_unpack4(") - 1  # less the kernel
    # 16 bytes: conv 1 channel (27 weights) a slice, depthwise 1 group, conv2 3 channels, grouped 1 group
    # (3 channels), fc one block of columns
    assert calls == 5 + 5 + 2 + 2 + 1
