"""Human-readable summaries printed by the driver."""

from __future__ import annotations

from typing import Any

from qcc.ir.core import Model


def print_compile_summary(model: Model, report: dict[str, Any]) -> None:
    graph = model.graph
    pipeline = ",".join(report.get("pipeline", [])) or "(none)"
    print(f"qcc: compiled {report.get('output')} [target {report.get('target')}]: "
          f"{len(graph.nodes)} nodes, pipeline {pipeline}")
    for entry in report.get("float_fallbacks", []):
        print(f"  left in float: {entry}")
    ev = report.get("eval")
    if ev:
        print("  eval: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in ev.items()))
