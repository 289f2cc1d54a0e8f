"""Issue 16 items 3 and 5: Python-native data and onnxruntime's option names in qcc.compile, an
nn.Module compiled directly; `qcc settings`; settings errors one per line."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from qcc.cli import main
from qcc.driver import compile as qcc_compile
from qcc.driver import load
from tests.cli_util import DIGITS

MODEL = DIGITS / "digits_cnn.onnx"
CALIB = DIGITS / "calib.npz"
TEST = DIGITS / "test.npz"


def ranges(report: dict) -> dict[str, object]:
    return {t["name"]: t["type"] for t in report["tensors"]}


@pytest.fixture(scope="module")
def from_path(tmp_path_factory: pytest.TempPathFactory) -> dict:
    _, report = qcc_compile(MODEL, tmp_path_factory.mktemp("p") / "p.onnx", quantize="int8", calib=str(CALIB),
                            eval=str(TEST))
    return report


def test_dict_iterable_callable_and_dataloader_give_the_path_result(tmp_path: Path, from_path: dict) -> None:
    torch = pytest.importorskip("torch")
    calib = dict(np.load(CALIB))
    test = dict(np.load(TEST))

    def batches() -> Iterator[dict[str, np.ndarray]]:
        for i in range(0, len(calib["x"]), 32):  # calibrate's own batch: the same statistics
            yield {"x": calib["x"][i:i + 32]}

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.tensor(test["x"]), torch.tensor(test["labels"])), batch_size=50)
    for i, (cal, ev) in enumerate([(calib, test), (list(batches()), loader), (batches, loader)]):
        _, report = qcc_compile(MODEL, tmp_path / f"{i}.onnx", quantize="int8", calib=cal, eval=ev)
        assert ranges(report) == ranges(from_path)
        for key in ("float_accuracy", "quantized_accuracy", "agreement", "output_sqnr_db", "samples"):
            assert report["eval"][key] == from_path["eval"][key], key
        assert report["eval"]["runtime"]["accuracy"] == from_path["eval"]["runtime"]["accuracy"]


def test_a_stream_is_read_one_batch_at_a_time(tmp_path: Path) -> None:
    calib = np.load(CALIB)["x"]
    alive: list[weakref.ref] = []
    most = [0]

    def stream() -> Iterator[dict[str, np.ndarray]]:
        for i in range(0, len(calib), 16):
            batch = calib[i:i + 16].copy()
            alive.append(weakref.ref(batch))
            most[0] = max(most[0], sum(r() is not None for r in alive))
            yield {"x": batch}
            del batch

    # calibrate reads the whole stream once (bias-correct, on by default, reads its own first batch again)
    qcc_compile(MODEL, tmp_path / "s.onnx", quantize="int8", calib=stream, bias_correct=False)
    assert len(alive) == 23 and most[0] <= 2  # the batch being read and the one before it, never all
    alive.clear()
    qcc_compile(MODEL, tmp_path / "t.onnx", quantize="int8", calib=stream)
    assert len(alive) == 24 and most[0] <= 2


def test_onnxruntime_option_names(tmp_path: Path) -> None:
    _, ours = qcc_compile(MODEL, tmp_path / "a.onnx", quantize="int8", calib=str(CALIB), per_tensor=True,
                          method="entropy")
    _, theirs = qcc_compile(MODEL, tmp_path / "b.onnx", quantize="int8", calib=str(CALIB), per_channel=False,
                            calibrate_method="Entropy")
    assert ranges(ours) == ranges(theirs)
    _, report = qcc_compile(MODEL, tmp_path / "c.onnx", quantize="int8", calib=str(CALIB),
                            nodes_to_exclude=["conv1"], op_types_to_quantize=["Conv", "Relu", "Add", "Concat"])
    types = ranges(report)
    left = {f["tensor"] for f in report["float_fallbacks"]}
    # the excluded node (BN folded into it: its output is bn1): output and weights float
    assert types["bn1"] == types["conv1.weight"] == "float32" and {"bn1", "conv1.weight"} <= left
    assert types["relu2"] != "float32"
    assert types["logits"] == "float32"  # a Gemm, not in op_types_to_quantize
    with pytest.raises(Exception, match="per_channel"):
        qcc_compile(MODEL, tmp_path / "d.onnx", quantize="int8", calib=str(CALIB), per_channel=True, per_tensor=True)


def test_compile_an_nn_module_with_example_inputs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 6 * 6, 3)).eval()
    x = np.random.default_rng(0).standard_normal((16, 1, 8, 8)).astype(np.float32)
    compiled, report = qcc_compile(net, tmp_path / "m.onnx", example_inputs=(torch.tensor(x[:1]),),
                                   quantize="int8", calib={"x": x}, eval={"x": x})
    assert report["target"] == "onnx-qdq" and report["eval"]["runtime"]["samples"] == 16
    with torch.no_grad():
        want = net(torch.tensor(x)).numpy()
    from tests.ort_quant import run as ort_run
    from tests.ort_quant import sqnr_db

    assert sqnr_db(ort_run(tmp_path / "m.onnx", {compiled.graph.inputs[0].name: x}), want) > 25


# ----------------------------------------------------------------------------- qcc settings
@pytest.fixture(scope="module")
def digits_nnp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nnp") / "digits.nnp"
    qcc_compile(MODEL, path)
    return path


def test_settings_template_and_positions(digits_nnp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from qcc.formats.settings_yaml import export_settings
    from qcc.pipelines import default_method

    template = tmp_path / "t.yaml"
    assert main(["settings", str(digits_nnp), "-o", str(template)]) == 0
    assert template.read_text() == export_settings(load(digits_nnp))  # nnb_template's layout (test_frontend_nnp)
    assert set(yaml.safe_load(template.read_text())["variables"].values()) == {"FLOAT32"}
    chosen = tmp_path / "c.yaml"
    assert main(["settings", str(digits_nnp), "-o", str(chosen), "--calib", str(CALIB)]) == 0
    variables = yaml.safe_load(chosen.read_text())["variables"]
    assert all(t.startswith("FIXED8_") for t in variables.values()), variables
    # the positions are qcc's: the same pipeline compiled for .nnb without the file chooses them too
    spec = f"calibrate,assign-fixed-point{{bits=8,weight_bits=8,method={default_method('fixed8')}}},plan-memory{{kind=shared}}"
    _, free = qcc_compile(digits_nnp, tmp_path / "free.nnb", calib=str(CALIB), passes=spec)
    _, pinned = qcc_compile(digits_nnp, tmp_path / "pinned.nnb", calib=str(CALIB), passes=spec, settings=str(chosen))
    chosen_types = {t["name"]: t["type"] for t in free["tensors"]}
    pinned_types = {t["name"]: t["type"] for t in pinned["tensors"]}
    for name, text in variables.items():
        assert chosen_types[name] == pinned_types[name] == f"fixed(8,{int(text.split('_')[1])})", name


def test_settings_errors_one_per_line(digits_nnp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("functions: {}\nvariables:\n" + "".join(f"  missing_{i}: FIXED8_3\n" for i in range(3)))
    code = main(["compile", str(digits_nnp), "-o", str(tmp_path / "x.nnb"), "--settings", str(bad)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("qcc:")]
    assert code == 3 and len(lines) == 4, lines
    assert [line.split("variables.")[1] for line in lines[:3]] == [f"missing_{i}: no such variable" for i in range(3)]
    assert "3 bad entries" in lines[3]
