"""`--plan nnabla`: the file `nnabla_cli convert -b 1 --api LEVEL [-d nnb_3] [-s settings.yaml]`
writes for the same .nnp, byte for byte.

Written from the .nnp's own network, as nnabla's converter reads it (nnabla 1.39:
`NnpImporter` with network expansion, `NnbExporter`, `save_variable_buffer`): its variables in
declaration order with batch dimensions set to 1, its functions in the expander's topological
order (a depth-first reverse post-order, which can differ from the file's order on branches),
its arguments, nnabla's parameter quantization (round half to even, automatic positions) and
nnabla's buffer reuse. qcc only supplies the types: the settings file's entries, then the
annotations of qcc's graph (so a qcc-quantized model gives what nnabla would write with the
settings.yaml qcc exports), then FLOAT32. The graph must still be the .nnp's network: a pipeline
that removed or added functions (fold-bn, insert-quantize) cannot be written this way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError, UnsupportedError, UsageError
from qcc.formats.nnp import INTERNAL, NnpSource
from qcc.ir.core import Model

from .format import DataType, Function, NnbFile, Variable, activation_size, encode_values
from .functions import RUNTIME_IMPLEMENTED, FunctionTable, default_table

TYPES = {"FLOAT32": DataType.FLOAT, "FIXED16": DataType.INT16, "FIXED8": DataType.INT8, "SIGN": DataType.SIGN}
BYTES = {"FLOAT32": 4, "FIXED16": 2, "FIXED8": 1}
TRANSPOSED = {"Affine": (1,), "BinaryConnectAffine": (1, 2), "BinaryWeightAffine": (1, 2)}
FP_MAX = {DataType.INT16: 15, DataType.INT8: 7}


def nnabla_compatible(model: Model, version: int, api: int, settings: str | None = None,
                      batch: int = 1, table: FunctionTable | None = None) -> NnbFile:
    """The NnbFile nnabla's converter would write for the model's source .nnp (as the frontend read it)."""
    table = table or default_table()
    level = table.check_level(api)
    source = str(model.metadata.get("source") or "memory")
    origin = model.products.get(NnpSource)
    if origin is None:
        raise UsageError("--plan nnabla reproduces nnabla_cli convert, which reads an .nnp; "
                         f"this model came from {source} (use --plan qcc)")
    contents = origin.contents
    executor = _executor(contents.proto, origin.executor, source)
    network = next((n for n in contents.proto.network if n.name == executor.network_name), None)
    if network is None:
        raise InvalidInputError(f"{source}: executor {executor.name!r} runs a missing network")
    _check_same_graph(model, network, executor, source)
    functions = _expander_order(list(network.function))
    settings_vars, settings_funcs = _settings(settings)
    types = {v.name: _type_of(v.name, settings_vars, model) for v in network.variable}
    inputs = [d.variable_name for d in executor.data_variable]
    outputs = [o.variable_name for o in executor.output_variable]
    generators = {g.variable_name: g for g in executor.generator_variable}
    vindex = {v.name: n for n, v in enumerate(network.variable)}
    buffers, buffer_of = _nnabla_buffers(network, functions, inputs, outputs, types, version, batch)
    transposed = {f.input[i] for f in functions for i in TRANSPOSED.get(f.type, ()) if i < len(f.input)}
    variables = []
    for v in network.variable:
        shape = tuple(int(d) if d >= 0 else batch for d in v.shape.dim)
        type_name, fp = types[v.name]
        dtype = TYPES[type_name]
        where = f"{source}: variable {v.name!r}"
        if v.name in generators:
            variables.append(Variable(shape, dtype, 0, data=_generated(generators[v.name], shape, type_name, where)))
        elif v.type == "Parameter":
            array = _param(contents.params, v.name, shape, v.name in transposed, where)
            data, fp = _encode(array, type_name, fp, where)
            variables.append(Variable(shape, dtype, fp, data=data))
        else:
            if dtype == DataType.SIGN:
                raise UnsupportedError(f"{where}: SIGN is for parameters only (nnabla refuses it for buffers)")
            if dtype != DataType.FLOAT and fp is None:
                raise UnsupportedError(f"{where}: buffers need an explicit position ({type_name}_<pos>)")
            variables.append(Variable(shape, dtype, fp or 0, buffer=buffer_of.get(v.name, 0)))
    encoded = [_function(f, vindex, settings_funcs, table, level, source) for f in functions]
    return NnbFile(version, level, buffers, tuple(variables), tuple(encoded),
                   tuple(vindex[n] for n in inputs), tuple(vindex[n] for n in outputs))


def _executor(proto: Any, name: str | None, source: str) -> Any:
    if not proto.executor:
        raise InvalidInputError(f"{source}: no executor (nnabla_cli convert needs one)")
    for exe in proto.executor:
        if exe.name == name:
            return exe
    return proto.executor[0]


def _check_same_graph(model: Model, network: Any, executor: Any, source: str) -> None:
    """Every live function of the network is still in qcc's graph, and nothing was added."""
    values = model.graph.value_map()
    producer = {o: f for f in network.function for o in f.output}
    live: set[str] = set()
    todo = [o.variable_name for o in executor.output_variable]
    while todo:
        f = producer.get(todo.pop())
        if f is not None and f.name not in live:
            live.add(f.name)
            todo.extend(f.input)
    missing = [f.name for f in network.function if f.name in live and any(o not in values for o in f.output)]
    declared = {v.name for v in network.variable}
    added = [n.name for n in model.graph.nodes
             if not n.meta.get(INTERNAL) and any(o.name not in declared for o in n.outputs)]
    if missing or added:
        what = "; ".join(part for part in (
            f"functions no longer in the graph: {missing[:8]}" if missing else "",
            f"nodes the pipeline added: {added[:8]}" if added else "") if part)
        raise UsageError(f"{source}: --plan nnabla writes the .nnp's own network as nnabla_cli convert does, "
                         f"but the pipeline changed it ({what}); run without graph-changing passes or use "
                         "--plan qcc")


def _expander_order(functions: list[Any]) -> list[Any]:
    """nnabla's NnpExpander._TopologicalSort: reverse post-order of a depth-first search that
    starts from each function in file order and follows consumers in file order."""
    consumers: dict[str, list[int]] = {}
    for i, f in enumerate(functions):
        for name in f.input:
            consumers.setdefault(name, []).append(i)
    state = [0] * len(functions)
    finished: list[int] = []
    for start in range(len(functions)):
        if state[start]:
            continue
        state[start] = 1
        stack: list[tuple[int, Iterator[int]]] = [(start, _children(functions[start], consumers))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                state[node] = 2
                finished.append(node)
            elif state[child] == 1:
                raise InvalidInputError(f"network has a cycle through function {functions[child].name!r}")
            elif state[child] == 0:
                state[child] = 1
                stack.append((child, _children(functions[child], consumers)))
    return [functions[i] for i in reversed(finished)]


def _children(f: Any, consumers: dict[str, list[int]]) -> Iterator[int]:
    for name in f.output:
        yield from sorted(set(consumers.get(name, [])))


def _settings(path: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    if path is None:
        return {}, {}
    from qcc.formats.settings_yaml import load_settings

    functions, variables = load_settings(path)
    return dict(variables), dict(functions)


def _type_of(name: str, settings: dict[str, Any], model: Model) -> tuple[str, int | None]:
    """(FLOAT32 | FIXED16 | FIXED8 | SIGN, position or None) for one variable."""
    text = settings.get(name)
    if text is None:
        value = model.graph.value_map().get(name)
        if value is None or value.quant is None:
            return "FLOAT32", None
        from qcc.formats.settings_yaml import type_name

        text = type_name(value)
    head, _, tail = str(text).partition("_")
    if head not in TYPES or (tail and not tail.isdigit()):
        raise InvalidInputError(f"settings: variable {name!r} has unknown type {text!r}")
    return head, int(tail) if tail else None


def _nnabla_buffers(network: Any, functions: list[Any], inputs: list[str], outputs: list[str],
                    types: dict[str, tuple[str, int | None]], version: int,
                    batch: int) -> tuple[tuple[int, ...], dict[str, int]]:
    """save_variable_buffer: lifetimes by function index, then nnabla's shared plan."""
    from qcc.plan import Buffer, nnabla_shared_plan

    kinds = {v.name: v for v in network.variable}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, f in enumerate(functions):
        for name in [*f.input, *f.output]:
            if kinds[name].type != "Buffer":
                continue
            first.setdefault(name, 0 if name in inputs else step)
            last[name] = len(functions) if name in outputs else step
    planned = []
    for v in network.variable:
        if v.name in first:
            size = math.prod(int(d) if d >= 0 else batch for d in v.shape.dim)
            if version > 2:
                size *= BYTES.get(types[v.name][0], 4)
            planned.append(Buffer(v.name, size, first[v.name], last[v.name]))
    if not planned:
        return (), {}
    plan = nnabla_shared_plan(planned)
    return tuple(int(s) for s in plan.buffer_sizes), dict(plan.assignment)


def _param(params: dict[str, np.ndarray], name: str, shape: tuple[int, ...], transposed: bool,
           where: str) -> np.ndarray:
    if name not in params:
        raise InvalidInputError(f"{where}: parameter has no data in the file")
    array = np.asarray(params[name], dtype=np.float32).reshape(-1)
    if array.size != math.prod(shape):
        raise InvalidInputError(f"{where}: {array.size} values for shape {shape}")
    if transposed:
        array = array.reshape(shape[0], -1).T.reshape(-1)
    return array.astype(np.float64)


def _encode(array: np.ndarray, type_name: str, fp: int | None, where: str) -> tuple[bytes, int]:
    """NnbExporter's parameter encoding: float32, nnabla's sign packing, or rounded integers."""
    if type_name == "FLOAT32":
        return encode_values(array.astype(np.float32), DataType.FLOAT), 0
    if type_name == "SIGN":
        if array.size % 8:
            raise UnsupportedError(f"{where}: nnabla packs SIGN parameters 8 at a time; {array.size} values")
        u = array.astype(np.uint8)  # nnabla: astype(uint8), 255 (-1) -> 0, then any nonzero is a 1 bit
        u[u == 255] = 0
        return np.packbits(u.reshape(-1, 8)[:, ::-1].reshape(-1) != 0).tobytes(), 0
    dtype = TYPES[type_name]
    if fp is None:
        from qcc.quant.fixedpoint import nnabla_int_bits

        fp = FP_MAX[dtype] + 1 - nnabla_int_bits(array)
    if not 0 <= fp <= 15:
        raise UnsupportedError(f"{where}: position {fp} does not fit .nnb's 0..15 (nnabla would write garbage)")
    bound = 32768 if dtype == DataType.INT16 else 128
    q = np.clip(np.round(array * (1 << fp)), -bound, bound - 1)
    return encode_values(q, dtype), fp


def _generated(gen: Any, shape: tuple[int, ...], type_name: str, where: str) -> bytes:
    if gen.type != "Constant" or type_name != "FLOAT32":
        raise UnsupportedError(f"{where}: only FLOAT32 Constant generators can be stored ({gen.type}, {type_name})")
    return encode_values(np.full(shape, gen.multiplier, dtype=np.float32), DataType.FLOAT)


def _function(f: Any, vindex: dict[str, int], settings: dict[str, Any], table: FunctionTable, level: int,
              source: str) -> Function:
    from qcc.formats.nnp_archive import function_args

    where = f"{source}: function {f.name!r} ({f.type})"
    if f.type not in RUNTIME_IMPLEMENTED:
        raise UnsupportedError(f"{where}: nnabla-c-runtime does not implement {f.type}")
    if f.type.startswith("Binary") and f.type.endswith("Convolution"):
        raise UnsupportedError(f"{where}: nnabla stores a 1-element stub for the unused float weight, "
                               "which qcc's writer refuses; use --plan qcc")
    try:
        spec = table.spec(f.type, level)
    except UnsupportedError as exc:
        raise UnsupportedError(f"{where}: {exc}") from None
    message = function_args(f)
    values: list[Any] = []
    for arg in spec.args:
        value = getattr(message, arg.name)
        if arg.type == "Shape":
            values.append(tuple(int(d) for d in value.dim))
        elif arg.type == "repeated int64":
            values.append(tuple(int(d) for d in value))
        elif arg.type == "string":
            if value not in arg.choices:
                raise InvalidInputError(f"{where}: {arg.name} {value!r} is not one of {arg.choices}")
            values.append(arg.choices.index(value))
        elif arg.type == "bool":
            values.append(int(bool(value)))
        elif arg.type in ("float", "double"):
            values.append(float(value))
        else:
            values.append(int(value))
    entry = settings.get(f.name)
    impl = int(entry.get("implement", 0)) if isinstance(entry, dict) else 0
    return Function(spec.id, tuple(vindex[n] for n in f.input), tuple(vindex[n] for n in f.output),
                    tuple(values), impl)


def activation_bytes(nnb: NnbFile) -> int:
    """Bytes the runtime mallocs for the file's buffers."""
    return sum(nnb.buffers) * (4 if nnb.version == 2 else 1)


__all__ = ["activation_bytes", "activation_size", "nnabla_compatible"]
