"""Every compile flag takes effect or is a usage error naming the conflict (issue 16).

Checked before any work: a flag that the chosen pipeline, input or target would ignore is
refused in one line, never silently dropped.
"""

from __future__ import annotations

import os
from typing import Any

from qcc.errors import UsageError
from qcc.options import choice_error

LOAD_FLAGS = {"network": "--network", "executor": "--executor", "batch_size": "--batch-size",
              "input_shapes": "--input-shape"}
"""Loading options of `qcc compile` and their flags (a frontend lists what it reads in `load_options`)."""


def check_choices(opts: Any, schemes: tuple[str, ...], methods: tuple[str, ...], roundings: tuple[str, ...]) -> None:
    if opts.quantize not in schemes:
        raise choice_error("--quantize", opts.quantize, schemes)
    if opts.method is not None and opts.method not in methods:
        raise choice_error("--method", opts.method, methods)
    if opts.rounding is not None and opts.rounding not in roundings:
        raise choice_error("--rounding", opts.rounding, roundings)
    if opts.max_accuracy_drop is not None and not 0 <= opts.max_accuracy_drop < 1:
        raise UsageError(f"--max-accuracy-drop {opts.max_accuracy_drop}: a fraction in [0, 1) (0.01 = one point)")


def check_pipeline_flags(opts: Any, explicit_passes: bool) -> None:
    """--quantize, --calib, --method and --per-tensor act through the scheme's default pipeline."""
    if getattr(opts, "batch_axes", None) and opts.calib is None and opts.eval is None:
        raise UsageError("--batch-axis says where --calib/--eval data holds an input's samples: it has no effect "
                         "without --calib DATA or --eval DATA")
    for flag, given in (("--workers", getattr(opts, "workers", 1) != 1), ("--cluster", getattr(opts, "cluster", None))):
        if given and opts.calib is None:
            raise UsageError(f"{flag} shards calibration: it has no effect without --calib DATA")
    if explicit_passes:
        if opts.quantize != "none":
            raise UsageError(f"--passes replaces the pipeline of --quantize {opts.quantize}: give one of them "
                             "(the scheme's pipeline is listed in docs/passes.md, to copy into --passes)")
        for flag, given in _scheme_flags(opts):
            if given:
                raise UsageError(f"{flag} sets an option of the --quantize pipeline; with --passes, set it in "
                                 "SPEC (e.g. quantize-affine{method=entropy,per_channel=false})")
        return
    if opts.quantize == "none":
        for flag, given in (("--calib", opts.calib), *_scheme_flags(opts)):
            if given:
                raise UsageError(f"{flag} has no effect without --quantize SCHEME (or --passes with calibrate): "
                                 "the model would be written in float")


def _scheme_flags(opts: Any) -> tuple[tuple[str, bool], ...]:
    """The flags that set options of the --quantize pipeline, and whether each was given."""
    return (("--method", opts.method is not None), ("--per-tensor", bool(opts.per_tensor)),
            ("--no-equalize", not opts.equalize), ("--no-bias-correct", not opts.bias_correct),
            ("--rounding", opts.rounding is not None), ("--max-accuracy-drop", opts.max_accuracy_drop is not None))


def check_load_flags(frontend: Any, path: str, options: dict[str, Any]) -> None:
    """A loading flag the model's frontend does not read (e.g. --network on an .onnx) is refused."""
    accepted = getattr(frontend, "load_options", None)
    if accepted is None:  # a plugin frontend that does not say: it gets what it is given
        return
    for key, value in options.items():
        if value is not None and key not in accepted:
            flag = LOAD_FLAGS.get(key, key)
            raise UsageError(f"{flag} applies to {_readers_of(key)} inputs; {path} is read by frontend "
                             f"{getattr(frontend, 'name', '?')!r}, which has no such option")


def _readers_of(key: str) -> str:
    from qcc.plugins import registry

    reg = registry()
    exts = [e for n in reg.names("frontend") for e in reg.frontend(n).extensions
            if key in (getattr(reg.frontend(n), "load_options", None) or ())]
    return "/".join(exts) or "no"


def check_output_extension(out: str, backend: Any, explicit: bool) -> None:
    """`-o o.nnb --target onnx-qdq` would write ONNX bytes into a .nnb file: refused."""
    if not explicit:
        return
    from qcc.plugins import backend_for

    written = tuple(getattr(backend, "file_extensions", None) or backend.extensions)
    ext = os.path.splitext(out.rstrip("/"))[1]
    if ext and ext.lower() in written:  # before asking every target whose extension it is (imports them all)
        return
    try:
        owner = backend_for(out)
    except UsageError:  # no target claims the extension: the user's name for the file
        return
    if getattr(owner, "name", None) == backend.name:
        return
    if not ext and not backend.writes_directory:  # a file named without an extension
        return
    if backend.writes_directory:
        raise UsageError(f"-o {out}: target {backend.name!r} writes a directory, and {ext or out!r} names a file "
                         f"of target {owner.name!r}")
    wants = ", ".join(written) or "(any)"
    raise UsageError(f"-o {out}: {ext or 'a directory'} is the output of target {owner.name!r}; target "
                     f"{backend.name!r} writes {wants}")
