"""Tool processes timed as installed packages run: with their bytecode already compiled.

pip writes `__pycache__` when it installs a package, so a user's `qcc` or `quantize_static`
does not compile its Python sources at start-up. A development checkout run with
PYTHONDONTWRITEBYTECODE (as this machine's sessions are) compiles qcc's ~140 modules in every
process, 0.5-1 s that onnxruntime (installed, compiled) never pays. The timed processes get a
bytecode cache in a scratch folder (PYTHONPYCACHEPREFIX), filled once before timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compiled_env(scratch: Path, roots: tuple[Path, ...] = (ROOT,)) -> dict[str, str]:
    """os.environ with a bytecode cache under `scratch`, filled for the qcc sources of each checkout
    in `roots` (another checkout timed beside this one gets its bytecode too). The cache mirrors
    every source path, so the first process also fills it for the packages it imports: time the
    processes after one untimed run of each."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
    for root in roots:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "qcc", "passes", "backends"], cwd=root, env=env,
                       check=True, stdout=subprocess.DEVNULL)
    return env
