"""The codebase stays ruff-clean and mypy-clean (the project's style contract, checked in CI)."""

from __future__ import annotations

import subprocess
import sys

from tests.cli_util import ROOT


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "qcc", "passes", "backends", "tests", "bench",
                           "examples"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "qcc", "passes", "backends"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
