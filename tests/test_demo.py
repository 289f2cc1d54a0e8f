"""The README's main job: the demo compiles the digits CNN to every target and each keeps accuracy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli_util import ROOT


def test_demo_compiles_every_target_and_keeps_accuracy(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ") and "0." in line]
    table = [r for r in rows if r[0] in ("ONNX", ".nnb", "C", ".nnp")]
    assert len(table) == 11, proc.stdout
    assert "failed" not in proc.stdout and "not available" not in proc.stdout
    for row in table:
        accuracy = next(float(c) for c in row if c.startswith("0.") and len(c) == 6)
        assert accuracy >= 0.98, row
    runtimes = {" ".join(r[:2]): " ".join(r) for r in table}
    for label, runtime in (("C fixed8", "gcc-built binary"), ("C int8", "gcc-built binary"),
                           ("ONNX QDQ", "onnxruntime"), (".nnp float", "nnabla")):
        assert runtime in runtimes[label], runtimes  # measured where it runs, by --eval
