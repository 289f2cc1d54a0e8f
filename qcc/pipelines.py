"""Default pipelines per quantization scheme, and the passes a target adds (docs/passes.md).

| scheme | pipeline |
|---|---|
| none | (empty) |
| int8, uint8, int4, uint4 | fold-bn{standalone=conv unless --per-tensor}, [apply-overrides], [equalize if --per-tensor], calibrate{pre_bias=false, [reference=16]}, quantize-affine{dtype, [weight_dtype int4/uint4], per_channel, method}, [learned-rounding], [bias-correct], [accuracy-control] |
| fixed8, fixed16, fixed8-16, fixed4 | fold-bn, [apply-overrides], [equalize], calibrate{[reference=16]}, assign-fixed-point{bits, weight_bits, method}, [learned-rounding], [bias-correct], [accuracy-control], check-fixed-point |
| binary-weight, binary-connect | [apply-overrides], binarize-weights{mode} |

The scheme's pipeline does not depend on the target: what a target requires (nnabla-c-runtime's
fixed-point rules for .nnb and C, integer kernels for C's affine mode) reaches the passes through
`PassContext.target`. The target then adds its own passes (`with_target_passes`): its
legalization, last among the passes that change annotations (before --eval, so the evaluated
model is the written one), and, for the default pipeline, the memory plan its runtime uses.
The affine pipelines calibrate with pre_bias=false: the statistics of a Conv's sum before its
bias, which calibrate keeps when the target's kernels accumulate that way (nnabla-c-runtime's,
for .nnb and C), are read by assign-fixed-point alone (17% of an int8 calibration's CPU for C, digits).
calibrate keeps bias-correct's float reference (reference=16) when bias-correct follows and
learned-rounding does not rewrite the weights in between.
apply-overrides is added when --override is given (--settings is applied by the driver at
load). --method defaults to auto (per tensor, the least-error range or position, minmax where
nothing needs clipping). equalize runs where one scale or position covers every channel of a
weight (per-tensor and fixed point) unless --no-equalize; bias-correct runs unless
--no-bias-correct; learned-rounding with --rounding learned, the default for the 4-bit weights
of int4/uint4 (W4A8) and fixed4; accuracy-control with --max-accuracy-drop. check-fixed-point (a warning
line when the fixed-point outputs are far from float) ends the fixed-point pipelines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qcc.errors import UnsupportedError, UsageError
from qcc.quant.biascorr import SAMPLES

CALIBRATED = ("int8", "uint8", "int4", "uint4", "fixed8", "fixed16", "fixed8-16", "fixed4")
AFFINE = {"int8": ("int8", None), "uint8": ("uint8", None), "int4": ("int8", "int4"), "uint4": ("uint8", "uint4")}
"""affine scheme -> (activation dtype, weight dtype: None for quantize-affine's default, int8, as
ONNX Runtime's quantize_static stores weights next to uint8 activations)"""
LEARNED_BY_DEFAULT = ("int4", "uint4", "fixed4")
"""4-bit weights need learned rounding (Nagel et al. 2020: ResNet18 W4A8 23.99% nearest, 68.71% learned)."""
FIXED = {"fixed8": (8, 8), "fixed16": (16, 16), "fixed8-16": (16, 8), "fixed4": (8, 4)}
"""fixed-point scheme -> (activation bits, weight bits); fixed4's 4-bit weights (-8..7 * 2**-frac)
are stored in the runtime's 8-bit type where it has no 4-bit one (.nnb), packed two a byte in C."""


def default_method(scheme: str) -> str:
    return "auto"


def default_pipeline(scheme: str, opts: Any) -> str:
    """The pipeline spec for `--quantize scheme` (opts: CompileOptions-like)."""
    if scheme == "none":
        _refuse_ptq_options(scheme, opts)
        return ""
    if scheme in CALIBRATED and not getattr(opts, "calib", None):
        raise UsageError(f"--quantize {scheme} needs calibration data: add --calib DATA.npz (arrays keyed by "
                         "model input name, first axis = samples)")
    overrides = "apply-overrides," if getattr(opts, "overrides", ()) else ""
    method = getattr(opts, "method", None) or default_method(scheme)
    equalize = "equalize," if getattr(opts, "equalize", True) else ""
    # bias-correct's float reference: the outputs calibrate computes on the same first samples
    # (not after learned-rounding, which rewrites the weights in between)
    kept = getattr(opts, "bias_correct", True) and not _learned(scheme, opts)
    reference = [f"reference={SAMPLES}"] if kept else []
    if scheme in AFFINE:
        act, weight = AFFINE[scheme]
        per_tensor = getattr(opts, "per_tensor", False)
        fold = "fold-bn" if per_tensor else "fold-bn{standalone=conv}"
        weights = f"weight_dtype={weight}," if weight else ""
        calibrate = _spec("calibrate", ["pre_bias=false", *reference])
        return (f"{fold},{overrides}{equalize if per_tensor else ''}{calibrate},"
                f"quantize-affine{{dtype={act},{weights}per_channel={'false' if per_tensor else 'true'},"
                f"method={method}}}" + _refinements(scheme, opts))
    if scheme in FIXED:
        bits, weight_bits = FIXED[scheme]
        return (f"fold-bn,{overrides}{equalize}{_spec('calibrate', reference)},"
                f"assign-fixed-point{{bits={bits},weight_bits={weight_bits},"
                f"method={method}}}" + _refinements(scheme, opts) + ",check-fixed-point")
    if scheme in ("binary-weight", "binary-connect"):
        _refuse_ptq_options(scheme, opts)
        return f"{overrides}binarize-weights{{mode={scheme}}}"
    raise UnsupportedError(f"--quantize {scheme}: this qcc has no pipeline for it")


def _learned(scheme: str, opts: Any) -> bool:
    return (getattr(opts, "rounding", None) or ("learned" if scheme in LEARNED_BY_DEFAULT else "nearest")) == "learned"


def _spec(name: str, options: list[str]) -> str:
    return f"{name}{{{','.join(options)}}}" if options else name


def _refinements(scheme: str, opts: Any) -> str:
    """learned-rounding, bias-correct and accuracy-control, as the options ask."""
    parts = ["learned-rounding"] if _learned(scheme, opts) else []
    if getattr(opts, "bias_correct", True):
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
