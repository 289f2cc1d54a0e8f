"""Issue 15: the typed target contract.

Targets declare typed options (parsed like pass options), the constraints they impose (reaching
the passes through the pass context, never as a target name) and the legalization passes that
make a model satisfy them; legalization runs before --eval, so the evaluated model is the
written one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from qcc.backends.nnb.format import read_nnb
from qcc.backends.nnb.lift import lift_nnb

import qcc
from qcc import cli
from qcc.errors import UsageError
from qcc.sim import run_model
from tests.cli_util import DIGITS, ROOT

MODEL = str(DIGITS / "digits_cnn.onnx")
CALIB = str(DIGITS / "calib.npz")
TEST = str(DIGITS / "test.npz")


def test_eval_reports_the_accuracy_of_the_nnb_that_was_written(tmp_path: Path) -> None:
    """A settings.yaml pins relu5 at position 2; qcc had put the AveragePooling after it at 5,
    which nnabla-c-runtime cannot run (the upscale wraps): legalization lowers it. The report's
    accuracy must be the accuracy of the written file, measured by decoding it."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("variables:\n  relu5: FIXED8_2\n")
    out = tmp_path / "d.nnb"
    _, report = qcc.compile(MODEL, out, quantize="fixed8", calib=CALIB, settings=str(settings), eval=TEST)
    assert any(line.startswith("avgpool1: fixed(8,") and " -> fixed(8,2)" in line for line in report["legalization"])
    assert report["pipeline"][-2:] == ["legalize-nnb", "plan-memory"]
    lifted = lift_nnb(read_nnb(out.read_bytes(), str(out)))
    data = np.load(TEST)
    logits = next(iter(run_model(lifted, {lifted.graph.inputs[0].name: data["x"]}, quantized=True).values()))
    written_accuracy = float(np.mean(logits.argmax(axis=1) == data["labels"]))
    assert report["eval"]["quantized_accuracy"] == written_accuracy


def test_target_options_are_typed_and_flags_that_do_not_apply_fail(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", MODEL, "-o", str(tmp_path / "v2.nnb"), "--target", "nnb{version=2,api=27}"]) == 0
    assert read_nnb((tmp_path / "v2.nnb").read_bytes(), "v2").version == 2
    capsys.readouterr()
    cases = [
        (["-o", str(tmp_path / "a.onnx"), "--plan", "nnabla"], "--plan is an option of target nnb; the target here is 'onnx'"),
        (["-o", str(tmp_path / "b.nnb"), "--target", "nnb{bogus=1}"], "target 'nnb' has no option 'bogus'"),
        (["-o", str(tmp_path / "c.nnb"), "--target", "nnb{version=4}"], "option nnb.version: '4' is not one of 2|3"),
        (["-o", str(tmp_path / "d.nnb"), "--target", "nnb{api=9999}"], "API level 9999"),
        (["-o", str(tmp_path / "e"), "--target", "onnx-qdq{storage=tensorrt}"], "not one of ort|ort-vnni|annotated"),
        (["-o", str(tmp_path / "f.onnx"), "--target", "onnx", "--quantize", "int8", "--calib", CALIB],
         "target 'onnx' cannot write --quantize int8"),
    ]
    for args, message in cases:
        assert cli.main(["compile", MODEL, *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (args, err)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "v2.nnb"]
    with pytest.raises(UsageError, match="target 'c' has no option 'c_name'"):
        qcc.write(qcc.load(MODEL), tmp_path / "gen", target="c", c_name="x")
    qcc.write(qcc.load(MODEL), tmp_path / "gen", target="c", name="digits_model")
    assert (tmp_path / "gen" / "digits_model.c").exists()


def test_quantized_onnx_output_is_qdq_and_storage_option_reaches_the_writer(tmp_path: Path) -> None:
    import onnx

    _, report = qcc.compile(MODEL, tmp_path / "q.onnx", quantize="int8", calib=CALIB,
                            target="onnx-qdq{storage=annotated}")
    assert report["target"] == "onnx-qdq" and report["target_options"] == {"storage": "annotated"}
    proto = onnx.load(str(tmp_path / "q.onnx"))
    assert {p.key: p.value for p in proto.metadata_props}["qcc.qdq_storage"] == "annotated"
    _, inferred = qcc.compile(MODEL, tmp_path / "i.onnx", quantize="uint8", calib=CALIB)
    assert inferred["target"] == "onnx-qdq"


def test_targets_command_lists_options_and_constraints(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["targets"]) == 0
    text = capsys.readouterr().out
    nnb = text[text.index("nnb  ["):]
    assert "version: 2|3 = 3" in nnb and "plan: qcc|nnabla = 'qcc'" in nnb
    assert "positions 0..15" in nnb and "stores computed values by trunc" in nnb
    assert "legalization: legalize-nnb" in nnb
    assert "storage: ort|ort-vnni|annotated = 'ort'" in text
    assert "affine: integer kernels" in text[text.index("c  ["):]


def test_passes_never_compare_target_names() -> None:
    """Constraints reach passes as typed rules; a pass that tests `target == "nnb"` (or mentions a
    target's name in code) would bring back what the contract removed."""
    pattern = re.compile(r"""(target|backend)\w*\s*(==|!=|\bin\b)|["'](nnb|onnx-qdq|onnx|c|nnp)["']\s*(==|!=)""")
    offenders = []
    for path in sorted((ROOT / "passes").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []


def test_report_names_target_rules_not_target_names(tmp_path: Path) -> None:
    """The same pipeline under the c target (nnabla-c-runtime's arithmetic) keeps the rules."""
    report_path = tmp_path / "r.json"
    qcc.compile(MODEL, tmp_path / "c_out", target="c", quantize="fixed8", calib=CALIB, report=str(report_path))
    report = json.loads(report_path.read_text())
    types = {t["name"]: t["type"] for t in report["tensors"]}
    positions = [int(t.split(",")[1].rstrip(")")) for t in types.values() if t.startswith("fixed(")]
    assert positions and all(0 <= p <= 15 for p in positions)
