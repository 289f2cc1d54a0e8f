"""A .nnb file in nnabla-c-runtime's `nnablart infer` (QCC_NNABLART, or `nnablart` on PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs
import numpy as np

from qcc.errors import UnsupportedError
from qcc.runtimes.base import EXACT, Runtime, Tolerance


def find_nnablart() -> str | None:
    """The nnablart program: $QCC_NNABLART, else `nnablart` on PATH (qcc never builds it)."""
    given = os.environ.get("QCC_NNABLART")
    if given and os.access(given, os.X_OK):
        return given
    return shutil.which("nnablart")


@attrs.frozen
class Stored:
    """How nnablart reads an input or writes an output file: float32, or the integers of a
    fixed-point variable (value = integer * 2**-fp)."""

    bits: int | None = None  # None: float32; 8 or 16: INT8/INT16
    fp: int = 0

    def encode(self, x: np.ndarray) -> bytes:
        """A float input as the runtime reads it (qcc's simulator quantizes graph inputs alike)."""
        if self.bits is None:
            return np.ascontiguousarray(x, dtype="<f4").tobytes()
        from qcc.ir.types import FixedPoint
        from qcc.sim.fixed import quantize_round

        return quantize_round(x, FixedPoint(self.bits, self.fp)).astype(f"<i{self.bits // 8}").tobytes()

    def decode(self, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
        if self.bits is None:
            return np.frombuffer(data, "<f4").reshape(shape).copy()
        ints = np.frombuffer(data, f"<i{self.bits // 8}").reshape(shape)
        return np.ldexp(ints.astype(np.float32), -self.fp)


class Nnablart(Runtime):
    """`nnablart infer FILE.nnb IN.bin OUT` per sample: inputs and outputs in the variables' own
    types (float32, or fixed-point integers)."""

    def __init__(self, path: str | os.PathLike[str], program: str, inputs: tuple[tuple[str, Stored], ...],
                 outputs: list[tuple[str, tuple[int, ...], Stored]], tolerance: Tolerance = EXACT) -> None:
        self.path = os.fspath(path)
        self.program = program
        self.inputs = tuple(n for n, _ in inputs)
        self.in_formats = tuple(f for _, f in inputs)
        self.outputs = tuple(n for n, _, _ in outputs)
        self.out_shapes = [s for _, s, _ in outputs]
        self.out_formats = [f for _, _, f in outputs]
        self.batch = None
        self.tolerance = tolerance
        self.work = Path(tempfile.mkdtemp(prefix="qcc-nnablart-"))
        self.name = f"nnabla-c-runtime ({program})"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(next(iter(feeds.values())))
        rows: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for i in range(count):
            files = []
            for k, (name, fmt) in enumerate(zip(self.inputs, self.in_formats)):
                f = self.work / f"in{k}.bin"
                # one sample: each input whole (a recurrent state holds it on axis 1, qcc.ir.samples)
                f.write_bytes(fmt.encode(feeds[name] if count == 1 else feeds[name][i:i + 1]))
                files.append(str(f))
            done = subprocess.run([self.program, "infer", self.path, *files, str(self.work / "out")],
                                  capture_output=True, text=True)
            if done.returncode != 0:  # nnablart says why on stdout
                said = " ".join((done.stderr + " " + done.stdout).split())
                raise UnsupportedError(f"{self.path}: nnablart failed (exit {done.returncode}): {said[-300:]}")
            for k, (shape, fmt) in enumerate(zip(self.out_shapes, self.out_formats)):
                # one inference writes the declared shape, whichever axis holds the batch of 1
                # (a (T, N, C) sequence output too); samples stack on axis 0, as other runtimes'
                rows[k].append(fmt.decode((self.work / f"out_{k}.bin").read_bytes(), tuple(shape)))
        return {n: np.concatenate(r) for n, r in zip(self.outputs, rows)}

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
