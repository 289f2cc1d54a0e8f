"""The op support matrix: each IR op against every frontend and backend (`qcc ops`, docs/ops.md).

Frontends and backends describe themselves: an optional `op_support()` method returns
{column name: {IR op: mark}}, read from the one table each keeps (a frontend's importers declare
the IR ops they emit, a backend's table is keyed by IR op). Nothing here lists ops, so an op
added to a table appears at once, and a table naming an op the registry lacks is reported
(`Matrix.unknown`; a test keeps it empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from qcc.errors import InternalError

COLUMNS = ("onnx import", "nnp import", "torch import", "onnx", "onnx-qdq", "nnb", "nnp", "c-float", "c-fixed",
           "c-affine")
"""The built-in columns, in the matrix's order (plugin columns follow)."""

MARKS: dict[str, str] = {
    "yes": "supported",
    "int": "supported; in a quantized model it computes on integers (integer kernel, lookup table, "
           "copy of the stored integers, or no code at all)",
    "float": "supported; in a quantized model it computes in float32 between quantized tensors "
             "(ONNX Runtime between DequantizeLinear and QuantizeLinear, C fixed point the runtime's "
             "generic getter/setter path, C affine dequantize-compute-quantize)",
}
"""What `op_support()` may say about an op. An op a column does not list is unsupported."""

UNSUPPORTED = "-"
UNDECLARED = "?"
UNDECLARED_TEXT = "the plugin does not say (it has no op_support())"


@attrs.frozen
class Matrix:
    columns: tuple[str, ...]
    cells: Mapping[str, Mapping[str, str]]
    """Column -> IR op -> mark."""
    owners: Mapping[str, str]
    """Column -> "frontend onnx" / "backend c" and its distribution."""
    undeclared: tuple[str, ...]
    """Columns of plugins that do not declare their ops."""
    ops: tuple[str, ...]
    """Rows: every registered op, sorted."""
    unknown: Mapping[str, tuple[str, ...]]
    """Column -> ops it names that the registry lacks."""

    def mark(self, op: str, column: str) -> str:
        if column in self.undeclared:
            return UNDECLARED
        return self.cells[column].get(op, UNSUPPORTED)


def _columns_of(obj: Any, where: str) -> dict[str, dict[str, str]]:
    try:
        declared = obj.op_support()
    except Exception as exc:
        raise InternalError(f"{where}: op_support() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(declared, Mapping):
        raise InternalError(f"{where}: op_support() returned {type(declared).__name__}, not a mapping")
    out: dict[str, dict[str, str]] = {}
    for column, ops in declared.items():
        if not isinstance(column, str) or not isinstance(ops, Mapping):
            raise InternalError(f"{where}: op_support() column {column!r} is not a name -> {{op: mark}} mapping")
        bad = sorted(f"{op}={mark!r}" for op, mark in ops.items() if mark not in MARKS)
        if bad:
            raise InternalError(f"{where}: op_support() column {column!r} has marks outside "
                                f"{', '.join(MARKS)}: {', '.join(bad[:5])}")
        out[column] = {str(op): str(mark) for op, mark in ops.items()}
    return out


def build_matrix(reg: Any = None) -> Matrix:
    """The matrix for the plugin registry `reg` (default: the process's, plugins included).

    Every pass, frontend and backend is loaded first, so ops a plugin registers on import are rows.
    """
    from qcc.ir.registry import all_ops
    from qcc.plugins import registry

    reg = reg if reg is not None else registry()
    for name in reg.names("pass"):
        reg.pass_class(name)
    cells: dict[str, dict[str, str]] = {}
    owners: dict[str, str] = {}
    undeclared: list[str] = []
    for kind in ("frontend", "backend"):
        for name in reg.names(kind):
            entry = reg.entry(kind, name)
            owner = f"{kind} {name} ({entry.distribution})"
            obj = entry.load()
            if not hasattr(obj, "op_support"):
                column = f"{name} import" if kind == "frontend" else name
                undeclared.append(column)
                owners[column] = owner
                continue
            for column, ops in _columns_of(obj, owner).items():
                if column in owners:
                    raise InternalError(f"support matrix: column {column!r} is declared by both {owners[column]} "
                                        f"and {owner}")
                owners[column] = owner
                cells[column] = ops
    registered = all_ops()
    unknown = {c: tuple(sorted(op for op in ops if op not in registered)) for c, ops in cells.items()}
    order = [c for c in COLUMNS if c in owners] + sorted(c for c in owners if c not in COLUMNS)
    for column in undeclared:
        cells[column] = {}
    return Matrix(tuple(order), cells, owners, tuple(undeclared), tuple(sorted(registered)),
                  {c: ops for c, ops in unknown.items() if ops})


def _roles(op: str) -> str:
    from qcc.ir.registry import get_schema

    schema = get_schema(op)
    parts = []
    for index, name in enumerate(schema.inputs):
        role = schema.role(index)
        if role.kind == "weight":
            parts.append(f"{name.rstrip('?*')}: weight (axis {role.channel_axis})")
        elif role.kind == "bias":
            parts.append(f"{name.rstrip('?*')}: bias")
    return ", ".join(parts)


def _traits(op: str) -> str:
    from qcc.ir.registry import get_schema

    return ", ".join(sorted(get_schema(op).traits))


def render_text(matrix: Matrix) -> str:
    """The matrix as a terminal table (marks only; `--markdown` adds traits and roles)."""
    rows = [["op", *matrix.columns]]
    rows += [[op, *(matrix.mark(op, c) for c in matrix.columns)] for op in matrix.ops]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines += _legend(matrix, "")
    return "\n".join(lines) + "\n"


def _legend(matrix: Matrix, bullet: str) -> list[str]:
    from qcc.plugins import BUILTIN

    lines = [f"{bullet}{mark}: {text}" for mark, text in MARKS.items()]
    lines.append(f"{bullet}{UNSUPPORTED}: unsupported (import or compile fails, naming the op and the node)")
    lines.append(f"{bullet}a supported op may still be refused for some attribute values (nnb: asymmetric "
                 "padding; nnp: Gelu other than the tanh form), with an error naming the node")
    if matrix.undeclared:
        lines.append(f"{bullet}{UNDECLARED}: {UNDECLARED_TEXT}")
    plugins = [c for c in matrix.columns if not matrix.owners[c].endswith(f"({BUILTIN})")]
    lines += [f"{bullet}{c}: {matrix.owners[c]}" for c in plugins]
    lines += [f"{bullet}warning: column {c!r} names ops the registry lacks: {', '.join(ops)}"
              for c, ops in matrix.unknown.items()]
    return lines


def render_markdown(matrix: Matrix) -> str:
    """docs/ops.md: the matrix with each op's traits and input roles, and the legend."""
    head = ["op", "traits", "roles", *matrix.columns]
    lines = [
        "# IR ops: where each one is supported",
        "",
        "Generated by `qcc ops --markdown > docs/ops.md` from the registry (`qcc/ir/ops/`) and the",
        "tables of the frontends and backends; `tests/test_op_tables.py` fails when this file is stale.",
        "To add an op, follow [adding-an-op.md](adding-an-op.md). Trait meanings: `qcc/ir/registry.py`",
        "(`TRAITS`); roles name the inputs that are not activations (a weight's output-channel axis).",
        "",
        *_legend(matrix, "- "),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for op in matrix.ops:
        cells = [op, _traits(op), _roles(op), *(matrix.mark(op, c) for c in matrix.columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
