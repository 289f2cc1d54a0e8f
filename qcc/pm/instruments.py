"""Instruments observe a pipeline run: timing, IR printing, IR dumps, progress."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from qcc.ir.core import Model
from qcc.ir.text import print_model
from qcc.pm.base import Pass, PassResult


class Instrument:
    def before(self, index: int, p: Pass, model: Model) -> None:
        """Called before pass number `index` runs."""

    def after(self, index: int, p: Pass, model: Model, result: PassResult) -> None:
        """Called after it returned (and was verified)."""


class TimePasses(Instrument):
    """Wall time per pass, printed as a table by `report()`."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []
        self._start = 0.0

    def before(self, index: int, p: Pass, model: Model) -> None:
        self._start = time.perf_counter()

    def after(self, index: int, p: Pass, model: Model, result: PassResult) -> None:
        self.times.append((p.name, time.perf_counter() - self._start))

    def report(self, stream: TextIO = sys.stderr) -> None:
        total = sum(t for _, t in self.times) or 1e-12
        print("pass timings:", file=stream)
        for name, t in self.times:
            print(f"  {name:<28} {t * 1000:10.2f} ms  {100 * t / total:5.1f}%", file=stream)
        print(f"  {'total':<28} {total * 1000:10.2f} ms", file=stream)


class PrintAfterAll(Instrument):
    def __init__(self, stream: TextIO = sys.stderr, elide_above: int | None = 16) -> None:
        self.stream, self.elide_above = stream, elide_above

    def after(self, index: int, p: Pass, model: Model, result: PassResult) -> None:
        print(f"// ----- IR after {p.name} (#{index}) -----", file=self.stream)
        self.stream.write(print_model(model, self.elide_above))


class DumpIR(Instrument):
    """Writes `NN-<pass>.qir` per pass (and `00-input.qir`) into a directory."""

    def __init__(self, directory: Path, elide_above: int | None = 64) -> None:
        self.directory = directory
        self.elide_above = elide_above
        directory.mkdir(parents=True, exist_ok=True)
        self._first = True

    def before(self, index: int, p: Pass, model: Model) -> None:
        if self._first:
            self._first = False
            (self.directory / "00-input.qir").write_text(print_model(model, self.elide_above))

    def after(self, index: int, p: Pass, model: Model, result: PassResult) -> None:
        path = self.directory / f"{index + 1:02d}-{p.name}.qir"
        path.write_text(print_model(model, self.elide_above))
