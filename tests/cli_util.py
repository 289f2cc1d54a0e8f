"""Running the `qcc` driver in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"


def qcc(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "qcc", *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "[nnabla]" not in line]
    assert proc.returncode != 0, proc.stdout
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("qcc: ")
    return lines[0]
