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
    acc = report.get("accuracy_control")
    if acc:
        promoted = ", ".join(f"{p['layer']}->{p['to']}" for p in acc.get("promoted", [])) or "nothing"
        print(f"  accuracy-control ({acc.get('metric')}): float {acc.get('float'):.4f}, quantized "
              f"{acc.get('quantized_before'):.4f} -> {acc.get('quantized_after'):.4f} (drop {acc.get('drop'):.4f}, "
              f"max {acc.get('max_drop')}, {'met' if acc.get('met') else 'NOT met'}); promoted {promoted}")
    ev = report.get("eval")
    if ev:
        print_eval(ev)


def print_eval(ev: dict[str, Any]) -> None:
    """Two lines: qcc's simulator against the float model, and the written file in its runtime."""
    print(f"  eval: {ev.get('data')} ({ev.get('samples')} samples) in qcc's simulator [{ev.get('arithmetic')}]: "
          f"accuracy float {_acc(ev.get('float_accuracy'))} -> quantized {_acc(ev.get('quantized_accuracy'))}, "
          f"top-1 agreement {_acc(ev.get('agreement'))}, output SQNR {_db(ev.get('output_sqnr_db'))} dB")
    rt = ev.get("runtime")
    if rt:
        print(f"  eval: the written file in {rt['name']}: accuracy {_acc(rt.get('accuracy'))}, top-1 agreement "
              f"with the simulator {_acc(rt.get('agreement_with_simulator'))}, output SQNR vs the simulator "
              f"{_db(rt.get('sqnr_vs_simulator_db'))} dB, vs float {_db(rt.get('sqnr_vs_float_db'))} dB")


def _acc(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def _print_tensors(tensors: list[dict[str, Any]]) -> None:
    rows = [t for t in tensors if t.get("type") not in ("float32", None) and t.get("kind") == "activation"]
    if not rows:
        return
    rows.sort(key=lambda t: _sort_key(t.get("eval_sqnr_db", t.get("sqnr_db", MISSING))))
    shown = rows[:MAX_TENSOR_LINES]
    width = max(len("activation"), *(len(t["name"]) for t in shown))  # names are never cut
    type_width = max(len("type"), *(len(t["type"]) for t in shown))
    print(f"  {'activation':<{width}} {'type':<{type_width}} {'range':>20} {'clip':>8} {'SQNR dB':>8} {'eval dB':>8}")
    for t in shown:
        rng = t.get("range")
        rng_text = f"[{rng[0] + 0.0:.3g}, {rng[1] + 0.0:.3g}]" if rng else ""
        clip = t.get("clip_fraction")
        clip_text = f"{100 * clip:.2f}%" if isinstance(clip, (int, float)) else ""
        print(f"  {t['name']:<{width}} {t['type']:<{type_width}} {rng_text:>20} {clip_text:>8} "
              f"{_db(t.get('sqnr_db', MISSING)):>8} {_db(t.get('eval_sqnr_db', MISSING)):>8}")
    if len(rows) > MAX_TENSOR_LINES:
        print(f"  ... {len(rows) - MAX_TENSOR_LINES} more activations (see --report)")


def _db(value: Any) -> str:
    """None means no error at all; MISSING that nothing was measured."""
    if value is None:
        return "exact"
    if value is MISSING:
        return "-"
    return f"{value:.1f}"


def _sort_key(value: Any) -> float:
    return float("inf") if value is None or value is MISSING else float(value)
