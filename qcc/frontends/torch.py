"""PyTorch frontend: torch.export programs (in memory or saved as .pt2) into qcc's IR.

The module is captured with `torch.export.export` in eval mode. If its graph already consists of
ops qcc maps and its in-place ops cannot be observed through aliases, it is imported as is;
otherwise it is first lowered with `run_decompositions` (functionalized core ATen, keeping a few
ops such as LSTM, linear and hardswish whole so they stay recognisable). Any op still unmapped is
reported in one error before a single IR node is built. torch is imported lazily: without it,
the rest of qcc works and only this frontend fails, saying how to install it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from qcc.errors import InvalidInputError, QccError, UnsupportedError, UsageError, one_line
from qcc.frontends.input_shapes import BoundShapes, ShapeSpec
from qcc.io import require_regular_file
from qcc.ir.core import Model

INSTALL_HINT = "pip install 'qcc[torch]'"

# Ops kept whole by run_decompositions: qcc maps them directly (and better than their pieces).
def import_torch() -> Any:
    """torch, or an UnsupportedError telling how to install it (hidden from mypy on purpose)."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise UnsupportedError(f"the PyTorch frontend needs torch, which is not installed ({exc}); "
                               f"install it with: {INSTALL_HINT}") from None


def load_module(module: Any, example_inputs: Any, input_names: Sequence[str] | None = None,
                batch_size: int | None = None, input_shapes: ShapeSpec | None = None) -> Model:
    """Import an in-memory torch.nn.Module traced on `example_inputs` (a tensor or a tuple)."""
    torch = import_torch()
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"load_module needs a torch.nn.Module, got {type(module).__name__}")
    name = type(module).__name__
    inputs = _example_tuple(torch, example_inputs, name)
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        program = torch.export.export(module, inputs)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UnsupportedError(f"<{name}>: torch.export could not capture the module: "
                               f"{type(exc).__name__}: {first[:300]}") from exc
    finally:
        for sub, training in modes:  # restore each submodule's own mode
            sub.training = training
    return load_exported(program, input_names=input_names, batch_size=batch_size, source=f"<{name}>",
                         graph_name=name, input_shapes=input_shapes)


def load_pt2(path: str | os.PathLike[str], input_names: Sequence[str] | None = None,
             batch_size: int | None = None, input_shapes: ShapeSpec | None = None, **_: Any) -> Model:
    """Import a program saved with `torch.export.save`."""
    from qcc.frontends.pt2_safety import check_pt2, drop_guards, weights_only_loading

    source = Path(path)
    require_regular_file(source, "model")
    torch = import_torch()
    check_pt2(source)  # torch.export.load trusts its input: see pt2_safety
    logged: list[BaseException] = []
    try:
        with weights_only_loading(torch), _torch_log_captured(logged):
            program = torch.export.load(str(source))
    except QccError as exc:
        raise InvalidInputError(f"{source}: {exc}") from None
    except pickle.UnpicklingError:
        raise InvalidInputError(f"{source}: holds pickled objects other than tensors; refused (qcc loads "
                                ".pt2 files with weights only)") from None
    except Exception as exc:
        cause = _root_cause(logged[-1]) if logged else exc  # torch logs the real error and raises a vague one
        raise InvalidInputError(f"{source}: not a loadable torch.export program: "
                                f"{type(cause).__name__}: {one_line(str(cause))[:300]}") from None
    drop_guards(program)
    return load_exported(program, input_names=input_names, batch_size=batch_size, source=str(source),
                         graph_name=source.stem, input_shapes=input_shapes)


class _Capture(logging.Handler):
    def __init__(self, sink: list[BaseException]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.sink.append(record.exc_info[1])


@contextlib.contextmanager
def _torch_log_captured(sink: list[BaseException]) -> Iterator[None]:
    """Keep torch's own log lines (a multi-line traceback on a bad file) off stderr; collect their errors.

    torch gives several of its loggers a stderr handler of their own (propagate off), so each
    torch logger's handlers are swapped for the collector while the file loads. qcc reports the
    failure itself, in one line; with --debug nothing is hidden.
    """
    if logging.getLogger("qcc").isEnabledFor(logging.DEBUG) or logging.getLogger().isEnabledFor(logging.DEBUG):
        yield
        return
    capture = _Capture(sink)
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == "torch" or name.startswith("torch.")]
    saved = [(logger, logger.handlers, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [capture], False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def load_exported(program: Any, input_names: Sequence[str] | None = None, batch_size: int | None = None,
                  source: str = "<ExportedProgram>", graph_name: str = "torch",
                  input_shapes: ShapeSpec | None = None) -> Model:
    """Import a `torch.export.ExportedProgram` (decomposing it first when needed).

    Input shapes are bound first (qcc.frontends.input_shapes); a program with symbolic sizes whose
    inputs all become static is exported again at those shapes, so its size computations fold."""
    from qcc.frontends.torch_fx import bind_program_inputs, build_model

    torch = import_torch()
    bound = bind_program_inputs(torch, program, input_names, input_shapes, batch_size, source)
    static = specialize(torch, program, bound, source)
    if static is not program:  # the same inputs, by the names they had, now static
        input_names = list(bound.shapes)
        program, bound = static, bind_program_inputs(torch, static, input_names, None, None, source)
    program, decomposed = prepare(torch, program, source)
    model = build_model(torch, program, source, graph_name, input_names, bound)
    model.metadata.update({"torch_version": str(torch.__version__), "torch_decomposed": decomposed})
    return model


def specialize(torch: Any, program: Any, bound: BoundShapes, source: str) -> Any:
    """`program` exported again with static inputs when binding made every input dim static."""
    if not bound.symbols or any(isinstance(d, str) for dims in bound.shapes.values() for d in dims):
        return program
    module = program.module()
    inputs = tuple(torch.zeros(dims, dtype=torch.float32) for dims in bound.shapes.values())
    try:
        return torch.export.export(module, inputs)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UnsupportedError(f"{source}: torch.export could not specialize the program to input shapes "
                               f"{dict(bound.shapes)}: {type(exc).__name__}: {first[:300]}") from None


def prepare(torch: Any, program: Any, source: str) -> tuple[Any, bool]:
    """Decompose when the graph has unmapped ops or unsafe in-place ops; fail listing what is left.

    Returns the program to import and whether it was decomposed.
    """
    from qcc.frontends.torch_fx import describe_unsupported, scan_program

    scan = scan_program(program)
    if not scan.unsupported and not scan.unsafe_mutations:
        return program, False
    try:
        program = program.run_decompositions(decomposition_table(torch))
    except Exception as exc:
        raise UnsupportedError(f"{source}: torch.export run_decompositions failed: "
                               f"{type(exc).__name__}: {str(exc)[:300]}") from None
    scan = scan_program(program)
    if scan.unsupported:
        raise UnsupportedError(describe_unsupported(scan, source))
    return program, True


def decomposition_table(torch: Any) -> Any:
    from qcc.frontends.torch_fx import KEEP_WHOLE, _load_converters

    _load_converters()
    table = torch.export.default_decompositions()
    for spec in sorted(KEEP_WHOLE):  # the converters' keep_whole entries
        _, name, overload = spec.split(".")
        table.pop(getattr(getattr(torch.ops.aten, name), overload), None)
    return table


def _example_tuple(torch: Any, example_inputs: Any, name: str) -> tuple[Any, ...]:
    if example_inputs is None:
        raise UsageError(f"<{name}>: importing an nn.Module needs example_inputs (a tensor or a tuple of tensors)")
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    # numpy arrays become tensors; other non-tensors are passed as is (torch.export specializes them)
    return tuple(torch.from_numpy(item) if type(item).__module__ == "numpy" else item for item in items)


class TorchFrontend:
    """`qcc compile model.pt2` and `qcc.load(module, example_inputs=...)`."""

    name = "torch"
    extensions = (".pt2",)
    load_options = ("batch_size", "input_names", "input_shapes")

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: every IR op an ATen op imports as."""
        from qcc.frontends.torch_fx import EMITS, _load_converters
        from qcc.tables import emitted_ops

        _load_converters()
        return {"torch import": {op: "yes" for op in emitted_ops(EMITS)}}

    def load(self, path: str | os.PathLike[str], **options: Any) -> Model:
        return load_pt2(path, input_names=options.get("input_names"), batch_size=options.get("batch_size"),
                        input_shapes=options.get("input_shapes"))

    def accepts(self, obj: Any) -> bool:
        torch = sys.modules.get("torch")  # an nn.Module cannot exist unless torch is imported
        if torch is None:
            return False
        return isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram))

    def load_object(self, obj: Any, example_inputs: Any = None, input_names: Sequence[str] | None = None,
                    batch_size: int | None = None, input_shapes: ShapeSpec | None = None, **_: Any) -> Model:
        torch = import_torch()
        if isinstance(obj, torch.export.ExportedProgram):
            return load_exported(obj, input_names=input_names, batch_size=batch_size, input_shapes=input_shapes)
        return load_module(obj, example_inputs, input_names=input_names, batch_size=batch_size,
                           input_shapes=input_shapes)


FRONTEND = TorchFrontend()
