"""The `qcc` driver. Importing this module (and `qcc --help`) loads no ML framework."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from qcc import __version__
from qcc.errors import InternalError, OutputError, QccError, one_line

RUNTIMES = ("runtimes: .onnx in onnxruntime, .nnb in nnablart ($QCC_NNABLART or PATH; else qcc's emulation of "
            "the decoded file), a target-c directory built with its Makefile, .nnp in nnabla, .pt2 in qcc's simulator.")
LAYERS = ("Per-layer table: every tensor both runtimes can show (onnxruntime: every node output, graph "
          "optimizations off, as onnxruntime.quantization.qdq_loss_debug does), matched by name; SQNR dB = "
          "10 log10(sum ref^2 / sum (model - ref)^2) over all samples ('exact': no difference).")
EXIT_CODES = ("exit codes: 0 ok, 2 usage, 3 invalid input, 4 unsupported, 70 internal error, 74 cannot write an "
              "output, 130 interrupted")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a command-line error is one line (`qcc: usage: ...`), not the usage text."""

    def error(self, message: str) -> Any:
        from qcc.errors import UsageError

        raise UsageError(f"{message} (see '{self.prog} --help')")


def _parser() -> argparse.ArgumentParser:
    from qcc.driver import METHODS, ROUNDINGS, SCHEMES

    parser = OneLineParser(
        prog="qcc",
        description="qcc: a quantization compiler for neural networks (ONNX/.nnp/.pt2 in; "
        "ONNX, ONNX QDQ, .nnb, .nnp, C out).",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"qcc {__version__}")
    _add_common(parser, False)
    common = OneLineParser(add_help=False)
    _add_common(common, argparse.SUPPRESS)  # also after the subcommand, without overriding
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("compile", help="compile a model for a target", parents=[common],
                       epilog="The summary's tensor table (activation, type, range, clip, SQNR dB, eval dB) is "
                       "explained in docs/debugging.md. " + EXIT_CODES)
    c.add_argument("model", help="input model (.onnx, .nnp, .pt2)")
    c.add_argument("-o", "--output", required=True, help="output file (.onnx/.nnb/.nnp) or directory (c)")
    c.add_argument("--target", metavar="TARGET[{OPTIONS}]",
                   help="onnx | onnx-qdq | nnb | nnp | c, with options as in 'nnb{version=2,plan=nnabla}' "
                        "(default: from the output's extension; `qcc targets` lists targets and options)")
    c.add_argument("--quantize", default="none", metavar="SCHEME",
                   help="quantization scheme: " + ", ".join(SCHEMES))
    c.add_argument("--calib", metavar="DATA.npz", help="calibration data (arrays keyed by input name)")
    c.add_argument("--method", default=None, metavar="METHOD",
                   help=f"activation range estimator: {', '.join(METHODS)} (default: auto, the least-error "
                        "range per tensor)")
    c.add_argument("--per-tensor", action="store_true", help="per-tensor (not per-channel) weight scales")
    c.add_argument("--no-equalize", dest="equalize", action="store_false",
                   help="no cross-layer equalization (on for per-tensor and fixed-point schemes)")
    c.add_argument("--no-bias-correct", dest="bias_correct", action="store_false",
                   help="no bias correction (on for every calibrated scheme)")
    c.add_argument("--rounding", default=None, choices=ROUNDINGS,
                   help="weight rounding: nearest, or learned (AdaRound; default for the 4-bit weights of "
                        "int4/uint4/fixed4)")
    c.add_argument("--max-accuracy-drop", type=float, default=None, metavar="X",
                   help="promote sensitive layers (16-bit, then float) until top-1 on --eval drops <= X (0.01)")
    c.add_argument("--workers", type=int, default=1, metavar="N",
                   help="calibrate on N local processes (statistics identical to one process)")
    c.add_argument("--cluster", metavar="ADDRESS", help="calibrate on a Dask cluster (tcp://host:port; "
                   "needs qcc[cluster])")
    c.add_argument("--settings", metavar="settings.yaml", help="nnabla settings.yaml types/positions to pin")
    c.add_argument("--override", action="append", default=[], metavar="PATTERN=TYPE",
                   help="pin tensors matching PATTERN to TYPE (e.g. 'conv1*=FIXED16'); repeatable")
    c.add_argument("--passes", metavar="SPEC", help="explicit pipeline (replaces the scheme's default)")
    c.add_argument("--eval", metavar="DATA.npz", help="evaluation data (optional 'labels') for the report")
    c.add_argument("--report", metavar="REPORT.json", help="write the compile report as JSON ('-': to stdout, "
                   "the summary then goes to stderr)")
    c.add_argument("--network", help=".nnp network name")
    c.add_argument("--executor", help=".nnp executor name")
    c.add_argument("--batch-size", type=int, help="bind the batch dimension")
    c.add_argument("--input-shape", action="append", default=[], metavar="[NAME=]D0,D1,...",
                   help="bind an input's dynamic dims, e.g. x=1,3,224,224 (NAME optional for one input); repeatable")
    c.add_argument("--batch-axis", action="append", default=[], metavar="NAME=AXIS",
                   help="the axis of input NAME that holds the samples in --calib/--eval data (default: the "
                        "model's batch axis, see docs/data.md), e.g. state=1; repeatable")
    c.add_argument("--nnb-version", type=int, default=None, choices=(2, 3),
                   help=".nnb format version (same as --target nnb{version=N})")
    c.add_argument("--api", type=int, default=None, help=".nnb api level (same as --target nnb{api=N})")
    c.add_argument("--plan", default=None, choices=("qcc", "nnabla"),
                   help=".nnb buffer plan (same as --target nnb{plan=P})")
    c.add_argument("--time-passes", action="store_true", help="print the time each pass took")
    c.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")
    c.add_argument("--dump-ir", metavar="DIR", help="write the IR before/after each pass into DIR")
    c.add_argument("--force", action="store_true",
                   help="let a directory output (target c) replace a directory or file qcc did not write")
    c.add_argument("--plots", metavar="DIR", help="with --eval: PNG plots into DIR (per-tensor histograms with the "
                   "chosen range, per-layer SQNR, memory timeline); needs matplotlib (pip install qcc[plots])")

    i = sub.add_parser("inspect", help="describe a model: layers, shapes, bytes (any readable model)",
                       parents=[common])
    i.add_argument("model")
    i.add_argument("--memory", action="store_true", help="memory plan table and bounds")
    i.add_argument("--quantize", default="none", metavar="SCHEME", help="size tensors for a scheme: " + ", ".join(SCHEMES))
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--network", help=".nnp network name")
    i.add_argument("--executor", help=".nnp executor name")
    i.add_argument("--batch-size", type=int, help="bind the batch dimension")
    i.add_argument("--input-shape", action="append", default=[], metavar="[NAME=]D0,D1,...",
                   help="bind an input's dynamic dims, e.g. x=1,3,224,224; repeatable")

    r = sub.add_parser("run", help="run any model qcc reads or writes on DATA.npz; outputs into OUT.npz",
                       parents=[common], epilog=RUNTIMES)
    r.add_argument("model", help="a model file (.onnx, .nnb, .nnp, .pt2) or a target-c directory")
    r.add_argument("data", metavar="DATA.npz", help="inputs (arrays keyed by input name, samples first)")
    r.add_argument("-o", "--output", required=True, metavar="OUT.npz", help="outputs, keyed by output name")
    r.add_argument("--network", help=".nnp network name")

    e = sub.add_parser("eval", help="accuracy of any model on DATA.npz; with --reference, agreement, output "
                       "and per-layer SQNR against the float model", parents=[common], epilog=RUNTIMES + " " + LAYERS)
    e.add_argument("model", help="a model file (.onnx, .nnb, .nnp, .pt2) or a target-c directory")
    e.add_argument("data", metavar="DATA.npz", help="inputs and optional 'labels'")
    e.add_argument("--reference", metavar="FLOAT_MODEL", help="the float model to compare against")
    e.add_argument("--report", metavar="REPORT.json", help="the results as JSON ('-': stdout)")
    e.add_argument("--plots", metavar="DIR", help="PNG per-layer SQNR bar chart (needs matplotlib: qcc[plots])")
    e.add_argument("--network", help=".nnp network name")

    st = sub.add_parser("settings", help="write nnabla's settings.yaml for an .nnp (nnb_template's equivalent; "
                        "with --calib, qcc's chosen fixed-point positions)", parents=[common])
    st.add_argument("model", help="an .nnp model")
    st.add_argument("-o", "--output", required=True, metavar="settings.yaml")
    st.add_argument("--calib", metavar="DATA.npz", help="calibration data: fill in qcc's chosen positions")
    st.add_argument("--quantize", default="fixed8", metavar="SCHEME", help="fixed8 | fixed16 | fixed8-16 (with --calib)")
    st.add_argument("--method", default=None, metavar="METHOD", help="range estimator (with --calib)")
    st.add_argument("--network", help=".nnp network name")
    st.add_argument("--executor", help=".nnp executor name")

    sub.add_parser("passes", help="list passes with their options and one-line docs", parents=[common])
    sub.add_parser("targets", help="list targets: extensions, options, the constraints they impose",
                   parents=[common])
    sub.add_parser("plugins", help="list plugin distributions and what they contribute", parents=[common])
    o = sub.add_parser("ops", help="which IR ops each frontend and backend supports (docs/ops.md)",
                       parents=[common])
    o.add_argument("--markdown", action="store_true", help="print docs/ops.md (traits, roles, legend)")
    return parser


def _add_common(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--no-plugins", action="store_true", default=default,
                        help="do not load qcc.plugins entry points (also QCC_DISABLE_PLUGIN_AUTOLOAD=1)")
    parser.add_argument("--debug", action="store_true", default=default, help="show a stack trace on errors")
    parser.add_argument("-q", "--quiet", action="store_true", default=default,
                        help="print nothing but errors (no summary, no warnings, no progress bars)")
    parser.add_argument("--progress", action="store_true", default=default,
                        help="progress bars on stderr even when it is not a terminal (default: on a terminal)")
    parser.add_argument("--limit", action="append", default=[] if default is False else default,
                        metavar="NAME=VALUE", help="resource limit, e.g. max_tensor_elements=1e9 (docs/errors.md)")


def progress_wanted(args: argparse.Namespace) -> bool:
    """Bars on a terminal, or anywhere with --progress; never with -q."""
    return not args.quiet and (args.progress or sys.stderr.isatty())


def _cmd_compile(args: argparse.Namespace) -> int:
    from qcc.driver import compile as run_compile
    from qcc.summary import print_compile_summary

    to_stdout = args.report == "-"  # the JSON on stdout; the human summary moves to stderr
    model, report = run_compile(
        args.model, args.output, target=args.target, passes=args.passes, quantize=args.quantize,
        calib=args.calib, method=args.method, per_tensor=args.per_tensor, equalize=args.equalize,
        bias_correct=args.bias_correct, rounding=args.rounding, max_accuracy_drop=args.max_accuracy_drop,
        settings=args.settings,
        overrides=tuple(args.override), eval=args.eval, report=None if to_stdout else args.report,
        network=args.network, executor=args.executor, batch_size=args.batch_size, input_shapes=_input_shapes(args),
        batch_axes=args.batch_axis or None, nnb_version=args.nnb_version, api=args.api, plan=args.plan, time_passes=args.time_passes,
        print_after_all=args.print_after_all, dump_ir=args.dump_ir, progress=progress_wanted(args), plots=args.plots, force=args.force,
        workers=args.workers, cluster=args.cluster,
    )
    if not args.quiet:
        with contextlib.redirect_stdout(sys.stderr if to_stdout else sys.stdout):
            print_compile_summary(model, report)
    if to_stdout:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from qcc.driver import SCHEMES
    from qcc.inspect import inspect_path
    from qcc.options import choice_error

    if args.quantize not in SCHEMES:
        raise choice_error("--quantize", args.quantize, SCHEMES)

    result = inspect_path(args.model, memory=args.memory, quantize=args.quantize, as_json=args.json,
                          network=args.network, executor=args.executor, batch_size=args.batch_size,
                          input_shapes=_input_shapes(args))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


def _input_shapes(args: argparse.Namespace) -> dict[str | None, tuple[int, ...]] | None:
    from qcc.frontends.input_shapes import parse_input_shapes

    return parse_input_shapes(args.input_shape) or None


def _cmd_run(args: argparse.Namespace) -> int:
    from qcc.running import run_file

    result = run_file(args.model, args.data, args.output, args.network, progress_wanted(args))
    if not args.quiet:
        shapes = ", ".join(f"{k} {v}" for k, v in result["outputs"].items())
        print(f"qcc: ran {args.model} in {result['runtime']}: {shapes} -> {args.output}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from qcc.running import eval_file, print_layer_table

    if args.report and args.report != "-":  # never over an input, checked before any work
        from qcc.outputs import check_outputs

        check_outputs(args.report, None, {"model": args.model, "data file": args.data, "reference": args.reference},
                      plots=args.plots)
    result = eval_file(args.model, args.data, args.reference, args.network, progress_wanted(args))
    if args.plots:
        from qcc.debug_plots import sqnr_bar_chart

        result["plots"] = [sqnr_bar_chart(result.get("layers", []), args.plots, f"{args.model} vs {args.reference}")]
    to_stdout = args.report == "-"
    if not args.quiet:
        with contextlib.redirect_stdout(sys.stderr if to_stdout else sys.stdout):
            _print_eval_file(result)
            print_layer_table(result.get("layers", []))
    text = json.dumps(result, indent=2, sort_keys=True, default=str) + "\n"
    if to_stdout:
        sys.stdout.write(text)
    elif args.report:
        from qcc.io import atomic_write_bytes

        atomic_write_bytes(args.report, text.encode())
    return 0


def _print_eval_file(result: dict[str, Any]) -> None:
    def acc(x: Any) -> str:
        return "-" if x is None else f"{x:.4f}"

    line = f"qcc: {result['model']} in {result['runtime']}: {result['samples']} samples, accuracy {acc(result['accuracy'])}"
    print(line)
    ref = result.get("reference")
    if ref:
        db = result.get("output_sqnr_db")
        print(f"  against {ref['model']} in {ref['runtime']}: accuracy {acc(result.get('reference_accuracy'))}, "
              f"top-1 agreement {acc(result.get('agreement'))}, output SQNR {'exact' if db is None else f'{db:.1f}'} dB")


def _cmd_settings(args: argparse.Namespace) -> int:
    from qcc.settings_template import write_settings

    count = write_settings(args.model, args.output, calib=args.calib, quantize=args.quantize, method=args.method,
                           network=args.network, executor=args.executor, progress=progress_wanted(args))
    if not args.quiet:
        print(f"qcc: wrote {args.output}: {count} variables")
    return 0


def _cmd_passes(args: argparse.Namespace) -> int:
    from qcc.plugins import registry

    reg = registry()
    for name in reg.names("pass"):
        cls = reg.pass_class(name)
        print(f"{name}  [{reg.entry('pass', name).distribution}]")
        print(f"    {cls.doc() or '(no description)'}")
        for opt in cls.options():
            print(f"    {opt.name}: {opt.type_text} = {opt.default!r}" + (f"  ({opt.help})" if opt.help else ""))
        if cls.requires:
            print(f"    requires: {', '.join(cls.requires)}")
    return 0


def _cmd_targets(args: argparse.Namespace) -> int:
    from qcc.plugins import registry
    from qcc.target import as_backend

    reg = registry()
    for name in reg.names("backend"):
        backend = as_backend(reg.backend(name))
        kind = "directory" if backend.writes_directory else ", ".join(backend.extensions) or "(by --target only)"
        print(f"{name}  [{reg.entry('backend', name).distribution}]  writes {kind}")
        print(f"    {backend.doc() or '(no description)'}")
        for opt in backend.option_infos():
            print(f"    {opt.name}: {opt.type_text} = {opt.default!r}" + (f"  ({opt.help})" if opt.help else ""))
        defaults = backend.make_options()
        for line in describe_constraints(backend.constraints(defaults)):
            print(f"    {line}")
        legal = [p.name for p in backend.legalization(defaults)]
        if legal:
            print(f"    legalization: {', '.join(legal)}")
    return 0


def describe_constraints(constraints: Any) -> list[str]:
    """What a target imposes, in words (for `qcc targets`)."""
    lines = []
    fp = constraints.fixed_point
    if fp.frac_range is not None or fp.rounding != "half_even" or fp.one_type_ops or fp.product_limit:
        parts = [f"positions {fp.frac_range[0]}..{fp.frac_range[1]}" if fp.frac_range else "",
                 f"stores computed values by {fp.rounding}",
                 f"one type for x, W, b, y of {', '.join(sorted(fp.one_type_ops))}" if fp.one_type_ops else "",
                 f"{', '.join(sorted(fp.shared_input_ops))} inputs share a position" if fp.shared_input_ops else "",
                 "product outputs at most input + weight positions" if fp.product_limit else ""]
        lines.append("fixed point: " + "; ".join(p for p in parts if p))
    if constraints.integer_affine:
        lines.append("affine: integer kernels (int32 accumulation, integer requantization)")
    if constraints.schemes is not None:
        lines.append("schemes: " + ", ".join(sorted(constraints.schemes)))
    return lines


def _cmd_plugins(args: argparse.Namespace) -> int:
    from qcc.plugins import registry

    for dist in registry().distributions:
        print(f"{dist.name} {dist.version}".rstrip())
        for name in dist.contributions:
            print(f"    {name}")
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    from qcc.op_matrix import build_matrix, render_markdown, render_text

    matrix = build_matrix()
    sys.stdout.write(render_markdown(matrix) if args.markdown else render_text(matrix))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # this process runs qcc's command line (not a caller's process)
        _keep_freed_memory()
    previous = _watch_interrupts()
    try:
        return _main(argv)
    except (Exception, KeyboardInterrupt) as exc:  # ^C outside a command (parsing, imports): exit 130 too
        if _interrupted(exc):
            return _report_interrupt()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


_MMAP_THRESHOLD = 32 << 20
"""glibc's largest M_MMAP_THRESHOLD: blocks below it come from the heap and go back to it."""
_TRIM_THRESHOLD = 1 << 30


def _keep_freed_memory() -> None:
    """glibc malloc tuned for a short process that frees and reallocates the same large arrays.

    By default glibc maps blocks of 128 KB and more on their own and unmaps them when freed, and
    gives a heap's freed top back to the kernel (the thresholds adapt only after such frees): the
    next activation of a calibration, an im2col buffer, a weight's integers then fault in and zero
    fresh pages again (a tenth of a ResNet-50 calibration's CPU samples were the kernel's
    clear_page). Here blocks up to 32 MB come from the heap and freed memory stays in the process
    for the next array of that size; the peak RSS is the same (what is kept is what was used), and
    nothing computed changes. Only for the `qcc` process itself (`main()` without arguments), on
    glibc; a no-op anywhere mallopt is missing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(-3, _MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (fixed: no longer adapts)
    mallopt(-1, _TRIM_THRESHOLD)  # M_TRIM_THRESHOLD


_SIGINT_SEEN = False


def _on_sigint(signum: int, frame: Any) -> None:
    global _SIGINT_SEEN
    _SIGINT_SEEN = True
    raise KeyboardInterrupt


def _watch_interrupts() -> Any:
    """Python's own ^C behaviour, remembered: C code that a SIGINT cuts short may turn the
    KeyboardInterrupt into its own error (numpy: "invalid shape in fixed-type tuple")."""
    global _SIGINT_SEEN
    _SIGINT_SEEN = False
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None
    return signal.signal(signal.SIGINT, _on_sigint)


def _interrupted(exc: BaseException) -> bool:
    """Whether ^C caused this error: a SIGINT inside an import surfaces as the importer's ImportError
    (numpy's "you should not try to import numpy from its source directory"), the interrupt in its
    chain, or as an error of the C code it cut short."""
    if _SIGINT_SEEN:
        return True
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def _report_interrupt() -> int:
    print("qcc: interrupted", file=sys.stderr)
    return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except QccError as exc:  # OneLineParser: a command-line mistake is one line
        return _report(exc)
    if args.command is None:
        parser.print_help()
        return 2
    import logging

    if args.debug:
        logging.getLogger("qcc").setLevel(logging.DEBUG)  # readers then leave frameworks' own logs alone
    else:
        import warnings

        warnings.simplefilter("ignore")
        # frameworks configure the root logger on import (nnabla logs INFO lines); keep stderr to
        # qcc's own one-line messages unless --debug
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.limit:
        from qcc.limits import configure

        try:
            configure(args.limit)
        except QccError as exc:
            return _report(exc)
    if args.no_plugins:
        from qcc.plugins import set_autoload

        set_autoload(False)
    handlers: dict[str, Any] = {"compile": _cmd_compile, "inspect": _cmd_inspect, "passes": _cmd_passes,
                                "run": _cmd_run, "eval": _cmd_eval, "settings": _cmd_settings,
                                "targets": _cmd_targets, "plugins": _cmd_plugins, "ops": _cmd_ops}
    try:
        return int(handlers[args.command](args))
    except QccError as exc:
        if _interrupted(exc):  # e.g. "install onnx" from an import that ^C cut short
            return _report_interrupt()
        if args.debug:
            traceback.print_exc()
        return _report(exc)
    except KeyboardInterrupt:
        return _report_interrupt()
    except BrokenPipeError:  # `qcc passes | head`: the reader left; not an error worth a message
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        if args.debug:
            traceback.print_exc()
        if exc.errno not in _REFUSED_WRITES:
            return _report(InternalError(f"{type(exc).__name__}: {exc} (run with --debug for a stack trace)"))
        # the file system refused a write that no writer turned into an OutputError itself
        return _report(OutputError(f"{exc.filename or 'output'}: {exc.strerror or exc}"))
    except Exception as exc:
        if _interrupted(exc):
            return _report_interrupt()
        if args.debug:
            traceback.print_exc()
        return _report(InternalError(f"{type(exc).__name__}: {exc} (run with --debug for a stack trace)"))


_REFUSED_WRITES = {getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM", "EISDIR",
                                                    "ENOTDIR", "EEXIST") if hasattr(errno, name)}


def _report(exc: QccError) -> int:
    """The error as one `qcc: <kind>: <message>` line on stderr (after its details, one line each); its exit code."""
    for line in getattr(exc, "details", ()):  # an error with many entries: one line each, then the summary
        print(f"qcc: {exc.kind}: {one_line(str(line))}", file=sys.stderr)
    print(f"qcc: {exc.kind}: {one_line(str(exc))}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
