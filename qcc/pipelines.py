"""Default pipelines per quantization scheme and target (docs/passes.md, "Default pipelines").

| scheme | pipeline |
|---|---|
| none | (empty) |
| int8, uint8 | fold-bn{standalone=conv unless --per-tensor}, [apply-overrides], calibrate, quantize-affine{dtype, per_channel, method} |
| fixed8, fixed16, fixed8-16 | fold-bn, [apply-overrides], calibrate, assign-fixed-point{bits, weight_bits, method, target} |
| binary-weight, binary-connect | [apply-overrides], binarize-weights{mode} |

apply-overrides is added when --override is given (--settings is applied by the driver at load). Fixed point follows nnb's rules
(`target=nnb`) for the nnb and c targets and for ONNX outputs too unless the target is onnx-qdq
(which can express any position): a model compiled to ONNX first and to .nnb later then gets
the same positions. --method defaults to minmax, except fixed8, where the histogram-MSE
position is measurably better on nnb's truncating kernels (docs/passes.md).
"""

from __future__ import annotations

from typing import Any

from qcc.errors import UnsupportedError, UsageError

CALIBRATED = ("int8", "uint8", "fixed8", "fixed16", "fixed8-16")
FIXED = {"fixed8": (8, 8), "fixed16": (16, 16), "fixed8-16": (16, 8)}
GENERIC_FIXED_TARGETS = ("onnx-qdq",)


def default_method(scheme: str) -> str:
    return "mse" if scheme == "fixed8" else "minmax"


# Targets whose runtime memory qcc plans: the plan is the last pass, so it sees final types.
MEMORY_PLAN = {
    "c": "plan-memory{kind=arena,aliases=true,inplace=true}",
    "nnb": "plan-memory{kind=shared}",
}


def default_pipeline(scheme: str, target: str, opts: Any) -> str:
    """The pipeline spec for `--quantize scheme` writing to `target` (opts: CompileOptions)."""
    passes = [p for p in (_quantization_pipeline(scheme, target, opts), MEMORY_PLAN.get(target, "")) if p]
    return ",".join(passes)


def _quantization_pipeline(scheme: str, target: str, opts: Any) -> str:
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
        rules = "generic" if target in GENERIC_FIXED_TARGETS else "nnb"
        return (f"fold-bn,{overrides}calibrate,assign-fixed-point{{bits={bits},weight_bits={weight_bits},"
                f"method={method},target={rules}}}")
    if scheme in ("binary-weight", "binary-connect"):
        return f"{overrides}binarize-weights{{mode={scheme}}}"
    raise UnsupportedError(f"--quantize {scheme}: this qcc has no pipeline for it (target {target!r})")
