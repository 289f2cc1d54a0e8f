"""How a .nnb file is run: nnabla-c-runtime's `nnablart` when found (QCC_NNABLART or PATH), else
qcc's emulation of the decoded file (lift.py + qcc.sim: the kernels the tests check bit for bit
against nnablart)."""

from __future__ import annotations

import os
from pathlib import Path

from qcc.runtimes.base import Runtime, Tolerance
from qcc.runtimes.nnablart import Nnablart, find_nnablart
from qcc.runtimes.simulator import SimRuntime

from .format import read_nnb
from .lift import lift_nnb


def nnb_runtime(path: str | os.PathLike[str], tolerance: Tolerance) -> Runtime:
    source = Path(path)
    nnb = read_nnb(source.read_bytes(), str(source))
    program = find_nnablart()
    if program:
        inputs = tuple(f"v{i}" for i in nnb.inputs)
        outputs = [(f"v{i}", tuple(nnb.variables[i].shape)) for i in nnb.outputs]
        return Nnablart(source, program, inputs, outputs, tolerance)
    model = lift_nnb(nnb)
    return SimRuntime(model, quantized=True, name="qcc emulation of the decoded .nnb (nnablart not found: "
                      "set QCC_NNABLART)", tolerance=tolerance)
