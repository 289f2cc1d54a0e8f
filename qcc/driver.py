"""The compile driver behind both `qcc compile` and `qcc.compile(...)`.

load (frontend) -> pipeline (explicit spec or the scheme's default) -> ordering checks against the
backend's requirements -> run with verification -> write atomically -> report.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from qcc.errors import (
    DECODE_ERRORS,
    InternalError,
    InvalidInputError,
    QccError,
    UnsupportedError,
    UsageError,
    naming,
)
from qcc.ir.core import Model
from qcc.outputs import check_outputs
from qcc.pipelines import default_pipeline, with_target_passes
from qcc.pm.base import Pass, PassContext
from qcc.pm.instruments import DumpIR, Instrument, PrintAfterAll, TimePasses
from qcc.pm.manager import PassManager, build_passes, check_order
from qcc.pm.parallel import Workers
from qcc.pm.spec import PassSpec
from qcc.sim.heap import adapted_heap
from qcc.target import Backend, as_backend

SCHEMES = ("none", "int8", "uint8", "int4", "uint4", "fixed8", "fixed16", "fixed8-16", "fixed4", "binary-weight",
           "binary-connect")
METHODS = ("auto", "minmax", "percentile", "entropy", "mse")
ROUNDINGS = ("nearest", "learned")


@attrs.define
class CompileOptions:
    target: str | None = None
    quantize: str = "none"
    calib: Any = None  # a .npz path, a dict of arrays, an iterable of batches, a callable returning one
    method: str | None = None  # None: the scheme's default (qcc.pipelines.default_method)
    per_tensor: bool = False
    settings: str | None = None
    overrides: Sequence[str] = ()
    passes: str | None = None
    eval: Any = None  # as calib
    report: str | None = None
    network: str | None = None
    executor: str | None = None
    batch_size: int | None = None
    input_shapes: Any = None  # {name: dims} / one shape / ["NAME=D0,D1", ...] (qcc.frontends.input_shapes)
    batch_axes: Any = None  # {name: axis} / ["NAME=AXIS", ...]: where the data holds each input's samples
    target_options: dict[str, Any] | None = None
    nnb_version: int | None = None  # legacy spellings of target nnb's options
    api: int | None = None
    plan: str | None = None
    time_passes: bool = False
    print_after_all: bool = False
    dump_ir: str | None = None
    verify_each: bool = True
    force: bool = False  # let a directory output replace a directory qcc did not write (qcc.outputs)
    equalize: bool = True  # cross-layer equalization where the scheme has per-tensor weight scales
    bias_correct: bool = True
    rounding: str | None = None  # None: the scheme's default (learned for int4/uint4/fixed4)
    max_accuracy_drop: float | None = None
    metric: Callable[..., float] | None = None  # API only: metric(predict) -> score, for max_accuracy_drop
    progress: bool | None = None  # progress bars on stderr (None: when it is a terminal)
    nodes_to_exclude: tuple[str, ...] = ()  # onnxruntime's names (qcc.ort_options): nodes left in float
    op_types_to_quantize: tuple[str, ...] | None = None
    example_inputs: Any = None  # for an in-memory torch.nn.Module
    plots: str | None = None  # with eval: PNG plots into this directory (qcc.debug_plots)
    workers: int = 1  # local processes that share calibration (qcc.pm.parallel)
    cluster: str | None = None  # a Dask scheduler address that runs them instead


def load(path: str | os.PathLike[str] | Any, frontend: str | None = None, **options: Any) -> Model:
    """Load a model file (by extension) or an in-memory framework model."""
    from qcc.flags import check_load_flags
    from qcc.plugins import frontend_for, registry

    if not isinstance(path, (str, os.PathLike)):
        for name in registry().names("frontend"):
            fe = registry().frontend(name)
            accepts = getattr(fe, "accepts", None)
            if accepts is not None and accepts(path):
                return fe.load_object(path, **options)  # type: ignore[no-any-return]
        raise UsageError(f"no frontend accepts an in-memory {type(path).__name__}")
    text = os.fspath(path)
    if not Path(text).exists():
        raise UsageError(f"{text}: no such file")
    fe = frontend_for(text, frontend)
    check_load_flags(fe, text, options)
    clean = {k: v for k, v in options.items() if v is not None}
    try:
        return fe.load(text, **clean)  # type: ignore[no-any-return]
    except (InvalidInputError, UnsupportedError, InternalError) as exc:
        raise naming(exc, text) from exc.__cause__
    except QccError:
        raise
    except DECODE_ERRORS as exc:  # what corrupt bytes raise in any reader, named by file here
        raise InvalidInputError(f"{text}: not a readable {fe.name} model: {type(exc).__name__}: "
                                f"{str(exc)[:300]}") from None


def compile(
    model: str | os.PathLike[str] | Model | Any,
    output: str | os.PathLike[str],
    target: str | None = None,
    passes: str | Sequence[Pass | PassSpec] | None = None,
    instruments: Sequence[Instrument] = (),
    **options: Any,
) -> tuple[Model, dict[str, Any]]:
    """Compile like `qcc compile`; returns the compiled model and the report dictionary."""
    from qcc.ort_options import translate

    options = translate(options)
    try:
        with adapted_heap():  # runs of the model allocate every activation anew (qcc.sim.heap)
            return _compile(model, output, target, passes, instruments, **options)
    except (InvalidInputError, UnsupportedError, InternalError) as exc:
        # about the model's content: name the model unless the message names one of the files involved
        files = [os.fspath(options[k]) for k in ("calib", "settings", "eval", "report")
                 if isinstance(options.get(k), (str, os.PathLike))]
        source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else ""
        raise (naming(exc, source, os.fspath(output), *files) if source else exc) from exc.__cause__


def _compile(
    model: str | os.PathLike[str] | Model | Any,
    output: str | os.PathLike[str],
    target: str | None,
    passes: str | Sequence[Pass | PassSpec] | None,
    instruments: Sequence[Instrument],
    **options: Any,
) -> tuple[Model, dict[str, Any]]:
    from qcc.flags import check_choices, check_output_extension, check_pipeline_flags

    opts = CompileOptions(target=target, passes=passes if isinstance(passes, str) else None, **options)
    check_choices(opts, SCHEMES, METHODS, ROUNDINGS)
    check_pipeline_flags(opts, passes is not None)
    if opts.batch_size is not None and (isinstance(opts.batch_size, bool) or opts.batch_size < 1):
        raise UsageError(f"--batch-size {opts.batch_size}: must be a positive number of samples")
    out = os.fspath(output)
    backend, target_opts = resolve_target(out, opts)
    check_output_extension(out, backend, bool(opts.target))
    constraints = backend.constraints(target_opts)
    outputs = check_outputs(out, backend, {"model": model, "calibration data": opts.calib, "evaluation data": opts.eval,
                                           "settings file": opts.settings}, opts.report, opts.dump_ir, opts.force,
                            target_opts, plots=opts.plots)
    from qcc.progress import progress_bar

    progress = sys.stderr.isatty() if opts.progress is None else opts.progress
    workers = Workers(opts.workers, opts.cluster)
    if opts.calib is not None:  # calibration is sharded: the cluster's client connects while the model loads
        workers.connect_soon()
    if isinstance(model, Model):
        if opts.input_shapes:
            raise UsageError("input_shapes binds the inputs of a model qcc loads; this one is already a qcc Model")
        loaded = model
    else:  # a bar without a total: torch.export of a large module takes a while
        with progress_bar(1, "load", progress and not isinstance(model, Model), unit="model") as bar:
            if isinstance(model, (str, os.PathLike)):
                loaded = load(model, network=opts.network, executor=opts.executor, batch_size=opts.batch_size,
                              input_shapes=opts.input_shapes)
            else:  # an in-memory framework model (a torch.nn.Module with example_inputs=...)
                loaded = load(model, example_inputs=opts.example_inputs, batch_size=opts.batch_size,
                              input_shapes=opts.input_shapes)
            if bar:
                bar(1)
    if opts.batch_axes:
        from qcc.ir.samples import name_batch_axes, parse_batch_axes

        axes = opts.batch_axes
        name_batch_axes(loaded, parse_batch_axes(axes) if isinstance(axes, (list, tuple)) else dict(axes))
    if opts.settings:
        from qcc.formats.settings_yaml import apply_settings_file

        apply_settings_file(loaded, opts.settings)
    if passes is not None and not isinstance(passes, str):
        pipeline = build_passes(passes)
    elif opts.passes is not None:
        pipeline = build_passes(opts.passes)
    else:
        pipeline = build_passes(default_pipeline(opts.quantize, opts))
    explicit = passes is not None or opts.passes is not None
    if opts.nodes_to_exclude or opts.op_types_to_quantize is not None:
        from qcc.ort_options import exclusion_pass

        if opts.quantize == "none":
            raise UsageError("nodes_to_exclude= / op_types_to_quantize= have no effect without quantize=SCHEME")
        after_folding = 1 if pipeline and pipeline[0].name == "fold-bn" else 0  # node names survive folding
        pipeline.insert(after_folding, exclusion_pass(opts.nodes_to_exclude, opts.op_types_to_quantize))
    pipeline = with_target_passes(pipeline, backend, target_opts, memory_plan=not explicit)
    check_order(pipeline, loaded.passes_run, {f"target {backend.name!r}": tuple(backend.requires)})
    ctx = PassContext(target=constraints, overrides=tuple(opts.overrides), progress=progress,
                      metric=opts.metric, workers=workers)
    input_names = [v.name for v in loaded.graph.inputs]
    if opts.calib is not None:
        from qcc.data import open_data

        ctx.calib_data, ctx.calib_name = open_data(opts.calib, "calibration data", input_names)
    eval_data, eval_name = None, ""
    if opts.eval is not None:
        from qcc.data import open_data
        from qcc.evaluation import check_eval_data

        eval_data, eval_name = open_data(opts.eval, "evaluation data", input_names)
        check_eval_data(loaded, eval_data, eval_name)  # bad --eval data leaves no output behind
        ctx.eval_data, ctx.eval_name = eval_data, eval_name  # for a pass that tunes on accuracy
    insts: list[Instrument] = list(instruments)
    timer = TimePasses() if opts.time_passes else None
    if timer:
        insts.append(timer)
    if opts.print_after_all:
        insts.append(PrintAfterAll())
    if opts.dump_ir:
        insts.append(DumpIR(Path(opts.dump_ir)))
    reference = copy.deepcopy(loaded) if eval_data is not None else None  # the float model, for --eval
    result = PassManager(pipeline, verify=opts.verify_each, instruments=insts).run(loaded, ctx)
    compiled = result.model
    with outputs.writing():  # a failure from here on (a failed --eval included) removes what this run wrote
        written = backend.write(compiled, out, target_opts)
        if reference is not None:
            from qcc.evaluation import eval_written

            # the written file in its runtime, and qcc's simulator of the same (legalized) model
            ctx.report["eval"], warnings = eval_written(reference, compiled, eval_data, eval_name, backend, out,
                                                        target_opts, constraints.integer_affine, progress)
            for line in warnings:
                ctx.note("warnings", line)
            if opts.plots:
                from qcc.debug_plots import write_plots

                ctx.report["plots"] = write_plots(reference, compiled, eval_data, eval_name, opts.plots)
        for entry in written.float_fallbacks:
            ctx.note("float_fallbacks", entry)
        if written.summary:
            ctx.report[backend.name] = dict(written.summary)
        if timer:
            timer.report()
        report = build_report(compiled, ctx, opts, out, backend)
        report["target_options"] = attrs.asdict(target_opts)
        if opts.report:
            from qcc.io import atomic_write_bytes

            atomic_write_bytes(opts.report, (json.dumps(report, indent=2, sort_keys=True, default=str) + "\n").encode())
    return compiled, report


LEGACY_TARGET_FLAGS = {"nnb_version": ("--nnb-version", "version"), "api": ("--api", "api"), "plan": ("--plan", "plan")}
"""Flags older than target options: each sets one option of target nnb."""


def resolve_target(out: str, opts: CompileOptions) -> tuple[Backend, Any]:
    """The backend (from `--target NAME{options}` or OUT's extension) and its typed options.

    Options come from the spec string, then `target_options=` (API), then the legacy .nnb flags;
    a flag or option the chosen target does not have is a usage error naming both.
    """
    from qcc.plugins import backend_for
    from qcc.pm.spec import parse_spec

    name, raw = None, {}
    if opts.target:
        items = parse_spec(opts.target)
        if len(items) != 1:
            raise UsageError(f"--target {opts.target!r}: name one target, e.g. nnb or nnb{{version=2}}")
        name, raw = items[0].name, dict(items[0].options)
    backend = as_backend(backend_for(out, name))
    if name is None and backend.name == "onnx" and opts.quantize != "none":
        backend = as_backend(backend_for(out, "onnx-qdq"))  # .onnx with a quantizing scheme: QDQ
    backend.constraints(backend.parse_options({})).check_scheme(opts.quantize)
    options = backend.parse_options(raw)
    values = dict(opts.target_options or {})
    for key, (flag, option) in LEGACY_TARGET_FLAGS.items():
        given = getattr(opts, key)
        if given is None:
            continue
        if backend.name != "nnb":
            raise UsageError(f"{flag} is an option of target nnb; the target here is {backend.name!r}")
        values[option] = given
    known = {f.name for f in attrs.fields(type(options))}
    if opts.settings and "settings" in known:
        values.setdefault("settings", opts.settings)  # a target that reads the settings file itself
    if values:
        options = backend.make_options(**{**attrs.asdict(options, recurse=False), **values})
    return backend, options


def build_report(model: Model, ctx: PassContext, opts: CompileOptions, out: str, backend: Any) -> dict[str, Any]:
    """The --report dictionary; sections are filled by the passes that ran (see docs/cli.md)."""
    from qcc.reporting import assemble_report

    return assemble_report(model, ctx, opts, out, backend)
