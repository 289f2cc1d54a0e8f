"""The memory section of `qcc inspect --memory` and of the compile report: per-layer table
(seed 003 style: name, shapes, buffer bytes) and totals against the bounds and nnabla's policy."""

from __future__ import annotations

from typing import Any

import numpy as np

from qcc.ir.core import Model
from qcc.plan.memory_plan import MemoryPlan, PlanOptions, plan_model, plan_status
from qcc.plan.nnabla_policy import nnabla_shared_plan
from qcc.plan.sizing import Sizer, scheme_sizer


def plan_totals(plan: MemoryPlan) -> dict[str, Any]:
    """Bytes of every plan and bound, with the methods and whether each plan is proved optimal."""
    nnabla = nnabla_shared_plan(plan.buffers)
    out: dict[str, Any] = {
        "buffers": len(plan.buffers),
        "naive_bytes": plan.naive_bytes,
        "lb_off_bytes": plan.lb_off,
        "lb_so_bytes": plan.lb_so,
        "nnabla_policy_bytes": nnabla.total,
        "nnabla_policy_objects": len(nnabla.buffer_sizes),
        "planning_seconds": round(plan.seconds, 4),
        "options": {"kind": plan.options.kind, "alignment": plan.options.alignment,
                    "aliases": plan.options.aliases, "inplace": plan.options.inplace,
                    "scheme": plan.options.scheme or "ir"},
    }
    if plan.arena is not None:
        out.update(arena_bytes=plan.arena.total, arena_lower_bound_bytes=plan.arena.lower_bound,
                   arena_method=plan.arena.method, arena_optimal=plan.arena.optimal)
    if plan.shared is not None:
        out.update(shared_objects_bytes=plan.shared.total, shared_objects=len(plan.shared.buffer_sizes),
                   shared_method=plan.shared.method, shared_optimal=plan.shared_optimal,
                   nnabla_policy_ratio=round(nnabla.total / plan.shared.total, 4) if plan.shared.total else 1.0)
    return out


def live_bytes_per_step(plan: MemoryPlan, steps: int) -> list[int]:
    """Sum of the live buffers at every step (its maximum is LB_off)."""
    diff = np.zeros(max(steps, 1) + 1, dtype=np.int64)
    for b in plan.buffers:
        diff[b.first] += b.size
        diff[b.last + 1] -= b.size
    return np.cumsum(diff[:steps]).tolist()  # type: ignore[no-any-return]


def layer_rows(model: Model, plan: MemoryPlan, sizer: Sizer) -> list[dict[str, Any]]:
    """One row per node: shapes in and out, its outputs' bytes, the live bytes while it runs,
    and where its first output is stored."""
    graph = model.graph
    live = live_bytes_per_step(plan, len(graph.nodes))
    rows = []
    for step, node in enumerate(graph.nodes):
        acts = [v for v in node.inputs if v is not None and not v.is_const]
        row: dict[str, Any] = {
            "name": node.name,
            "op": node.op,
            "input_shapes": [list(v.type.shape) for v in acts],
            "output_shapes": [list(v.type.shape) for v in node.outputs],
            "output_bytes": sum(sizer(v) for v in node.outputs),
            "parameter_bytes": sum(sizer(v) for v in node.inputs if v is not None and v.is_const),
            "live_bytes": live[step],
        }
        if node.outputs:
            buffer = plan.buffer_of[node.outputs[0].name]
            row["buffer"] = buffer
            if plan.arena is not None:
                row["offset"] = plan.arena.offsets[buffer]
            if plan.shared is not None:
                row["object"] = plan.shared.assignment[buffer]
        rows.append(row)
    return rows


def memory_section(model: Model, plan: MemoryPlan) -> dict[str, Any]:
    """Totals and layer table of a plan made for `model` as it is now."""
    sizer = scheme_sizer(plan.options.scheme)
    section = plan_totals(plan)
    section["parameter_bytes"] = sum(sizer(v) for v in model.graph.constants)
    section["layers"] = layer_rows(model, plan, sizer)
    return section


def stored_memory_section(model: Model) -> dict[str, Any] | None:
    """The report's `memory` section for the plan `plan-memory` stored (None without one)."""
    status = plan_status(model)
    if status == "absent":
        return None
    if status == "stale":
        return {"status": "stale", "note": "the graph changed after plan-memory; the plan is unusable"}
    return {"status": "current", **memory_section(model, model.products[MemoryPlan])}


def inspect_memory(model: Model, scheme: str = "", alignment: int = 16, time_budget: float = 1.0) -> dict[str, Any]:
    """What `qcc inspect --memory` reports: plans without sharing (every target can run them),
    then the bounds and plans when views alias and elementwise ops run in place."""
    base = PlanOptions(alignment=alignment, scheme=scheme, time_budget=time_budget)
    section = memory_section(model, plan_model(model, base))
    shared = plan_model(model, PlanOptions(alignment=alignment, aliases=True, inplace=True, scheme=scheme,
                                           time_budget=time_budget))
    keys = ("buffers", "naive_bytes", "lb_off_bytes", "lb_so_bytes", "arena_bytes", "shared_objects_bytes",
            "nnabla_policy_bytes")
    totals = plan_totals(shared)
    section["aliased"] = {key: totals[key] for key in keys}
    return section


def format_memory(section: dict[str, Any]) -> list[str]:
    """Text lines for the CLI: the layer table, then the totals."""
    rows = section["layers"]
    width = max([len(r["name"]) for r in rows] + [5])
    lines = [f"  {'layer':<{width}}  {'op':<13} {'shapes':<44} {'buffer bytes':>12} {'live bytes':>12}"]
    for r in rows:
        shapes = ", ".join("x".join(map(str, s)) for s in r["input_shapes"])
        shapes += " -> " + ", ".join("x".join(map(str, s)) for s in r["output_shapes"])
        lines.append(f"  {r['name']:<{width}}  {r['op']:<13} {shapes:<44} {r['output_bytes']:>12} {r['live_bytes']:>12}")

    def ratio(value: int, bound: int) -> str:
        return f"{value / bound:.4f}" if bound else "-"

    s = section
    opts = s["options"]
    lines += [
        f"memory totals (sizes: {opts['scheme']}; arena alignment {opts['alignment']}):",
        f"  parameters                        {s['parameter_bytes']:>12}",
        f"  activations without reuse         {s['naive_bytes']:>12}   ({s['buffers']} buffers)",
        f"  LB_off (peak live bytes)          {s['lb_off_bytes']:>12}",
        f"  LB_so (sum of positional maxima)  {s['lb_so_bytes']:>12}",
    ]
    if "arena_bytes" in s:
        proof = ", optimal" if s["arena_optimal"] else ""
        lines.append(f"  arena plan                        {s['arena_bytes']:>12}   "
                     f"({ratio(s['arena_bytes'], s['lb_off_bytes'])} x LB_off, {s['arena_method']}{proof})")
    if "shared_objects_bytes" in s:
        proof = ", proved optimal" if s["shared_optimal"] else ""
        lines.append(f"  shared-objects plan               {s['shared_objects_bytes']:>12}   "
                     f"({s['shared_objects']} objects, {ratio(s['shared_objects_bytes'], s['lb_so_bytes'])} x LB_so, "
                     f"{s['shared_method']}{proof})")
        lines.append(f"  nnabla's policy (shared objects)  {s['nnabla_policy_bytes']:>12}   "
                     f"({s['nnabla_policy_ratio']:.4f} x qcc)")
    if "aliased" in s:
        a = s["aliased"]
        lines.append(f"  with view aliases + in-place: LB_off {a['lb_off_bytes']}, arena {a['arena_bytes']}, "
                     f"LB_so {a['lb_so_bytes']}, shared objects {a['shared_objects_bytes']}, "
                     f"nnabla's policy {a['nnabla_policy_bytes']}")
    return lines
