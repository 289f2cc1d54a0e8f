"""`qcc inspect model.nnb`: what a .nnb file holds, decoded and checked (any file, not only qcc's)."""

from __future__ import annotations

import os
from typing import Any

from qcc import limits
from qcc.errors import UsageError
from qcc.io import read_regular_file

from .format import ArgValue, DataType, NnbFile, activation_size, read_nnb
from .functions import default_table
from .program import BITS

MAX_NNB_BYTES = 2 * 1024**3  # nnabla-c-runtime's offsets and sizes are 32-bit; 2 GiB is its practical ceiling


def type_name(dtype: DataType, fp_pos: int) -> str:
    """settings.yaml spelling: FLOAT32, FIXED16_12, FIXED8_5, SIGN."""
    if dtype in BITS:
        return f"FIXED{BITS[dtype]}_{fp_pos}"
    return "SIGN" if dtype == DataType.SIGN else "FLOAT32"


def describe_nnb(nnb: NnbFile, file_bytes: int = 0) -> dict[str, Any]:
    """Variables, functions, buffers and totals as plain data (the --json output)."""
    table = default_table()
    unit = 4 if nnb.version == 2 else 1
    roles = {i: "input" for i in nnb.inputs} | {i: "output" for i in nnb.outputs}
    variables = []
    for n, var in enumerate(nnb.variables):
        entry: dict[str, Any] = {"index": n, "shape": list(var.shape), "type": type_name(var.dtype, var.fp_pos)}
        if var.data is not None:
            entry.update(kind="parameter", bytes=len(var.data))
        else:
            entry.update(kind=roles.get(n, "activation"), bytes=activation_size(var.dtype, var.size),
                         buffer=var.buffer)
        variables.append(entry)
    functions = []
    for n, fn in enumerate(nnb.functions):
        spec = table.by_id(fn.type_id, nnb.api_level)
        assert spec is not None  # read_nnb checked it
        args = {arg.name or f"#{i}": _arg(value, arg.choices) for i, (arg, value) in enumerate(zip(spec.args, fn.args))}
        functions.append({"index": n, "function": spec.name, "id": fn.type_id, "implement": fn.impl,
                          "inputs": list(fn.inputs), "outputs": list(fn.outputs), "args": args})
    buffers = [{"index": n, "size": size, "bytes": size * unit} for n, size in enumerate(nnb.buffers)]
    params = sum(v["bytes"] for v in variables if v["kind"] == "parameter")
    return {
        "format": "nnb", "version": nnb.version, "api_level": nnb.api_level,
        "inputs": list(nnb.inputs), "outputs": list(nnb.outputs),
        "variables": variables, "functions": functions, "buffers": buffers,
        "file_bytes": file_bytes, "parameter_bytes": params,
        "buffer_bytes": sum(b["bytes"] for b in buffers),
    }  # fmt: skip


def _arg(value: ArgValue, choices: tuple[str, ...]) -> Any:
    if choices and isinstance(value, int) and 0 <= value < len(choices):
        return choices[value]
    return list(value) if isinstance(value, tuple) else value


def inspect_nnb(path: str | os.PathLike[str], as_json: bool = False) -> dict[str, Any]:
    """Decode `path` (InvalidInputError on any inconsistency) and print a table unless as_json."""
    source = os.fspath(path)
    if not os.path.lexists(source):
        raise UsageError(f"{source}: no such file")
    # the cap applies before reading (a 3 GiB file is refused, not read whole first)
    data = read_regular_file(source, min(limits.current().max_file_bytes, MAX_NNB_BYTES), ".nnb file")
    info = describe_nnb(read_nnb(data, source), len(data))
    if not as_json:
        print_table(source, info)
    return info


def print_table(source: str, info: dict[str, Any]) -> None:
    print(f"{source}: .nnb version {info['version']}, API level {info['api_level']}, {info['file_bytes']} bytes")
    print(f"  {len(info['variables'])} variables, {len(info['functions'])} functions, "
          f"{len(info['buffers'])} buffers")
    print(f"  parameters {info['parameter_bytes']} bytes, activation buffers {info['buffer_bytes']} bytes, "
          f"footprint {info['file_bytes'] + info['buffer_bytes']} bytes (file + buffers)")
    print("  variables:")
    print(f"    {'#':>4}  {'kind':<10} {'type':<11} {'shape':<18} {'bytes':>9}  buffer")
    for v in info["variables"]:
        shape = "x".join(map(str, v["shape"])) or "()"
        buffer = "" if v.get("buffer") is None else str(v["buffer"])
        print(f"    {v['index']:>4}  {v['kind']:<10} {v['type']:<11} {shape:<18} {v['bytes']:>9}  {buffer}")
    print("  functions:")
    for f in info["functions"]:
        args = ", ".join(f"{k}={v}" for k, v in f["args"].items())
        impl = f" implement={f['implement']}" if f["implement"] else ""
        print(f"    {f['index']:>4}  {f['function']}({args}) {f['inputs']} -> {f['outputs']}{impl}")
    print("  buffers:")
    for b in info["buffers"]:
        print(f"    {b['index']:>4}  {b['bytes']} bytes" + (f" ({b['size']} elements)" if b["bytes"] != b["size"] else ""))
