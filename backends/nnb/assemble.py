"""A lowered program plus its buffer plan -> `NnbFile` (function ids and arguments per API level)."""

from __future__ import annotations

from qcc.errors import InternalError, UnsupportedError

from .format import ArgValue, Function, NnbFile, Variable
from .functions import RUNTIME_IMPLEMENTED, FunctionTable, default_table
from .plan import BufferPlan
from .program import NFunc, Program


def encode_args(fn: NFunc, table: FunctionTable, level: int) -> tuple[int, tuple[ArgValue, ...]]:
    """(function id, argument values in the format's order) at `level`.

    Arguments a lower API level drops are omitted, as nnabla's writer does (it only ever drops
    trailing ones); a function the level lacks, or an argument qcc did not give, is an error.
    """
    if fn.kind not in RUNTIME_IMPLEMENTED:
        raise UnsupportedError(f"function {fn.name!r}: {fn.kind} is not implemented by nnabla-c-runtime")
    try:
        spec = table.spec(fn.kind, level)
    except UnsupportedError as exc:
        raise UnsupportedError(f"function {fn.name!r}: {exc}") from None
    values: list[ArgValue] = []
    for arg in spec.args:
        if arg.name not in fn.args:
            raise InternalError(f"function {fn.name!r} ({fn.kind}): no value for argument {arg.name!r}")
        value = fn.args[arg.name]
        if arg.code == "iI":
            value = tuple(int(v) for v in value)  # type: ignore[union-attr]
        elif arg.code == "B":
            value = int(bool(value))
        elif arg.code == "f":
            value = float(value)  # type: ignore[arg-type]
        else:
            value = int(value)  # type: ignore[arg-type]
        values.append(value)
    return spec.id, tuple(values)


def assemble(program: Program, plan: BufferPlan, version: int, level: int,
             table: FunctionTable | None = None) -> NnbFile:
    table = table or default_table()
    index = program.index()
    variables = []
    for v in program.variables:
        if v.is_param:
            variables.append(Variable(v.shape, v.storage.dtype, v.storage.fp_pos, data=v.data))
        else:
            buffer = plan.buffer_of.get(id(v))
            if buffer is None:
                raise InternalError(f"variable {v.name!r} has no buffer")
            variables.append(Variable(v.shape, v.storage.dtype, v.storage.fp_pos, buffer=buffer))
    functions = []
    for fn in program.functions:
        type_id, args = encode_args(fn, table, level)
        functions.append(Function(type_id, tuple(index[id(v)] for v in fn.inputs),
                                  tuple(index[id(v)] for v in fn.outputs), args, fn.impl))
    return NnbFile(version, level, plan.sizes, tuple(variables), tuple(functions),
                   tuple(index[id(v)] for v in program.inputs), tuple(index[id(v)] for v in program.outputs))
