"""How a .nnb file is run: nnabla-c-runtime's `nnablart` when found (QCC_NNABLART or PATH), else
qcc's emulation of the decoded file (lift.py + qcc.sim: the kernels the tests check bit for bit
against nnablart)."""

from __future__ import annotations

import os
from pathlib import Path

from qcc.errors import UnsupportedError
from qcc.runtimes.base import Runtime, Tolerance
from qcc.runtimes.nnablart import Nnablart, Stored, find_nnablart
from qcc.runtimes.simulator import SimRuntime

from .format import DataType, Variable, read_nnb
from .lift import lift_nnb


def nnb_runtime(path: str | os.PathLike[str], tolerance: Tolerance) -> Runtime:
    source = Path(path)
    nnb = read_nnb(source.read_bytes(), str(source))
    program = find_nnablart()
    if program:
        inputs = tuple((f"v{i}", stored(nnb.variables[i], source)) for i in nnb.inputs)
        outputs = [(f"v{i}", tuple(nnb.variables[i].shape), stored(nnb.variables[i], source)) for i in nnb.outputs]
        return Nnablart(source, program, inputs, outputs, tolerance)
    model = lift_nnb(nnb)
    return SimRuntime(model, quantized=True, name="qcc emulation of the decoded .nnb (nnablart not found: "
                      "set QCC_NNABLART)", tolerance=tolerance)


def stored(var: Variable, source: Path) -> Stored:
    """The file format of a graph input or output in `nnablart infer`."""
    if var.dtype == DataType.FLOAT:
        return Stored()
    if var.dtype in (DataType.INT8, DataType.INT16):
        return Stored(8 if var.dtype == DataType.INT8 else 16, var.fp_pos)
    raise UnsupportedError(f"{source}: a graph input or output is {var.dtype.name}: nnablart's infer files hold "
                           "only float and fixed-point graph inputs and outputs")
