"""Default pipelines per quantization scheme and target (docs/passes.md, "Default pipelines").

| scheme | pipeline |
|---|---|
| none | (empty) |
| int8, uint8, int4, uint4 | fold-bn{standalone=conv unless --per-tensor}, [apply-overrides], [equalize if --per-tensor], calibrate, quantize-affine{dtype, weight_dtype, per_channel, method}, [learned-rounding], [bias-correct], [accuracy-control] |
| fixed8, fixed16, fixed8-16 | fold-bn, [apply-overrides], [equalize], calibrate, assign-fixed-point{bits, weight_bits, method, target}, [learned-rounding], [bias-correct], [accuracy-control] |
| binary-weight, binary-connect | [apply-overrides], binarize-weights{mode} |

apply-overrides is added when --override is given (--settings is applied by the driver at load). Fixed point follows nnb's rules
(`target=nnb`) for the nnb and c targets and for ONNX outputs too unless the target is onnx-qdq
(which can express any position): a model compiled to ONNX first and to .nnb later then gets
the same positions. --method defaults to auto (per tensor, the least-error range or position,
minmax where nothing needs clipping). equalize runs where one scale or position covers every
channel of a weight (per-tensor and fixed point) unless --no-equalize; bias-correct runs unless
--no-bias-correct; learned-rounding with --rounding learned, the default for the 4-bit weights
of int4/uint4 (W4A8); accuracy-control with --max-accuracy-drop.
"""

from __future__ import annotations

from typing import Any

from qcc.errors import UnsupportedError, UsageError

CALIBRATED = ("int8", "uint8", "int4", "uint4", "fixed8", "fixed16", "fixed8-16")
AFFINE = {"int8": ("int8", "int8"), "uint8": ("uint8", "uint8"), "int4": ("int8", "int4"), "uint4": ("uint8", "uint4")}
"""affine scheme -> (activation dtype, weight dtype)"""
LEARNED_BY_DEFAULT = ("int4", "uint4")
"""4-bit weights need learned rounding (Nagel et al. 2020: ResNet18 W4A8 23.99% nearest, 68.71% learned)."""
FIXED = {"fixed8": (8, 8), "fixed16": (16, 16), "fixed8-16": (16, 8)}
GENERIC_FIXED_TARGETS = ("onnx-qdq",)
FLOAT_TARGETS = ("onnx",)
"""Targets that compute in float whatever the annotations: parameters stay the float model's
(no bias-correct or learned-rounding, which only make sense next to the quantization they fix)."""


def default_method(scheme: str) -> str:
    return "auto"


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
        _refuse_ptq_options(scheme, opts)
        return ""
    if scheme in CALIBRATED and not getattr(opts, "calib", None):
        raise UsageError(f"--quantize {scheme} needs calibration data: add --calib DATA.npz (arrays keyed by "
                         "model input name, first axis = samples)")
    overrides = "apply-overrides," if getattr(opts, "overrides", ()) else ""
    method = getattr(opts, "method", None) or default_method(scheme)
    equalize = "equalize," if getattr(opts, "equalize", True) else ""
    if scheme in AFFINE:
        act, weight = AFFINE[scheme]
        per_tensor = getattr(opts, "per_tensor", False)
        fold = "fold-bn" if per_tensor else "fold-bn{standalone=conv}"
        return (f"{fold},{overrides}{equalize if per_tensor else ''}calibrate,"
                f"quantize-affine{{dtype={act},weight_dtype={weight},per_channel={'false' if per_tensor else 'true'},"
                f"method={method}}}" + _refinements(scheme, target, opts))
    if scheme in FIXED:
        bits, weight_bits = FIXED[scheme]
        rules = "generic" if target in GENERIC_FIXED_TARGETS else "nnb"
        return (f"fold-bn,{overrides}{equalize}calibrate,assign-fixed-point{{bits={bits},weight_bits={weight_bits},"
                f"method={method},target={rules}}}" + _refinements(scheme, target, opts))
    if scheme in ("binary-weight", "binary-connect"):
        _refuse_ptq_options(scheme, opts)
        return f"{overrides}binarize-weights{{mode={scheme}}}"
    raise UnsupportedError(f"--quantize {scheme}: this qcc has no pipeline for it (target {target!r})")


def _refinements(scheme: str, target: str, opts: Any) -> str:
    """learned-rounding, bias-correct and accuracy-control, as the options ask."""
    rounding = getattr(opts, "rounding", None) or ("learned" if scheme in LEARNED_BY_DEFAULT else "nearest")
    parts = ["learned-rounding"] if rounding == "learned" and target not in FLOAT_TARGETS else []
    if getattr(opts, "bias_correct", True) and target not in FLOAT_TARGETS:
        parts.append("bias-correct")
    drop = getattr(opts, "max_accuracy_drop", None)
    if drop is not None:
        if not (getattr(opts, "eval", None) or getattr(opts, "metric", None)):
            raise UsageError("--max-accuracy-drop needs labelled evaluation data: add --eval DATA.npz (with a "
                             "'labels' array), or pass metric=... to qcc.compile")
        parts.append(f"accuracy-control{{max_drop={float(drop)!r}}}")
    return "".join("," + p for p in parts)


def _refuse_ptq_options(scheme: str, opts: Any) -> None:
    if getattr(opts, "rounding", None) == "learned":
        raise UsageError(f"--rounding learned: --quantize {scheme} has no quantized weights to round")
    if getattr(opts, "max_accuracy_drop", None) is not None:
        raise UsageError(f"--max-accuracy-drop: --quantize {scheme} has no calibrated quantization to tune")
