"""PyTorch frontend: torch.export programs (in memory or saved as .pt2) into qcc's IR.

The module is captured with `torch.export.export` in eval mode. If its graph already consists of
ops qcc maps and its in-place ops cannot be observed through aliases, it is imported as is;
otherwise it is first lowered with `run_decompositions` (functionalized core ATen, keeping a few
ops such as LSTM, linear and hardswish whole so they stay recognisable). Any op still unmapped is
reported in one error before a single IR node is built. torch is imported lazily: without it,
the rest of qcc works and only this frontend fails, saying how to install it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qcc.errors import InvalidInputError, QccError, UnsupportedError, UsageError
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
                batch_size: int | None = None) -> Model:
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
                         graph_name=name)


def load_pt2(path: str | os.PathLike[str], input_names: Sequence[str] | None = None,
             batch_size: int | None = None, **_: Any) -> Model:
    """Import a program saved with `torch.export.save`."""
    from qcc.frontends.pt2_safety import check_pt2, drop_guards, weights_only_loading

    torch = import_torch()
    source = Path(path)
    if not source.is_file():
        raise InvalidInputError(f"{source}: no such file")
    check_pt2(source)  # torch.export.load trusts its input: see pt2_safety
    try:
        with weights_only_loading(torch):
            program = torch.export.load(str(source))
    except QccError as exc:
        raise InvalidInputError(f"{source}: {exc}") from None
    except pickle.UnpicklingError:
        raise InvalidInputError(f"{source}: holds pickled objects other than tensors; refused (qcc loads "
                                ".pt2 files with weights only)") from None
    except Exception as exc:
        raise InvalidInputError(f"{source}: not a loadable torch.export program: "
                                f"{type(exc).__name__}: {str(exc)[:300]}") from None
    drop_guards(program)
    return load_exported(program, input_names=input_names, batch_size=batch_size, source=str(source),
                         graph_name=source.stem)


def load_exported(program: Any, input_names: Sequence[str] | None = None, batch_size: int | None = None,
                  source: str = "<ExportedProgram>", graph_name: str = "torch") -> Model:
    """Import a `torch.export.ExportedProgram` (decomposing it first when needed)."""
    from qcc.frontends.torch_fx import build_model

    torch = import_torch()
    program, decomposed = prepare(torch, program, source)
    model = build_model(torch, program, source, graph_name, input_names, batch_size)
    model.metadata.update({"torch_version": str(torch.__version__), "torch_decomposed": decomposed})
    return model


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
    load_options = ("batch_size", "input_names")

    def op_support(self) -> dict[str, dict[str, str]]:
        """The support-matrix column: every IR op an ATen op imports as."""
        from qcc.frontends.torch_fx import EMITS, _load_converters
        from qcc.tables import emitted_ops

        _load_converters()
        return {"torch import": {op: "yes" for op in emitted_ops(EMITS)}}

    def load(self, path: str | os.PathLike[str], **options: Any) -> Model:
        return load_pt2(path, input_names=options.get("input_names"), batch_size=options.get("batch_size"))

    def accepts(self, obj: Any) -> bool:
        torch = sys.modules.get("torch")  # an nn.Module cannot exist unless torch is imported
        if torch is None:
            return False
        return isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram))

    def load_object(self, obj: Any, example_inputs: Any = None, input_names: Sequence[str] | None = None,
                    batch_size: int | None = None, **_: Any) -> Model:
        torch = import_torch()
        if isinstance(obj, torch.export.ExportedProgram):
            return load_exported(obj, input_names=input_names, batch_size=batch_size)
        return load_module(obj, example_inputs, input_names=input_names, batch_size=batch_size)


FRONTEND = TorchFrontend()
