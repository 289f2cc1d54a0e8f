"""NNabla frontend, .nnp writer and settings.yaml, checked against nnabla itself.

Models are built and saved with nnabla in the test (nothing downloaded); nnabla's forward is the
oracle for qcc's interpreter, for the ONNX export in onnxruntime and for written .nnp files.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nnabla")

from qcc.backends.nnp import to_nnp_bytes

from qcc.cli import main as cli
from qcc.errors import InvalidInputError, UnsupportedError, UsageError
from qcc.formats.onnx_export import to_onnx
from qcc.formats.settings_yaml import apply_settings, export_settings
from qcc.frontends.nnp import load_nnp
from qcc.ir.core import Model
from qcc.ir.surgery import insert_after
from qcc.ir.types import Affine, FixedPoint, Float32, QuantType, Sign
from qcc.sim.interpreter import run_model
from tests.nnabla_zoo import (
    digits_data,
    mobilenet_module,
    nnabla_run,
    save_digits_mlp,
    save_ops_zoo,
    save_resnet23,
)

SHAPES = {"mobilenet": (1, 3, 224, 224), "resnet23": (1, 3, 32, 32), "digits": (1, 64), "zoo": (1, 4, 9, 9),
          "zoo_float": (1, 4, 9, 9)}


@pytest.fixture(scope="module")
def nnps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nnp")
    paths = {name: root / f"{name}.nnp" for name in SHAPES}
    mobilenet_module().save_mobilenet_v1(paths["mobilenet"], seed=0)
    save_resnet23(paths["resnet23"])
    (root / "digits_accuracy.txt").write_text(repr(save_digits_mlp(paths["digits"])))
    save_ops_zoo(paths["zoo"])
    save_ops_zoo(paths["zoo_float"], quantize=False)
    return paths


def _feed(name: str, seed: int = 0) -> np.ndarray:
    rng = np.random.RandomState(seed)
    if name == "mobilenet":
        return rng.uniform(0, 255, SHAPES[name]).astype(np.float32)
    return rng.randn(*SHAPES[name]).astype(np.float32)


def _close(got: np.ndarray, ref: np.ndarray, rel: float = 1e-4) -> None:
    assert got.shape == ref.shape
    scale = float(np.abs(ref).max())
    assert scale > 0 and np.isfinite(got).all()
    assert float(np.abs(got - ref).max()) <= rel * scale, (float(np.abs(got - ref).max()), scale)


def _qcc(model: Model, x: np.ndarray) -> np.ndarray:
    (out,) = run_model(model, {model.graph.inputs[0].name: x}).values()
    return out


def _ort(model: Model, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {model.graph.inputs[0].name: x})[0])


# ----------------------------------------------------------------------------- import vs nnabla
@pytest.mark.parametrize("name", ["mobilenet", "resnet23", "digits", "zoo_float"])
def test_import_matches_nnabla_in_interpreter_and_onnxruntime(nnps: dict[str, Path], name: str) -> None:
    x = _feed(name)
    ref, _ = nnabla_run(nnps[name], x)
    model = load_nnp(nnps[name])
    _close(_qcc(model, x), ref)
    _close(_ort(model, x), ref)


def test_ops_zoo_with_quantize_functions_matches_nnabla(nnps: dict[str, Path]) -> None:
    model = load_nnp(nnps["zoo"])
    ops = {n.meta.get("nnp.type"): n for n in model.graph.nodes}
    assert ops["FixedPointQuantize"].outputs[0].quant == FixedPoint(8, 5)
    mmq = ops["MinMaxQuantize"].outputs[0].quant
    assert isinstance(mmq, Affine) and mmq.dtype == "uint8" and mmq.axis is None
    assert all(v.quant == Sign() for v in model.graph.constants if v.name.endswith("/Wb"))
    for seed in range(3):
        x = _feed("zoo", seed)
        _close(_qcc(model, x), nnabla_run(nnps["zoo"], x)[0])


def test_names_and_structure_follow_the_file(nnps: dict[str, Path]) -> None:
    model = load_nnp(nnps["mobilenet"])
    values = model.graph.value_map()
    assert [v.name for v in model.graph.inputs] == ["x"] and [v.name for v in model.graph.outputs] == ["y'"]
    for name in ("conv1/conv/W", "conv2/dw/depthwise_conv/W", "fc/affine/W", "conv14/pw/bn/var"):
        assert values[name].is_const
    assert model.metadata["nnp.network"] == "Runtime" and model.metadata["nnp.executor"] == "runtime"
    ops = [n.op for n in model.graph.nodes]
    assert ops.count("Conv") == 27 and ops.count("Relu") == 27 and ops.count("Dense") == 1
    assert values["x"].type.shape == ("N", 3, 224, 224)


def test_digits_model_keeps_its_accuracy_and_batch_size_option(nnps: dict[str, Path]) -> None:
    data, labels = digits_data()
    model = load_nnp(nnps["digits"], batch_size=len(data))
    assert model.graph.inputs[0].type.shape == (len(data), 64)
    accuracy = float((_qcc(model, data).argmax(1) == labels).mean())
    trained = float((nnps["digits"].parent / "digits_accuracy.txt").read_text())
    assert accuracy == pytest.approx(trained, abs=1e-9)
    assert accuracy > 0.9
    ref, _ = nnabla_run(nnps["digits"], data[:16])
    _close(_qcc(load_nnp(nnps["digits"]), data[:16]), ref)


# ----------------------------------------------------------------------------- writer
@pytest.mark.parametrize("name", ["mobilenet", "resnet23", "zoo"])
def test_round_trip_gives_the_same_outputs_in_nnabla(nnps: dict[str, Path], name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.nnp"
    out.write_bytes(to_nnp_bytes(load_nnp(nnps[name])))
    x = _feed(name)
    ref, before = nnabla_run(nnps[name], x)
    got, after = nnabla_run(out, x)
    _close(got, ref, 1e-6)
    if name != "zoo":  # binary functions come back as Convolution/Affine + Mul2/Add2
        assert after == before
    again = load_nnp(out)
    _close(_qcc(again, x), ref)


def test_h5_parameters_and_the_cli_writer(nnps: dict[str, Path], tmp_path: Path) -> None:
    h5 = tmp_path / "digits_h5.nnp"
    h5.write_bytes(to_nnp_bytes(load_nnp(nnps["digits"]), parameter_format=".h5"))
    assert "parameter.h5" in zipfile.ZipFile(h5).namelist()
    out = tmp_path / "cli.nnp"
    assert cli(["compile", str(h5), "-o", str(out)]) == 0
    x = _feed("digits")
    _close(nnabla_run(out, x)[0], nnabla_run(nnps["digits"], x)[0], 1e-6)


def test_quantize_after_relu_avgpool_affine_like_seed_000(nnps: dict[str, Path], tmp_path: Path) -> None:
    model = load_nnp(nnps["mobilenet"])
    chosen = [n.outputs[0] for n in model.graph.nodes if n.op in ("Relu", "AvgPool", "Dense")]
    for value in chosen:
        insert_after(model.graph, value, "Quantize")
    out = tmp_path / "quantized.nnp"
    out.write_bytes(to_nnp_bytes(model))
    x = _feed("mobilenet")
    ref, before = nnabla_run(nnps["mobilenet"], x)
    got, after = nnabla_run(out, x)
    expected: list[str] = []
    for ftype in before:
        expected.append(ftype)
        if ftype in ("ReLU", "AveragePooling", "Affine"):
            expected.append("MinMaxQuantize")
    assert after == expected and after.count("MinMaxQuantize") == len(chosen) == 29
    assert after[:8] == ["ImageAugmentation", "MulScalar", "AddScalar", "Convolution", "BatchNormalization",
                         "ReLU", "MinMaxQuantize", "DepthwiseConvolution"]
    assert 0 < float(np.abs(got - ref).max()) < 0.2 * float(np.abs(ref).max())


def test_annotated_quantize_nodes_run_quantized_in_nnabla(nnps: dict[str, Path], tmp_path: Path) -> None:
    model = load_nnp(nnps["resnet23"])
    relus = [n.outputs[0] for n in model.graph.nodes if n.op == "Relu"]
    channels = int(relus[1].type.shape[1])
    annotations: list[QuantType] = [FixedPoint(16, 8), Affine((0.05,), (0,), "uint8"),
                   Affine(tuple(np.linspace(0.02, 0.06, channels)), (3,) * channels, "uint8", 1),
                   Float32(), FixedPoint(8, 4), Affine((0.01,), (-3,), "int8")]
    for value, quant in zip(relus, annotations):
        insert_after(model.graph, value, "Quantize").outputs[0].quant = quant
    insert_after(model.graph, model.graph.outputs[0], "Quantize").outputs[0].quant = Sign()
    out = tmp_path / "annotated.nnp"
    out.write_bytes(to_nnp_bytes(model))
    x = _feed("resnet23")
    got, after = nnabla_run(out, x)
    assert {"FixedPointQuantize", "MinMaxQuantize", "Sign"} <= set(after)
    _close(got, _qcc(model, x), 1e-3)


# ----------------------------------------------------------------------------- settings.yaml
def test_settings_export_equals_nnabla_cli_nnb_template(nnps: dict[str, Path], tmp_path: Path) -> None:
    cli_path = Path(sys.executable).parent / "nnabla_cli"
    if not cli_path.exists():
        pytest.skip("nnabla_cli is not installed beside this Python")
    for name in ("resnet23", "digits"):
        target = tmp_path / f"{name}.yaml"
        subprocess.run([str(cli_path), "nnb_template", "-b", "1", str(nnps[name]), str(target)], check=True,
                       capture_output=True, timeout=120)
        import yaml

        theirs = yaml.safe_load(target.read_text())
        mine_text = export_settings(load_nnp(nnps[name]))
        mine = yaml.safe_load(mine_text)
        assert list(mine["variables"].items()) == list(theirs["variables"].items())
        assert sorted(mine["functions"]) == sorted(theirs["functions"])
        assert mine_text == target.read_text()


def test_settings_round_trip_pins_types(nnps: dict[str, Path]) -> None:
    model = load_nnp(nnps["resnet23"])
    values = model.graph.value_map()
    chosen: dict[str, QuantType] = {"conv2/conv2/conv/W": FixedPoint(8, 7), "conv1/conv/W": Sign(),
              "@net/ReLU_out_3": FixedPoint(16, 12), "@net/Add2_out": FixedPoint(8, 4)}
    for name, quant in chosen.items():
        values[name].quant = quant
    text = export_settings(model)
    assert "conv2/conv2/conv/W: FIXED8_7" in text and "conv1/conv/W: SIGN" in text
    fresh = load_nnp(nnps["resnet23"])
    assert apply_settings(fresh, text.replace("conv3/conv1/conv/W: FLOAT32", "conv3/conv1/conv/W: FIXED16"),
                          "s.yaml") == []
    again = fresh.graph.value_map()
    for name, quant in chosen.items():
        assert again[name].quant == quant and again[name].meta["pinned"] is True
    auto = again["conv3/conv1/conv/W"]
    assert auto.quant == FixedPoint(16, 16 - _nnabla_int_bits(auto.const)) and auto.meta["settings.auto_position"]
    assert again["x"].quant == Float32()


def _nnabla_int_bits(w: np.ndarray | None) -> int:
    assert w is not None
    top = float(np.abs(w).max())
    return 1 if top < 1 else int(np.ceil(np.log2(top))) + 1


def test_settings_errors_name_the_file_and_entries(nnps: dict[str, Path]) -> None:
    model = load_nnp(nnps["zoo"])
    bad = ("variables:\n  nope: FLOAT32\n  x: FIXED8\n  y: FIXED9_2\n  '@zoo/ReLU6_out': SIGN\n"
           "  gconv/conv/W: FIXED8_16\nfunctions:\n  '@zoo/Nope': {implement: 0}\n  '@zoo/Sigmoid': {implement: x}\n")
    with pytest.raises(InvalidInputError) as err:
        apply_settings(model, bad, "bad.yaml")
    message = str(err.value)
    assert message.startswith("bad.yaml: 7 bad entries")
    lines = err.value.details  # type: ignore[attr-defined]  # one per line on stderr (issue 16)
    for line, entry in zip(lines, ("variables.nope", "variables.x", "variables.y", "variables.@zoo/ReLU6_out",
                                   "variables.gconv/conv/W", "functions.@zoo/Nope", "functions.@zoo/Sigmoid")):
        assert line.startswith(f"bad.yaml: {entry}")
    assert len(lines) == 7
    assert all(not v.meta.get("pinned") for v in model.graph.values())
    for text in ("- a\n- b\n", "variables: 3\n", "other: {}\n", "variables: [\n"):
        with pytest.raises(InvalidInputError, match=r"bad\.yaml"):
            apply_settings(model, text, "bad.yaml")
    notes = apply_settings(model, "variables:\n  bwconv/bwn_conv/W: FLOAT32\n", "ok.yaml")
    assert len(notes) == 1 and "bwconv/bwn_conv/W" in notes[0]


# ----------------------------------------------------------------------------- selection, bad input
def test_network_and_executor_selection(tmp_path: Path) -> None:
    import nnabla as nn
    import nnabla.functions as F
    from nnabla.utils.save import save

    x = nn.Variable((2, 3))
    contents = {
        "networks": [{"name": "train", "batch_size": 2, "outputs": {"y": F.tanh(x)}, "names": {"x": x}},
                     {"name": "infer", "batch_size": 2, "outputs": {"y": F.sigmoid(x)}, "names": {"x": x}}],
        "executors": [{"name": "first", "network": "train", "data": ["x"], "output": ["y"]},
                      {"name": "runtime", "network": "infer", "data": ["x"], "output": ["y"]}]}
    path = tmp_path / "two.nnp"
    save(str(path), contents)
    assert load_nnp(path).graph.nodes[0].op == "Sigmoid"
    assert load_nnp(path, executor="first").graph.nodes[0].op == "Tanh"
    assert load_nnp(path, network="train").graph.nodes[0].op == "Tanh"
    with pytest.raises(UsageError, match="networks: 'train', 'infer'; executors: 'first', 'runtime'"):
        load_nnp(path, network="bogus")
    with pytest.raises(UsageError, match="no executor 'bogus'"):
        load_nnp(path, executor="bogus")
    out = tmp_path / "out.onnx"
    assert cli(["compile", str(path), "-o", str(out), "--network", "bogus"]) == 2
    assert not out.exists()
    text = tmp_path / "two.nntxt"
    save(str(text), contents)
    assert load_nnp(text, executor="first").graph.nodes[0].op == "Tanh"


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name), data)
    return path


def test_bad_archives_fail_cleanly(nnps: dict[str, Path], tmp_path: Path) -> None:
    nntxt = zipfile.ZipFile(nnps["digits"]).read("network.nntxt")
    work = tmp_path / "work"
    work.mkdir()
    cases = {
        "not_nnp": (_zip(work / "a.nnp", {"readme.txt": b"hello"}), "no network definition"),
        "not_zip": (work / "b.nnp", "not a zip"),
        "no_params": (_zip(work / "c.nnp", {"network.nntxt": nntxt}), "no parameter"),
        "traversal": (_zip(work / "d.nnp", {"network.nntxt": nntxt, "../evil.h5": b"x"}), "'..'"),
        "absolute": (_zip(work / "e.nnp", {"network.nntxt": nntxt, str(tmp_path / "abs_evil.h5"): b"x"}),
                     "absolute path"),
        "bad_text": (_zip(work / "f.nnp", {"network.nntxt": b"network { name: "}), "not a valid nntxt"),
    }
    (work / "b.nnp").write_bytes(b"\x00" * 64)
    for name, (path, needle) in cases.items():
        with pytest.raises(InvalidInputError, match=needle):
            load_nnp(path)
        out = work / f"{name}.onnx"
        assert cli(["compile", str(path), "-o", str(out)]) == 3, name
        assert not out.exists()
    assert not (tmp_path / "evil.h5").exists() and not (tmp_path / "abs_evil.h5").exists()
    assert sorted(p.name for p in work.iterdir()) == sorted(f"{c}.nnp" for c in "abcdef")


def test_unsupported_function_lists_what_is_supported(tmp_path: Path) -> None:
    import nnabla as nn
    import nnabla.functions as F
    from nnabla.utils.save import save

    x = nn.Variable((1, 3))
    path = tmp_path / "selu.nnp"
    save(str(path), {"networks": [{"name": "n", "batch_size": 1, "outputs": {"y": F.selu(x)}, "names": {"x": x}}],
                     "executors": [{"name": "runtime", "network": "n", "data": ["x"], "output": ["y"]}]})
    with pytest.raises(UnsupportedError, match=r"SELU \('@n/SELU'\).*Supported: .*Affine"):
        load_nnp(path)


def test_example_script_prints_the_seed_sequence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module_path = Path(__file__).resolve().parent.parent / "examples" / "nnabla_quantize_layers"
    sys.path.insert(0, str(module_path))
    try:
        import quantize_layers
    finally:
        sys.path.remove(str(module_path))
    assert quantize_layers.main(["--out", str(tmp_path), "--size", "224"]) == 0
    text = capsys.readouterr().out
    after = text.split("----- after -----")[1].split()
    assert after[:7] == ["ImageAugmentation", "MulScalar", "AddScalar", "Convolution", "BatchNormalization",
                         "ReLU", "MinMaxQuantize"]
    assert "inserted 29 MinMaxQuantize (29 in the written .nnp)" in text
