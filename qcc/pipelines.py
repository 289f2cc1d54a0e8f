"""Default pipelines per quantization scheme, and the passes a target adds (docs/passes.md).

| scheme | pipeline |
|---|---|
| none | (empty) |
| int8, uint8 | fold-bn{standalone=conv unless --per-tensor}, [apply-overrides], calibrate, quantize-affine{dtype, per_channel, method} |
| fixed8, fixed16, fixed8-16 | fold-bn, [apply-overrides], calibrate, assign-fixed-point{bits, weight_bits, method} |
| binary-weight, binary-connect | [apply-overrides], binarize-weights{mode} |

The scheme's pipeline does not depend on the target: what a target requires (nnabla-c-runtime's
fixed-point rules for .nnb and C, integer kernels for C's affine mode) reaches the passes through
`PassContext.target`. The target then adds its own passes (`with_target_passes`): its
legalization, last among the passes that change annotations (before --eval, so the evaluated
model is the written one), and, for the default pipeline, the memory plan its runtime uses.
apply-overrides is added when --override is given (--settings is applied by the driver at
load). --method defaults to minmax, except fixed8, where the histogram-MSE position is
measurably better on truncating kernels (docs/passes.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qcc.errors import UnsupportedError, UsageError

CALIBRATED = ("int8", "uint8", "fixed8", "fixed16", "fixed8-16")
FIXED = {"fixed8": (8, 8), "fixed16": (16, 16), "fixed8-16": (16, 8)}


def default_method(scheme: str) -> str:
    return "mse" if scheme == "fixed8" else "minmax"


def default_pipeline(scheme: str, opts: Any) -> str:
    """The pipeline spec for `--quantize scheme` (opts: CompileOptions-like)."""
    if scheme == "none":
        return ""
    if scheme in CALIBRATED and not getattr(opts, "calib", None):
        raise UsageError(f"--quantize {scheme} needs calibration data: add --calib DATA.npz (arrays keyed by "
                         "model input name, first axis = samples)")
    overrides = "apply-overrides," if getattr(opts, "overrides", ()) else ""
    method = getattr(opts, "method", None) or default_method(scheme)
    if scheme in ("int8", "uint8"):
        per_channel = "false" if getattr(opts, "per_tensor", False) else "true"
        fold = "fold-bn" if getattr(opts, "per_tensor", False) else "fold-bn{standalone=conv}"
        return (f"{fold},{overrides}calibrate,"
                f"quantize-affine{{dtype={scheme},per_channel={per_channel},method={method}}}")
    if scheme in FIXED:
        bits, weight_bits = FIXED[scheme]
        return (f"fold-bn,{overrides}calibrate,assign-fixed-point{{bits={bits},weight_bits={weight_bits},"
                f"method={method}}}")
    if scheme in ("binary-weight", "binary-connect"):
        return f"{overrides}binarize-weights{{mode={scheme}}}"
    raise UnsupportedError(f"--quantize {scheme}: this qcc has no pipeline for it")


def with_target_passes(pipeline: Sequence[Any], backend: Any, options: Any, memory_plan: bool) -> list[Any]:
    """`pipeline` plus the target's legalization (before any late pass: memory planning and
    reordering see final types) and, with `memory_plan`, the plan the target's runtime uses."""
    from qcc.pm.manager import build_passes

    passes = list(pipeline)
    names = {p.name for p in passes}
    legal = [p for p in backend.legalization(options) if p.name not in names]
    late = next((i for i, p in enumerate(passes) if getattr(p, "late", False)), len(passes))
    passes[late:late] = legal
    plan = backend.memory_plan(options) if memory_plan else None
    if plan and not any(getattr(p, "late", False) for p in passes):
        passes += build_passes(plan)
    return passes
