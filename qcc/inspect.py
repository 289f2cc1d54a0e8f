"""`qcc inspect`: a per-layer table of any readable model."""

from __future__ import annotations

from typing import Any

from qcc.errors import UsageError
from qcc.ir.core import Model
from qcc.plan.sizing import Sizer, ir_size, scheme_sizer


def layer_table(model: Model, sizer: Sizer = ir_size) -> list[dict[str, Any]]:
    rows = []
    for node in model.graph.nodes:
        params = sum(sizer(v) for v in node.inputs if v is not None and v.is_const)
        rows.append({
            "name": node.name,
            "op": node.op,
            "output_shapes": [list(v.type.shape) for v in node.outputs],
            "output_bytes": sum(sizer(v) for v in node.outputs),
            "parameter_bytes": params,
        })
    return rows


def inspect_model(model: Model, as_json: bool = False, memory: bool = False, quantize: str = "none",
                  **options: Any) -> dict[str, Any]:
    """Describe a model; `quantize` sizes float tensors as that scheme stores them ("none": as
    declared), `memory` adds the memory plans, bounds and per-layer live bytes."""
    sizer = scheme_sizer("" if quantize == "none" else quantize)
    rows = layer_table(model, sizer)
    graph = model.graph
    result: dict[str, Any] = {
        "name": graph.name,
        "inputs": [{"name": v.name, "shape": list(v.type.shape), "dtype": v.type.dtype} for v in graph.inputs],
        "outputs": [{"name": v.name, "shape": list(v.type.shape), "dtype": v.type.dtype} for v in graph.outputs],
        "layers": rows,
        "parameter_bytes": sum(sizer(v) for v in graph.constants),
        "sizes": quantize,
    }
    if memory:
        from qcc.plan.summary import format_memory, inspect_memory

        result.update(inspect_memory(model, scheme="" if quantize == "none" else quantize))
    if not as_json:
        print(f"model {graph.name}: {len(graph.nodes)} nodes, {len(graph.constants)} parameters "
              f"({result['parameter_bytes']} bytes)")
        for v in graph.inputs:
            print(f"  input  {v.name}: {v.type}")
        for v in graph.outputs:
            print(f"  output {v.name}: {v.type}")
        if memory:
            print("\n".join(format_memory(result)))
            return result
        width = max([len(r["name"]) for r in rows] + [4])
        print(f"  {'name':<{width}}  {'op':<14} {'output shape':<22} {'out bytes':>12} {'param bytes':>12}")
        for r in rows:
            shape = "x".join(str(d) for d in r["output_shapes"][0]) if r["output_shapes"] else ""
            print(f"  {r['name']:<{width}}  {r['op']:<14} {shape:<22} {r['output_bytes']:>12} {r['parameter_bytes']:>12}")
    return result


def inspect_path(path: str, memory: bool = False, quantize: str = "none", as_json: bool = False,
                 **load_options: Any) -> dict[str, Any]:
    from qcc.driver import load

    if path.lower().endswith(".nnb"):  # a compiled file: decoded and checked, not imported
        from qcc.backends.nnb.inspect import inspect_nnb
        from qcc.flags import LOAD_FLAGS

        given = [LOAD_FLAGS.get(k, k) for k, v in load_options.items() if v is not None]
        if given:
            raise UsageError(f"{given[0]} applies to a model qcc imports; {path} is a compiled .nnb, decoded as written")

        return inspect_nnb(path, as_json=as_json)
    model = load(path, **{k: v for k, v in load_options.items() if v is not None})
    return inspect_model(model, as_json=as_json, memory=memory, quantize=quantize)
