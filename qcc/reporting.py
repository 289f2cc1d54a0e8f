"""Assembling the compile report (JSON via --report, summary on stdout).

Keys (docs/passes.md, "Report"): `tensors` (one entry per value: type, bytes, and what the
annotation passes measured: scale or position, range, observed range, clip_fraction, sqnr_db,
layer_sqnr_db, eval_sqnr_db), `float_fallbacks` (every float tensor left in float once a
quantization pass ran, with the reason), `eval` with --eval, and the passes' own sections
(`fold_bn`, `calibration`, `sensitivity`, ...).
"""

from __future__ import annotations

from typing import Any

from qcc.ir.core import Model
from qcc.ir.types import Float32, storage_bytes

FLOAT_DTYPES = ("float32", "float64", "float16")


def assemble_report(model: Model, ctx: Any, opts: Any, out: str, backend: Any) -> dict[str, Any]:
    from qcc import __version__

    graph = model.graph
    tensors = []
    param_bytes = {"float": 0, "stored": 0}
    for value in graph.values():
        entry: dict[str, Any] = {"name": value.name, "shape": list(value.type.shape),
                                 "kind": "parameter" if value.is_const else "activation",
                                 "type": str(value.quant) if value.quant is not None else "float32",
                                 "bytes": storage_bytes(value.type, value.quant)}
        if value.meta.get("override"):
            entry["override"] = value.meta["override"]
        entry.update(value.meta.get("report", {}))
        tensors.append(entry)
        if value.is_const:
            param_bytes["float"] += value.type.nbytes()
            param_bytes["stored"] += entry["bytes"]
    report: dict[str, Any] = {
        "qcc_version": __version__,
        "output": out,
        "target": getattr(backend, "name", "?"),
        "pipeline": list(model.passes_run),
        "nodes": len(graph.nodes),
        "parameter_bytes": param_bytes,
        "tensors": tensors,
        "float_fallbacks": float_fallbacks(model) + list(ctx.report.get("float_fallbacks", [])),
    }
    for key, value in ctx.report.items():
        report.setdefault(key, value)
    memory = memory_report(model)
    if memory is not None:
        report["memory"] = memory
    return report


def memory_report(model: Model) -> dict[str, Any] | None:
    """The `memory` section (as `qcc inspect --memory --json`) when plan-memory stored a plan."""
    from qcc.plan.summary import stored_memory_section

    return stored_memory_section(model)


def float_fallbacks(model: Model) -> list[dict[str, Any]]:
    """Float tensors left in float, and why; empty when no value was annotated (no quantization)."""
    graph = model.graph
    values = [v for v in graph.values() if v.type.dtype in FLOAT_DTYPES]
    if not any(v.quant is not None and not isinstance(v.quant, Float32) for v in values):
        return []
    pipeline = ",".join(model.passes_run) or "(none)"
    out = []
    for v in values:
        if v.quant is None or isinstance(v.quant, Float32):
            reason = v.meta.get("float_reason") or (
                "pinned FLOAT32 by the user (settings.yaml)" if v.meta.get("pinned") and v.quant is not None
                else f"no pass of the pipeline ({pipeline}) annotated it")
            out.append({"tensor": v.name, "kind": "parameter" if v.is_const else "activation", "reason": reason})
    return out
