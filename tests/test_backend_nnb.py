"""The nnb target: files nnabla-c-runtime runs as qcc's simulator computes.

Oracles: qcc's fixed-point simulator (qcc.sim.fixed) on the compiled model, the same simulator
on the file decoded back to IR (lift.py: the CI emulation of a file), nnabla's own converter
(`--plan nnabla` must match it byte for byte) and, where a build exists, nnablart itself.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.backends.nnb.backend import build_nnb
from qcc.backends.nnb.format import DataType, NnbFile, read_nnb, write_nnb
from qcc.backends.nnb.functions import default_table
from qcc.backends.nnb.legalize import LegalizeNnb
from qcc.backends.nnb.lift import lift_nnb
from qcc.backends.nnb.plan import lifetimes

from qcc.driver import compile as qcc_compile
from qcc.driver import load
from qcc.errors import InternalError, InvalidInputError, UnsupportedError
from qcc.ir.core import Graph, Model
from qcc.ir.types import FixedPoint, TensorType
from qcc.pm import PassContext, PassManager
from qcc.sim.fixed import FixedRunner, fixed_of, quantize_round
from qcc.sim.interpreter import run_model

from .nnb_util import build_nnp_models, fixed_settings, nnabla_cli, nnablart, run_nnablart

DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits"
NP_TYPES = {DataType.FLOAT: np.float32, DataType.INT16: np.int16, DataType.INT8: np.int8}


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Model, Path]]:
    """The bundled digits CNN compiled float, FIXED16 and FIXED8 (default pipelines)."""
    out = tmp_path_factory.mktemp("digits")
    models = {}
    for scheme in ("none", "fixed16", "fixed8"):
        path = out / f"{scheme}.nnb"
        calib = str(DIGITS / "calib.npz") if scheme != "none" else None
        model, _ = qcc_compile(str(DIGITS / "digits_cnn.onnx"), str(path), quantize=scheme, calib=calib)
        models[scheme] = (model, path)
    return models


@pytest.fixture(scope="module")
def test_set() -> dict[str, np.ndarray]:
    data = np.load(DIGITS / "test.npz")
    return {"x": data["x"], "labels": data["labels"]}


def _stored(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The simulator's stored outputs (integers for fixed point), in graph output order."""
    result = FixedRunner(model).run_stored(feeds)
    return [result[v.name] for v in model.graph.outputs]


def _emulate(path: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The file decoded and lifted to IR, run by the simulator."""
    lifted = lift_nnb(read_nnb(path.read_bytes(), str(path)))
    return _stored(lifted, {v.name: x for v, x in zip(lifted.graph.inputs, inputs)})


# ----------------------------------------------------------------------------- digits


@pytest.mark.parametrize("scheme", ["none", "fixed16", "fixed8"])
def test_decoded_file_emulates_the_model_exactly(digits: dict, test_set: dict, scheme: str) -> None:
    """Weights (Affine transposed), positions, arguments and buffers: the file computes what the
    model does, integer for integer (float: the same float32 kernels, so also exactly)."""
    model, path = digits[scheme]
    x = test_set["x"][:120]
    want = _stored(model, {"x": x})
    got = _emulate(path, [x])
    assert len(got) == len(want) == 1
    np.testing.assert_array_equal(got[0], want[0])
    if scheme != "none":
        assert got[0].dtype == np.int64 and fixed_of(model.graph.outputs[0]) is not None


def test_float_file_matches_the_float_model(digits: dict, test_set: dict) -> None:
    _model, path = digits["none"]
    x = test_set["x"][:120]
    ref = run_model(load(str(DIGITS / "digits_cnn.onnx")), {"x": x})["logits"]
    np.testing.assert_allclose(_emulate(path, [x])[0], ref, rtol=1e-5, atol=1e-5)


def test_quantized_outputs_within_quantization_error(digits: dict, test_set: dict) -> None:
    """Top-1 as the float model's; logits error small for 16 bits, bounded for 8."""
    x, labels = test_set["x"], test_set["labels"]
    ref = run_model(digits["none"][0], {"x": x})["logits"]
    float_acc = float(np.mean(ref.argmax(1) == labels))
    for scheme, min_sqnr, min_agree in (("fixed16", 40.0, 0.99), ("fixed8", 10.0, 0.97)):
        model = digits[scheme][0]
        y = FixedRunner(model).run({"x": x})[model.graph.outputs[0].name]
        sqnr = 10 * np.log10(np.sum(ref**2) / np.sum((ref - y) ** 2))
        assert sqnr > min_sqnr, (scheme, sqnr)
        assert np.mean(y.argmax(1) == ref.argmax(1)) >= min_agree
        assert np.mean(y.argmax(1) == labels) >= float_acc - 0.02


def test_file_types_and_sizes(digits: dict) -> None:
    """FIXED16 halves and FIXED8 quarters parameters and buffers; every activation of a
    fixed-point model is stored fixed point."""
    nnbs = {s: read_nnb(p.read_bytes(), s) for s, (_, p) in digits.items()}
    params = {s: sum(len(v.data) for v in n.variables if v.data is not None) for s, n in nnbs.items()}
    buffers = {s: sum(n.buffers) for s, n in nnbs.items()}
    assert params["fixed16"] * 1.9 < params["none"] < params["fixed16"] * 2.1
    assert params["fixed8"] * 3.7 < params["none"] < params["fixed8"] * 4.1
    assert buffers["none"] == 2 * buffers["fixed16"] == 4 * buffers["fixed8"]
    for scheme, dtype in (("fixed16", DataType.INT16), ("fixed8", DataType.INT8)):
        assert {v.dtype for v in nnbs[scheme].variables if v.buffer is not None} == {dtype}


@pytest.mark.skipif(nnablart() is None, reason="no nnablart build (set QCC_NNABLART)")
@pytest.mark.parametrize("scheme", ["none", "fixed16", "fixed8"])
def test_nnablart_agrees_with_the_simulator(digits: dict, test_set: dict, tmp_path: Path, scheme: str) -> None:
    binary = nnablart()
    assert binary is not None
    model, path = digits[scheme]
    nnb = read_nnb(path.read_bytes(), str(path))
    xin, xout = nnb.variables[nnb.inputs[0]], nnb.variables[nnb.outputs[0]]
    fixed = fixed_of(model.graph.inputs[0])
    for i in range(12):
        x = test_set["x"][i : i + 1]
        raw = quantize_round(x, fixed).astype(NP_TYPES[xin.dtype]) if fixed is not None else x
        (out,) = run_nnablart(binary, path, [raw], tmp_path)
        got = np.frombuffer(out, NP_TYPES[xout.dtype])
        want = _stored(model, {"x": x})[0].reshape(-1)
        if scheme == "none":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(got.astype(np.int64), want)


# ----------------------------------------------------------------------------- memory


def _plans(model: Model, version: int) -> tuple[int, int]:
    result = build_nnb(model, nnb_version=version)
    return result.buffer_bytes, result.nnabla_buffer_bytes


@pytest.mark.parametrize("scheme", ["none", "fixed16", "fixed8"])
def test_buffers_below_nnabla_policy_on_digits(digits: dict, scheme: str) -> None:
    for version in (2, 3):
        ours, theirs = _plans(digits[scheme][0], version)
        assert ours < theirs, (scheme, version, ours, theirs)


def test_buffer_sharing_is_sound(digits: dict) -> None:
    """Variables in one buffer never hold live data at once, except where the runtime's kernel
    is element-wise in place or the variable is a same-type Reshape of the other."""
    model = digits["fixed8"][0]
    result = build_nnb(model)
    program = result.program
    assert program is not None
    life = lifetimes(program, 3)
    groups_by_buffer: dict[int, list[Any]] = {}
    for index, members in enumerate(life.members):
        buffer = result.nnb.variables[program.variables.index(members[0])].buffer
        assert buffer is not None
        assert {result.nnb.variables[program.variables.index(v)].buffer for v in members} == {buffer}
        groups_by_buffer.setdefault(buffer, []).append(life.groups[index])
    for groups in groups_by_buffer.values():
        groups.sort(key=lambda g: g.first)
        for a, b in itertools.pairwise(groups):
            assert a.last < b.first
    assert max(len(m) for m in life.members) > 1  # in-place functions do share


# ----------------------------------------------------------------------------- nnabla compatibility

COMPAT_CASES = {
    "v2": ["--api", "44"],
    "v3": ["--api", "44", "-d", "nnb_3"],
    "fixed16-v3": ["--api", "44", "-d", "nnb_3"],
}


@pytest.fixture(scope="module")
def nnp_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """.nnp networks and what nnabla_cli convert makes of them (one batch of CLI calls)."""
    pytest.importorskip("nnabla")
    d = tmp_path_factory.mktemp("nnp")
    names = build_nnp_models(d)
    nnabla_cli(*(["nnb_template", "-b", "1", "--api", "44", str(d / f"{n}.nnp"), str(d / f"{n}.tmpl.yaml")]
                 for n in names))
    commands = []
    for name in names:
        fixed_settings(d / f"{name}.tmpl.yaml", d / f"{name}.fixed16.yaml")
        for case, opts in COMPAT_CASES.items():
            extra = ["-s", str(d / f"{name}.fixed16.yaml")] if case.startswith("fixed16") else []
            commands.append(["convert", "-b", "1", *opts, *extra, str(d / f"{name}.nnp"),
                             str(d / f"{name}.{case}.nnabla.nnb")])
    nnabla_cli(*commands)
    return d, names


def _compat_args(d: Path, name: str, case: str) -> list[str]:
    args = ["--plan", "nnabla", "--nnb-version", "2" if case == "v2" else "3"]
    if case.startswith("fixed16"):
        args += ["--settings", str(d / f"{name}.fixed16.yaml")]
    return args


def _qcc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`qcc ARGS` in this process: (exit status, stdout, stderr)."""
    from qcc.cli import main

    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("case", sorted(COMPAT_CASES))
def test_plan_nnabla_is_byte_identical_to_nnabla_cli(nnp_models: tuple[Path, list[str]], case: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    d, names = nnp_models
    for name in names:
        out = d / f"{name}.{case}.qcc.nnb"
        status, _, err = _qcc(capsys, "compile", str(d / f"{name}.nnp"), "-o", str(out), *_compat_args(d, name, case))
        assert status == 0, err
        assert out.read_bytes() == (d / f"{name}.{case}.nnabla.nnb").read_bytes(), (name, case)


def test_nnabla_reorders_branches_and_qcc_follows(nnp_models: tuple[Path, list[str]]) -> None:
    """The residual net's file order is not nnabla's execution order; compat mode uses the
    latter (so the byte identity above is not an accident of a chain)."""
    from qcc.backends.nnb.compat import _expander_order

    from qcc.formats.nnp_archive import read_nnp

    d, _ = nnp_models
    network = read_nnp(d / "resnet.nnp").proto.network[0]
    order = [f.name for f in _expander_order(list(network.function))]
    assert sorted(order) == sorted(f.name for f in network.function)
    assert order != [f.name for f in network.function]


def test_qcc_plan_buffers_below_nnabla_files(nnp_models: tuple[Path, list[str]]) -> None:
    """Same network, same types: qcc's plan needs fewer buffer bytes than nnabla's own file,
    unless nnabla's already meets the lower bound for shared objects (the residual net's
    widest step holds three full-size tensors in any plan)."""
    d, names = nnp_models
    for name in names:
        for case in ("v3", "fixed16-v3"):
            theirs = read_nnb((d / f"{name}.{case}.nnabla.nnb").read_bytes(), "nnabla")
            settings = str(d / f"{name}.fixed16.yaml") if case != "v3" else None
            _, report = qcc_compile(str(d / f"{name}.nnp"), str(d / f"{name}.{case}.own.nnb"), settings=settings)
            ours = read_nnb((d / f"{name}.{case}.own.nnb").read_bytes(), "qcc")
            bound = report["nnb"]["buffer_lower_bound"]
            assert sum(ours.buffers) == report["nnb"]["buffer_bytes"] >= bound
            if sum(theirs.buffers) == bound:
                assert sum(ours.buffers) == bound, (name, case)
            else:
                assert sum(ours.buffers) < sum(theirs.buffers), (name, case, ours.buffers, theirs.buffers)
    assert name == "ks"  # every model was checked


def test_settings_model_emulates_exactly(nnp_models: tuple[Path, list[str]]) -> None:
    """qcc's own plan with nnabla's FIXED16 settings pinned: file and model agree exactly."""
    d, names = nnp_models
    rng = np.random.RandomState(3)
    for name in names:
        path = d / f"{name}.pinned.nnb"
        model, _ = qcc_compile(str(d / f"{name}.nnp"), str(path), settings=str(d / f"{name}.fixed16.yaml"))
        assert all(v.meta.get("pinned") for v in model.graph.inputs)
        x = rng.randn(*[1 if isinstance(s, str) else s for s in model.graph.inputs[0].type.shape])
        want = _stored(model, {model.graph.inputs[0].name: x.astype(np.float32)})
        got = _emulate(path, [x.astype(np.float32)])
        np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.skipif(nnablart() is None, reason="no nnablart build (set QCC_NNABLART)")
def test_nnablart_runs_the_nnp_models(nnp_models: tuple[Path, list[str]], tmp_path: Path) -> None:
    binary = nnablart()
    assert binary is not None
    d, names = nnp_models
    rng = np.random.RandomState(4)
    for name in names:
        for settings in (None, str(d / f"{name}.fixed16.yaml")):
            path = tmp_path / f"{name}.nnb"
            model, _ = qcc_compile(str(d / f"{name}.nnp"), str(path), settings=settings)
            nnb = read_nnb(path.read_bytes(), str(path))
            value = model.graph.inputs[0]
            x = rng.randn(*nnb.variables[nnb.inputs[0]].shape).astype(np.float32)
            fixed = fixed_of(value)
            raw = quantize_round(x, fixed).astype(np.int16) if fixed is not None else x
            (out,) = run_nnablart(binary, path, [raw], tmp_path)
            got = np.frombuffer(out, NP_TYPES[nnb.variables[nnb.outputs[0]].dtype]).astype(np.float64)
            want = _stored(model, {value.name: x})[0].reshape(-1)
            if fixed is None:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- lowering


def _ops_model() -> Model:
    """One graph with most lowerings: depthwise conv, scalar and tensor arithmetic, clip,
    softmax, slicing, padding, concat/split, transpose, reductions, global pooling, matmul."""
    rng = np.random.RandomState(7)
    g = Graph("ops")
    x = g.add_input("x", TensorType("float32", (1, 4, 6, 6)))

    def const(name: str, *shape: int) -> Any:
        return g.add_constant(name, rng.randn(*shape).astype(np.float32))

    h = g.add("Conv", x, const("dw", 4, 1, 3, 3), const("dwb", 4), pads=[1, 1, 1, 1], group=4, name="dw")
    h = g.add("Clip", h, min=-1.0, max=1.5, name="clip")
    h = g.add("Add", h, g.add_constant("half", np.array(0.5, np.float32)), name="addc")
    h = g.add("Div", h, g.add_constant("three", np.array(3.0, np.float32)), name="divc")
    h = g.add("Sub", g.add_constant("one", np.array(1.0, np.float32)), h, name="rsub")
    h = g.add("Mul", h, const("scale", 1, 4, 1, 1), name="mulc")
    a, b = g.add_node("Split", [h], {"axis": 1, "split": [1, 3]}, name="split").outputs
    h = g.add("Concat", g.add("Sigmoid", b, name="sig"), g.add("Tanh", a, name="tanh"), axis=1, name="cat")
    h = g.add("Pad", h, pads=[0, 0, 1, 0, 0, 0, 0, 1], name="pad")
    h = g.add("Slice", h, starts=[1, 0], ends=[7, 6], axes=[2, 3], name="slice")
    h = g.add("Transpose", h, perm=[0, 1, 3, 2], name="tr")
    s = g.add("ReduceMean", h, axes=[1], keepdims=True, name="mean")
    h = g.add("Sub", h, s, name="center")
    h = g.add("LeakyRelu", h, alpha=0.1, name="leaky")
    p = g.add("GlobalAvgPool", h, name="gap")
    f = g.add("Flatten", p, name="flat")
    y = g.add("MatMul", f, const("w", 4, 5), name="mm")
    y = g.add("Softmax", g.add("Max", y, g.add_constant("lo", np.array(-0.2, np.float32)), name="max"), name="soft")
    g.outputs = [y, g.add("ReduceSum", h, axes=[2, 3], keepdims=False, name="sum")]
    return Model(g)


def test_lowered_ops_emulate_like_the_model(tmp_path: Path) -> None:
    model = _ops_model()
    path = tmp_path / "ops.nnb"
    qcc_compile(model, str(path))
    x = np.random.RandomState(0).randn(1, 4, 6, 6).astype(np.float32)
    want = run_model(model, {"x": x})
    got = _emulate(path, [x])
    for value, array in zip(model.graph.outputs, got):
        np.testing.assert_allclose(array, want[value.name], rtol=1e-5, atol=1e-6)
    binary = nnablart()
    if binary is not None:
        nnb = read_nnb(path.read_bytes(), str(path))
        outs = run_nnablart(binary, path, [x], tmp_path)
        for value, raw in zip(model.graph.outputs, outs):
            np.testing.assert_allclose(np.frombuffer(raw, np.float32).reshape(want[value.name].shape),
                                       want[value.name], rtol=1e-5, atol=1e-6)
        assert len(outs) == len(nnb.outputs)


def test_unsupported_op_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    g = Graph("erf")
    x = g.add_input("x", TensorType("float32", (1, 4, 3, 3)))
    g.outputs = [g.add("Relu", g.add("Erf", x, name="erf1"), name="r")]
    out = tmp_path / "erf.nnb"
    with pytest.raises(UnsupportedError, match=r"Erf \('erf1'\)"):
        qcc_compile(Model(g), str(out))
    assert not out.exists()


def _dense_model(fx: int, fw: int, fy: int, pinned: bool) -> Model:
    g = Graph("dense")
    x = g.add_input("x", TensorType("float32", ("N", 4)))
    w = g.add_constant("w", np.full((4, 2), 0.25, np.float32))
    y = g.add("Dense", x, w, name="fc")
    g.outputs = [y]
    for value, frac in ((x, fx), (w, fw), (y, fy)):
        value.quant = FixedPoint(16, frac)
    y.meta["pinned"] = pinned
    w.meta["pinned"] = pinned
    return Model(g)


def test_rules_adjust_qcc_positions_and_refuse_pinned_ones(tmp_path: Path) -> None:
    """Output position above input + weight positions: qcc raises the weight's (it fits); with
    the weight and output pinned it is an error naming them."""
    model = _dense_model(4, 2, 9, pinned=False)
    with pytest.raises(InternalError, match=r"'w' is fixed\(16,2\).*input \+ weight.*legalize-nnb"):
        build_nnb(model)  # the writer only checks: it never changes a model silently
    notes = _legalize(model)
    assert model.graph.constants[0].quant == FixedPoint(16, 5)
    assert any("w: fixed(16,2) -> fixed(16,5)" in n for n in notes)
    build_nnb(model)
    with pytest.raises(UnsupportedError, match=r"'fc'.*pinned"):
        _legalize(_dense_model(4, 2, 9, pinned=True))


def _legalize(model: Model) -> list[str]:
    """The nnb target's legalization, as the driver runs it; the notes it reports."""
    ctx = PassContext()
    PassManager([LegalizeNnb()]).run(model, ctx)
    return list(ctx.report.get("legalization", []))


def _add_model(pinned: bool) -> Model:
    g = Graph("add")
    x = g.add_input("x", TensorType("float32", ("N", 8)))
    r = g.add("Relu", x, name="relu")
    y = g.add("Add", x, r, name="add")
    g.outputs = [y]
    for value, frac in ((x, 10), (r, 12), (y, 10)):
        value.quant = FixedPoint(16, frac)
    r.meta["pinned"] = pinned
    return Model(g)


def test_add_inputs_end_up_at_one_position(tmp_path: Path) -> None:
    """qcc's own position moves to the coarser one; a pinned one is converted by an Identity
    (exactly what the simulator's Add computes, without the runtime's in-place rescale)."""
    x = np.random.RandomState(2).uniform(-20, 20, (5, 8)).astype(np.float32)
    model = _add_model(pinned=False)
    _legalize(model)
    result = build_nnb(model)
    assert model.graph.nodes[0].outputs[0].quant == FixedPoint(16, 10)
    assert [read_kind(result.nnb, f) for f in result.nnb.functions] == ["ReLU", "Add2"]
    pinned = _add_model(pinned=True)
    path = tmp_path / "add.nnb"
    _legalize(pinned)
    path.write_bytes(build_nnb(pinned).data)
    nnb = read_nnb(path.read_bytes(), str(path))
    assert [read_kind(nnb, f) for f in nnb.functions] == ["ReLU", "Identity", "Add2"]
    np.testing.assert_array_equal(_emulate(path, [x])[0], _stored(pinned, {"x": x})[0])


def read_kind(nnb: NnbFile, fn: Any) -> str:
    spec = default_table().by_id(fn.type_id, nnb.api_level)
    assert spec is not None
    return spec.name


def test_api_levels_and_versions(tmp_path: Path, digits: dict) -> None:
    """Older levels drop trailing arguments (BatchNormalization before no_scale/no_bias); the
    header says what was asked; version 2 counts buffer elements."""
    model = digits["none"][0]
    table = default_table()
    old = build_nnb(model, api=27, nnb_version=2).nnb
    new = build_nnb(model, api=44, nnb_version=3).nnb
    assert (old.api_level, old.version, new.api_level, new.version) == (27, 2, 44, 3)
    bn_old = table.spec("BatchNormalization", 27)
    assert len(bn_old.args) < len(table.spec("BatchNormalization", 44).args)
    assert [4 * b for b in old.buffers] == list(new.buffers)
    assert any(f.type_id == bn_old.id for f in old.functions)


# ----------------------------------------------------------------------------- inspect


def test_inspect_decodes_a_file(digits: dict, capsys: pytest.CaptureFixture[str]) -> None:
    path = digits["fixed8"][1]
    status, out, err = _qcc(capsys, "inspect", str(path), "--json")
    assert status == 0, err
    info = json.loads(out)
    nnb = read_nnb(path.read_bytes(), str(path))
    assert info["version"] == 3 and info["api_level"] == 44 and info["file_bytes"] == path.stat().st_size
    assert len(info["variables"]) == len(nnb.variables) and len(info["functions"]) == len(nnb.functions)
    assert info["buffer_bytes"] == sum(nnb.buffers)
    assert info["functions"][0]["function"] == "Convolution" and info["variables"][0]["kind"] == "input"
    status, out, _ = _qcc(capsys, "inspect", str(path))
    assert status == 0 and "FIXED8_" in out and "Affine(base_axis=1)" in out


def test_inspect_rejects_corrupt_files_cleanly(digits: dict, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    data = digits["fixed16"][1].read_bytes()
    rng = np.random.RandomState(5)
    cases = [data[:40], data[:-3], data + b"\0\0\0\0"]
    for _ in range(6):
        bad = bytearray(data)
        for pos in rng.randint(0, 400, size=3):
            bad[pos] ^= 0xFF
        cases.append(bytes(bad))
    for n, case in enumerate(cases):
        path = tmp_path / f"bad{n}.nnb"
        path.write_bytes(case)
        try:
            read_nnb(case, str(path))
        except (InvalidInputError, UnsupportedError):
            pass
        else:
            continue  # a flip that still makes a consistent file (e.g. in weight bytes)
        status, _, err = _qcc(capsys, "inspect", str(path))
        assert status in (3, 4), err
        assert str(path) in err


def test_written_file_round_trips(digits: dict) -> None:
    for _, path in digits.values():
        data = path.read_bytes()
        nnb: NnbFile = read_nnb(data, str(path))
        assert write_nnb(nnb) == data
