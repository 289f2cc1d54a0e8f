"""Target c's columns of the support matrix (docs/ops.md), read from its numeric modes.

Each mode (`backends/c/modes`) reports the ops it lowers (`lowered_ops`, from its lowering table
and the registry traits it derives lowerings from) and the ones it computes in float32 between
its stored tensors (`float_ops`): "float" marks those, "int" integer kernels, tables and copies.
"""

from __future__ import annotations

COLUMNS = {"float": "c-float", "fixed": "c-fixed", "affine": "c-affine"}


def op_support() -> dict[str, dict[str, str]]:
    from qcc.backends.c.modes import MODES

    columns: dict[str, dict[str, str]] = {}
    for mode in MODES:
        ops = mode.lowered_ops()
        if not mode.integer:
            columns[COLUMNS[mode.name]] = dict.fromkeys(ops, "yes")
        else:
            floats = mode.float_ops()
            columns[COLUMNS[mode.name]] = {op: "float" if op in floats else "int" for op in ops}
    return columns
