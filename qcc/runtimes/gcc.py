"""Target c's output as the program it is: built with its own Makefile, run once per sample.

The directory is copied into a temporary folder and built there (the user's output stays as
written); `./model IN.bin OUT.bin` reads every input and writes every output as float32
(main.c), and the header names them with their shapes (`<NAME>_INPUT0_NAME`, `..._SHAPE`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from qcc.errors import InvalidInputError, UnsupportedError
from qcc.runtimes.base import FLOAT, Runtime, Tolerance

_MACRO = re.compile(r"#define (\w+?)_(INPUT|OUTPUT)(\d+)_(NAME|SHAPE) (.*)")


def available() -> bool:
    """A C compiler and make on PATH."""
    return shutil.which("make") is not None and (shutil.which(os.environ.get("CC", "cc")) is not None
                                                 or shutil.which("gcc") is not None)


def read_header(folder: Path) -> tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, tuple[int, ...]]]]:
    """(inputs, outputs) as (name, shape), from the generated header of `folder`."""
    headers = [p for p in sorted(folder.glob("*.h"))]
    if not headers:
        raise InvalidInputError(f"{folder}: no generated header (*.h); is it a directory qcc wrote for target c?")
    found: dict[tuple[str, int], dict[str, object]] = {}
    for line in headers[0].read_text().splitlines():
        m = _MACRO.match(line.strip())
        if m:
            entry = found.setdefault((m.group(2), int(m.group(3))), {})
            text = m.group(5).strip()
            if m.group(4) == "NAME":
                entry["name"] = text.strip('"')
            else:
                entry["shape"] = tuple(int(d) for d in text.strip("{}").split(",") if d.strip())
    if not found:
        raise InvalidInputError(f"{headers[0]}: no INPUT/OUTPUT macros; is it a header qcc wrote for target c?")

    def side(kind: str) -> list[tuple[str, tuple[int, ...]]]:
        keys = sorted(i for k, i in found if k == kind)
        return [(str(found[(kind, i)]["name"]), tuple(found[(kind, i)]["shape"])) for i in keys]  # type: ignore[arg-type]

    return side("INPUT"), side("OUTPUT")


class CBinary(Runtime):
    """The gcc-built `model` program of a target-c directory."""

    def __init__(self, folder: str | os.PathLike[str], tolerance: Tolerance = FLOAT) -> None:
        source = Path(folder)
        if not available():
            raise UnsupportedError(f"{source}: no C compiler or make on PATH to build it")
        ins, outs = read_header(source)
        self.work = Path(tempfile.mkdtemp(prefix="qcc-c-run-"))
        build = self.work / "build"
        shutil.copytree(source, build, ignore=shutil.ignore_patterns("model", "*.o"))
        done = subprocess.run(["make", "-s", "-C", str(build)], capture_output=True, text=True)
        if done.returncode != 0:
            self.close()
            tail = " ".join(done.stderr.split())[-300:]
            raise UnsupportedError(f"{source}: make failed: {tail}")
        self.program = build / "model"
        self.inputs = tuple(n for n, _ in ins)
        self.outputs = tuple(n for n, _ in outs)
        self.in_shapes = dict(ins)
        self.out_shapes = [s for _, s in outs]
        self.batch = None  # one sample per call; run() loops
        self.tolerance = tolerance
        cc = os.environ.get("CC", "cc")
        self.name = f"gcc-built binary ({cc}, the directory's Makefile)"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(next(iter(feeds.values())))
        rows: list[list[np.ndarray]] = [[] for _ in self.outputs]
        src, dst = self.work / "in.bin", self.work / "out.bin"
        for i in range(count):
            parts = [np.ascontiguousarray(feeds[n][i:i + 1], dtype="<f4").reshape(-1) for n in self.inputs]
            src.write_bytes(b"".join(p.tobytes() for p in parts))
            done = subprocess.run([str(self.program), str(src), str(dst)], capture_output=True, text=True)
            if done.returncode != 0:
                raise UnsupportedError(f"{self.program}: exit {done.returncode}: {' '.join(done.stderr.split())[:300]}")
            flat = np.fromfile(dst, dtype="<f4")
            offset = 0
            for k, shape in enumerate(self.out_shapes):
                size = int(np.prod(shape))
                rows[k].append(flat[offset:offset + size].reshape(shape))
                offset += size
        return {n: np.concatenate(r).astype(np.float32) for n, r in zip(self.outputs, rows)}

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
