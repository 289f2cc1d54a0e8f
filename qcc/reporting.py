"""Assembling the compile report (JSON via --report, summary on stdout)."""

from __future__ import annotations

from typing import Any

from qcc.ir.core import Model
from qcc.ir.types import storage_bytes


def assemble_report(model: Model, ctx: Any, opts: Any, out: str, backend: Any) -> dict[str, Any]:
    from qcc import __version__

    graph = model.graph
    tensors = []
    for value in graph.values():
        entry: dict[str, Any] = {"name": value.name, "shape": list(value.type.shape),
                                 "kind": "parameter" if value.is_const else "activation",
                                 "type": str(value.quant) if value.quant is not None else "float32",
                                 "bytes": storage_bytes(value.type, value.quant)}
        entry.update(value.meta.get("report", {}))
        tensors.append(entry)
    report: dict[str, Any] = {
        "qcc_version": __version__,
        "output": out,
        "target": getattr(backend, "name", "?"),
        "pipeline": list(model.passes_run),
        "nodes": len(graph.nodes),
        "tensors": tensors,
        "float_fallbacks": list(ctx.report.get("float_fallbacks", [])),
    }
    for key, value in ctx.report.items():
        report.setdefault(key, value)
    return report
