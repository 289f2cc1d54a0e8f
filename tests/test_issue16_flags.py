"""Issue 16: every flag takes effect or is a usage error naming the conflict; eval and
sensitivity on fixed-batch models; progress and -q. Each test failed on main before issue 16."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from qcc.cli import main
from tests.cli_util import DIGITS

MODEL = str(DIGITS / "digits_cnn.onnx")
CALIB = str(DIGITS / "calib.npz")
TEST = str(DIGITS / "test.npz")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and "[nnabla]" not in line]
    return code, out, lines


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, _, lines = run(capsys, *argv)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("qcc: usage error: "), lines
    return lines[0]


@pytest.mark.parametrize("flags, named", [
    (["--calib", CALIB], "--calib"),
    (["--method", "entropy"], "--method"),
    (["--per-tensor"], "--per-tensor"),
])
def test_quantization_flags_without_a_scheme_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         flags: list[str], named: str) -> None:
    out = tmp_path / "d.onnx"
    line = usage_error(capsys, "compile", MODEL, "-o", str(out), *flags)
    assert named in line and "--quantize" in line
    assert not out.exists()


def test_passes_with_a_scheme_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = usage_error(capsys, "compile", MODEL, "-o", str(tmp_path / "d.nnb"), "--quantize", "fixed8",
                       "--calib", CALIB, "--passes", "fold-bn")
    assert "--passes" in line and "--quantize fixed8" in line


def test_network_on_an_onnx_input_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = usage_error(capsys, "compile", MODEL, "-o", str(tmp_path / "d.onnx"), "--network", "main")
    assert "--network" in line and ".nnp" in line and "onnx" in line


def test_output_extension_of_another_target_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "o.nnb"
    line = usage_error(capsys, "compile", MODEL, "-o", str(out), "--target", "onnx-qdq", "--quantize", "int8",
                       "--calib", CALIB)
    assert "'nnb'" in line and "'onnx-qdq'" in line and ".onnx" in line
    assert not out.exists()
    line = usage_error(capsys, "compile", MODEL, "-o", str(tmp_path / "x.onnx"), "--target", "c")
    assert "directory" in line


@pytest.mark.parametrize("given, meant", [("INT8", "int8"), ("int9", "int8"), ("fixd8", "fixed8")])
def test_misspelt_scheme_is_one_line_with_a_suggestion(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       given: str, meant: str) -> None:
    line = usage_error(capsys, "compile", MODEL, "-o", str(tmp_path / "d.onnx"), "--quantize", given)
    assert f"did you mean {meant!r}" in line


def test_argparse_mistakes_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, "compile", MODEL)  # -o missing
    assert "-o/--output" in line and "usage:" not in line


def test_report_dash_is_stdout(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, lines = run(capsys, "compile", MODEL, "-o", "d.onnx", "--report", "-")
    assert code == 0 and not (tmp_path / "-").exists()
    report = json.loads(out)
    assert report["target"] == "onnx" and report["output"] == "d.onnx"
    assert any(line.startswith("qcc: compiled d.onnx") for line in lines)  # the summary moved to stderr


def test_progress_bars_with_progress_and_nothing_with_quiet(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["compile", MODEL, "--quantize", "int8", "--calib", CALIB, "--eval", TEST, "--progress"]
    code, _, lines = run(capsys, *args, "-o", str(tmp_path / "p.onnx"))
    err = "\n".join(lines)
    assert code == 0 and "qcc calibrate" in err and "qcc eval" in err and "sample" in err
    code, out, lines = run(capsys, *args, "-o", str(tmp_path / "q.onnx"), "-q")
    assert code == 0 and out == "" and lines == []


# ----------------------------------------------------------------------------- fixed batch
@pytest.fixture(scope="module")
def fixed_batch_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits CNN exported with a static batch of 4 (as torchvision exports fix 1)."""
    proto = onnx.load(MODEL)
    for value in [*proto.graph.input, *proto.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 4
    path = tmp_path_factory.mktemp("fixed") / "digits_b4.onnx"
    onnx.save(proto, path)
    return path


def test_eval_on_a_fixed_batch_model(fixed_batch_model: Path, tmp_path: Path) -> None:
    from qcc.driver import compile as qcc_compile

    _, report = qcc_compile(fixed_batch_model, tmp_path / "b4.onnx", quantize="int8", calib=CALIB, eval=TEST)
    ev = report["eval"]
    assert ev["samples"] == 360 and ev["runtime"]["samples"] == 360  # 90 batches of 4
    assert ev["quantized_accuracy"] > 0.95 and ev["runtime"]["accuracy"] > 0.95


def test_sensitivity_on_a_fixed_batch_model(fixed_batch_model: Path, tmp_path: Path) -> None:
    from qcc.driver import compile as qcc_compile

    _, report = qcc_compile(fixed_batch_model, tmp_path / "s.onnx", target="onnx-qdq", calib=CALIB,
                            passes="fold-bn{standalone=conv},calibrate,quantize-affine,sensitivity{samples=40}")
    layers = report["sensitivity"]["layers"]
    assert layers and all(e["sqnr_db"] is None or e["sqnr_db"] > 10 for e in layers)


def test_too_few_eval_samples_names_the_file_and_who_reads_it(fixed_batch_model: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    few = tmp_path / "few.npz"
    np.savez(few, x=np.load(TEST)["x"][:3])
    code, _, lines = run(capsys, "compile", str(fixed_batch_model), "-o", str(tmp_path / "f.onnx"), "--eval", str(few))
    assert code == 3 and len(lines) == 1
    assert str(few) in lines[0] and "--eval" in lines[0] and "batch dimension is 4" in lines[0]
    assert not (tmp_path / "f.onnx").exists()
