"""A .nnb file in nnabla-c-runtime's `nnablart infer` (QCC_NNABLART, or `nnablart` on PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from qcc.errors import UnsupportedError
from qcc.runtimes.base import EXACT, Runtime, Tolerance


def find_nnablart() -> str | None:
    """The nnablart program: $QCC_NNABLART, else `nnablart` on PATH (qcc never builds it)."""
    given = os.environ.get("QCC_NNABLART")
    if given and os.access(given, os.X_OK):
        return given
    return shutil.which("nnablart")


class Nnablart(Runtime):
    """`nnablart infer FILE.nnb IN.bin OUT` per sample (one float32 file per input and output)."""

    def __init__(self, path: str | os.PathLike[str], program: str, inputs: tuple[str, ...],
                 outputs: list[tuple[str, tuple[int, ...]]], tolerance: Tolerance = EXACT) -> None:
        self.path = os.fspath(path)
        self.program = program
        self.inputs = inputs
        self.outputs = tuple(n for n, _ in outputs)
        self.out_shapes = [s for _, s in outputs]
        self.batch = None
        self.tolerance = tolerance
        self.work = Path(tempfile.mkdtemp(prefix="qcc-nnablart-"))
        self.name = f"nnabla-c-runtime ({program})"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(next(iter(feeds.values())))
        rows: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for i in range(count):
            files = []
            for k, name in enumerate(self.inputs):
                f = self.work / f"in{k}.bin"
                f.write_bytes(np.ascontiguousarray(feeds[name][i:i + 1], dtype="<f4").tobytes())
                files.append(str(f))
            done = subprocess.run([self.program, "infer", self.path, *files, str(self.work / "out")],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise UnsupportedError(f"{self.path}: nnablart failed: {' '.join(done.stderr.split())[:300]}")
            for k, shape in enumerate(self.out_shapes):
                rows[k].append(np.fromfile(self.work / f"out_{k}.bin", dtype="<f4").reshape((1, *shape[1:])))
        return {n: np.concatenate(r) for n, r in zip(self.outputs, rows)}

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
