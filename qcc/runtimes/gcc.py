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


BATCH_MAIN = r"""/* qcc's batch driver: NAME_run once per sample of IN.bin (float32, native order). */
#include <stdio.h>
#include "NAME.h"

static float input[UPPER_IN_SIZE];
static float output[UPPER_OUT_SIZE];

int main(int argc, char **argv)
{
    FILE *in, *out;
    if (argc != 3 || (in = fopen(argv[1], "rb")) == NULL || (out = fopen(argv[2], "wb")) == NULL) {
        return 2;
    }
    while (fread(input, sizeof(float), UPPER_IN_SIZE, in) == UPPER_IN_SIZE) {
        if (NAME_run(input, output) != UPPER_OK
                || fwrite(output, sizeof(float), UPPER_OUT_SIZE, out) != UPPER_OUT_SIZE) {
            return 1;
        }
    }
    return fclose(out) == 0 ? 0 : 1;
}
"""


class CBinary(Runtime):
    """The model code of a target-c directory, compiled by its own Makefile (its flags, its
    object file) and linked with a driver that runs `<name>_run` once per sample, in one process."""

    def __init__(self, folder: str | os.PathLike[str], tolerance: Tolerance = FLOAT) -> None:
        source = Path(folder)
        if not available():
            raise UnsupportedError(f"{source}: no C compiler or make on PATH to build it")
        ins, outs = read_header(source)
        ident = sorted(source.glob("*.h"))[0].stem
        self.work = Path(tempfile.mkdtemp(prefix="qcc-c-run-"))
        build = self.work / "build"
        shutil.copytree(source, build, ignore=shutil.ignore_patterns("model", "*.o"))
        (build / "qcc_batch_main.c").write_text(BATCH_MAIN.replace("NAME", ident).replace("UPPER", ident.upper()))
        cc = os.environ.get("CC", "cc")
        self._build(source, ["make", "-s", "-C", str(build), "model"])  # the Makefile's own build
        self._build(source, [cc, "-std=c99", "-O2", "-o", str(build / "qcc_batch"), str(build / "qcc_batch_main.c"),
                             str(build / f"{ident}.o"), "-lm"])
        self.program = build / "qcc_batch"
        self.inputs = tuple(n for n, _ in ins)
        self.outputs = tuple(n for n, _ in outs)
        self.out_shapes = [s for _, s in outs]
        self.batch = None  # one sample per call of <name>_run
        self.tolerance = tolerance
        self.name = f"gcc-built binary ({cc}, the directory's Makefile)"

    def _build(self, source: Path, command: list[str]) -> None:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            self.close()
            raise UnsupportedError(f"{source}: {command[0]} failed: {' '.join(done.stderr.split())[-300:]}")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(next(iter(feeds.values())))
        rows = [np.ascontiguousarray(feeds[n], dtype=np.float32).reshape(count, -1) for n in self.inputs]
        src, dst = self.work / "in.bin", self.work / "out.bin"
        src.write_bytes(np.concatenate(rows, axis=1).tobytes())  # per sample: every input, in order
        done = subprocess.run([str(self.program), str(src), str(dst)], capture_output=True, text=True)
        if done.returncode != 0:
            raise UnsupportedError(f"{self.program}: exit {done.returncode}: {' '.join(done.stderr.split())[:300]}")
        flat = np.fromfile(dst, dtype=np.float32).reshape(count, -1)
        out, offset = {}, 0
        for name, shape in zip(self.outputs, self.out_shapes):
            size = int(np.prod(shape))
            part = flat[:, offset:offset + size]  # one sample: the output whole (a state keeps it on axis 1)
            out[name] = part.reshape(shape) if count == 1 else part.reshape(count, *shape[1:])
            offset += size
        return out

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
