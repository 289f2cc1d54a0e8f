"""onnxruntime.quantization's option names, accepted by `qcc.compile` where they mean the same.

| onnxruntime.quantization | qcc.compile | note |
|---|---|---|
| `per_channel=True/False` | `per_tensor=not per_channel` | weight scales per output channel |
| `calibrate_method=CalibrationMethod.MinMax` (or "MinMax", "Entropy", "Percentile") | `method="minmax"`, `"entropy"`, `"percentile"` | Distribution has no qcc equivalent (usage error) |
| `nodes_to_exclude=[names]` | the `exclude-nodes` pass: the node's outputs and constant inputs pinned FLOAT32 | as `--override NAME=FLOAT32` on each |
| `op_types_to_quantize=[types]` | the same exclusion for every node of another type | ONNX op types (Conv, Gemm, MatMul, ...) or qcc IR op names |

The qcc name and the onnxruntime name of one option together are a usage error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from qcc.errors import UsageError

METHODS = {"minmax": "minmax", "entropy": "entropy", "percentile": "percentile"}


def translate(options: dict[str, Any]) -> dict[str, Any]:
    """qcc's options from options that may use onnxruntime's names."""
    out = dict(options)
    if "per_channel" in out:
        if "per_tensor" in out:
            raise UsageError("per_channel= (onnxruntime's name) and per_tensor= say the same thing: give one")
        out["per_tensor"] = not bool(out.pop("per_channel"))
    if "calibrate_method" in out:
        if out.get("method") is not None:
            raise UsageError("calibrate_method= (onnxruntime's name) and method= say the same thing: give one")
        given = out.pop("calibrate_method")
        text = str(getattr(given, "name", given)).lower()
        if text not in METHODS:
            raise UsageError(f"calibrate_method={given!r}: qcc has MinMax, Entropy and Percentile "
                             "(and method='mse'); onnxruntime's Distribution has no equivalent")
        out["method"] = METHODS[text]
    if out.get("nodes_to_exclude") is not None:
        out["nodes_to_exclude"] = tuple(out["nodes_to_exclude"])
    if out.get("op_types_to_quantize") is not None:
        out["op_types_to_quantize"] = tuple(out["op_types_to_quantize"])
    return out


def exclusion_pass(nodes: Iterable[str], op_types: Iterable[str] | None) -> Any:
    """The `exclude-nodes` pass for nodes_to_exclude / op_types_to_quantize (run after fold-bn)."""
    from qcc.passes.exclude_nodes import ExcludeNodes

    return ExcludeNodes(nodes=tuple(nodes), only_ops=tuple(sorted(ir_ops(op_types))) if op_types is not None else ())


def ir_ops(op_types: Iterable[str]) -> set[str]:
    """The IR ops an ONNX op type imports as (qcc.frontends.onnx's table), or IR names as given."""
    from qcc.frontends.onnx import EMITS

    allowed: set[str] = set()
    for t in op_types:
        allowed.add(t)
        allowed.update(EMITS.get(t, ()))
    return allowed
