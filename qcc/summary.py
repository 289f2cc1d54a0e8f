"""Human-readable summaries printed by the driver."""

from __future__ import annotations

import sys
from typing import Any

from qcc.ir.core import Model

MAX_TENSOR_LINES = 40
MISSING = object()


def print_compile_summary(model: Model, report: dict[str, Any]) -> None:
    for warning in report.get("warnings", []):  # on stderr, one line each, like errors
        print(f"qcc: warning: {warning}", file=sys.stderr)
    graph = model.graph
    pipeline = ",".join(report.get("pipeline", [])) or "(none)"
    print(f"qcc: compiled {report.get('output')} [target {report.get('target')}]: "
          f"{len(graph.nodes)} nodes, pipeline {pipeline}")
    pb = report.get("parameter_bytes")
    if pb and pb.get("stored") != pb.get("float"):
        print(f"  parameters: {pb['float']} bytes in float, {pb['stored']} stored")
    _print_tensors(report.get("tensors", []))
    fallbacks = report.get("float_fallbacks", [])
    for entry in fallbacks[:MAX_TENSOR_LINES]:
        if isinstance(entry, dict) and "tensor" in entry:
            print(f"  left in float: {entry['tensor']} ({entry.get('kind', '?')}): {entry.get('reason', '')}")
        else:
            print(f"  left in float: {entry}")
    if len(fallbacks) > MAX_TENSOR_LINES:
        print(f"  ... {len(fallbacks) - MAX_TENSOR_LINES} more left in float (see --report)")
    for entry in report.get("fold_bn", []):
        print(f"  fold-bn: {entry.get('node')} not folded: {entry.get('reason')}")
    sens = report.get("sensitivity")
    if sens:
        worst = sorted((e for e in sens.get("layers", []) if e.get("sqnr_db") is not None),
                       key=lambda e: e["sqnr_db"])[:5]
        shown = ", ".join(f"{e['layer']} {e['sqnr_db']:.1f} dB" for e in worst)
        print(f"  sensitivity (output SQNR with one layer quantized, worst first): {shown}")
        print(f"  sensitivity: output SQNR {_db(sens.get('baseline_output_sqnr_db'))} -> "
              f"{_db(sens.get('output_sqnr_db'))} promoting {sens.get('promoted') or 'nothing'}")
    ev = report.get("eval")
    if ev:
        print("  eval: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in ev.items()))


def _print_tensors(tensors: list[dict[str, Any]]) -> None:
    rows = [t for t in tensors if t.get("type") not in ("float32", None) and t.get("kind") == "activation"]
    if not rows:
        return
    rows.sort(key=lambda t: _sort_key(t.get("eval_sqnr_db", t.get("sqnr_db", MISSING))))
    print(f"  {'activation':<24} {'type':<34} {'range':>20} {'clip':>8} {'SQNR dB':>8} {'eval dB':>8}")
    for t in rows[:MAX_TENSOR_LINES]:
        rng = t.get("range")
        rng_text = f"[{rng[0] + 0.0:.3g}, {rng[1] + 0.0:.3g}]" if rng else ""
        clip = t.get("clip_fraction")
        clip_text = f"{100 * clip:.2f}%" if isinstance(clip, (int, float)) else ""
        print(f"  {t['name'][:24]:<24} {_short(t['type']):<34} {rng_text:>20} {clip_text:>8} "
              f"{_db(t.get('sqnr_db', MISSING)):>8} {_db(t.get('eval_sqnr_db', MISSING)):>8}")
    if len(rows) > MAX_TENSOR_LINES:
        print(f"  ... {len(rows) - MAX_TENSOR_LINES} more activations (see --report)")


def _short(text: str) -> str:
    return text if len(text) <= 34 else text[:31] + "..."


def _db(value: Any) -> str:
    """None means no error at all; MISSING that nothing was measured."""
    if value is None:
        return "exact"
    if value is MISSING:
        return "-"
    return f"{value:.1f}"


def _sort_key(value: Any) -> float:
    return float("inf") if value is None or value is MISSING else float(value)
